"""The Dagster layer: definitions, resources, step partitions, sensors wiring, jobs, CLI.

Top of the import graph (circuits <- storage <- sensors <- dagster_project); nothing
imports it.
"""
