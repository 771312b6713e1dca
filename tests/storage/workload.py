"""A deterministic pipeline workload, shared by the crash tests and their subprocess.

Run as a script it drives the pipeline at ``root`` through ``steps`` steps, checkpointing
every ``interval`` steps; ``DBSP_FAULT`` makes it kill itself at a named fault point.
"""

from __future__ import annotations

import os
import random
import sys
from collections import Counter

from circuits.library import NexmarkGenerator, nexmark_circuit, nexmark_inputs
from circuits.spark import remote_session, session
from storage.logs import Range
from storage.pipeline import Pipeline

EVENTS_PER_STEP = 50
S3_ENDPOINT_ENV = "DBSP_TEST_S3_ENDPOINT"
TEST_SPARK_CONF = {"spark.sql.codegen.wholeStage": "false", "spark.sql.codegen.factoryMode": "NO_CODEGEN"}


def circuit():
    return nexmark_circuit("crash", queries=("bids_by_category",))


def step_events(seed: int, step: int) -> list[tuple[tuple[str, tuple], int]]:
    """Step ``step``'s events with weights: new events, and deletes of a few bids of the
    step before (which no other step deletes)."""
    generator = NexmarkGenerator(seed=seed)
    new = [(e, 1) for e in generator.events(step * EVENTS_PER_STEP, EVENTS_PER_STEP)]
    if step == 0:
        return new
    previous = [e for e in generator.events((step - 1) * EVENTS_PER_STEP, EVENTS_PER_STEP) if e[0] == "bids"]
    return new + [(e, -1) for e in random.Random(seed * 7919 + step).sample(previous, 3)]


def inputs(spark, seed: int, step: int):
    events = step_events(seed, step)
    parts = [nexmark_inputs(spark, [e for e, w in events if w == sign], weight=sign) for sign in (1, -1)]
    return {name: parts[0][name].unionByName(parts[1][name]) for name in parts[0]}


def drive(spark, root: str, seed: int, steps: int, interval: int, workers: int = 2) -> Pipeline:
    """Submits every step and runs the pipeline, a checkpoint every ``interval`` steps.
    Idempotent: running it again after a crash recovers and completes the same work."""
    pipeline = Pipeline(spark, root, circuit(), workers=workers, views=circuit().outputs)
    for step in range(steps):
        pipeline.submit(
            step, inputs(spark, seed, step), [Range("nexmark", 0, step * EVENTS_PER_STEP, (step + 1) * EVENTS_PER_STEP)]
        )
        if (step + 1) % interval == 0 or step == steps - 1:
            pipeline.run(through=step)
    return pipeline


def output_log(pipeline: Pipeline, steps: int) -> dict[str, Counter]:
    """Every output's rows keyed by step: ``Counter((step, row..., weight))``."""
    logs = {}
    for handle in pipeline.circuit.outputs:
        rows = pipeline.read_outputs(handle, 0, steps).collect()
        logs[handle] = Counter(
            tuple(round(v, 9) if isinstance(v, float) else v for k, v in r.asDict().items() if k != "_input")
            for r in rows
        )
    return logs


def views_match_logs(pipeline: Pipeline, steps: int) -> dict[str, tuple[Counter, Counter]]:
    """Per output, (its current view's rows, the integral of its change log), to compare."""
    from storage.tables import dataset, open_table
    from storage.views import view_uri

    found = {}
    for handle in pipeline.circuit.outputs:
        integral = Counter()
        for r in pipeline.outputs.read(handle, 0, steps).collect():
            integral[tuple(v for k, v in r.asDict().items() if k not in ("_weight", "_step"))] += r["_weight"]
        view = Counter(
            tuple(r.values()) for r in dataset(open_table(view_uri(pipeline.root, handle))).to_table().to_pylist()
        )
        found[handle] = (view, +integral)
    return found


if __name__ == "__main__":
    root, seed, steps, interval = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    # An optional fifth argument is a Spark master URL (the standalone cluster test) or a
    # Spark Connect server's.
    master = sys.argv[5] if len(sys.argv) > 5 else "local[1]"
    if root.startswith("s3://"):  # the test's S3-compatible server (tests/s3.py), named by the test
        from tests.s3 import S3Server

        S3Server(os.environ[S3_ENDPOINT_ENV]).reach(root)
    spark = remote_session(master) if master.startswith("sc://") else session(master, "crash-worker", TEST_SPARK_CONF)
    drive(spark, root, seed, steps, interval)


def batch_sql_differences(spark, pipeline: Pipeline, steps: int) -> list[str]:
    """The outputs whose integral differs from Spark batch SQL of the demo's view text over
    the integrated input logs of steps ``0..steps - 1``."""
    from circuits.library.nexmark_queries import RECOMPUTE_SQL
    from dagster_project.demo import integral
    from storage.logs import read_steps

    def rounded(rows) -> Counter:
        return Counter(tuple(round(v, 6) if isinstance(v, float) else v for v in r) for r in rows)

    for handle in pipeline.circuit.inputs:
        integral(read_steps(spark, pipeline.inputs.uri(handle), 0, steps - 1)).createOrReplaceTempView(handle)
    return [
        handle
        for handle in pipeline.circuit.outputs
        if rounded(integral(pipeline.outputs.read(handle, 0, steps - 1)).collect())
        != rounded(spark.sql(RECOMPUTE_SQL[handle]).collect())
    ]


def delta_spark_differences(spark, root: str, one_of_each_kind: bool = False) -> list[str]:
    """Every Delta table under ``root`` (or, ``one_of_each_kind``, the first of each folder:
    a state table, an output, a view, the checkpoints, ...) read by delta-spark
    (``format("delta")``), at its latest version and, by time travel (``versionAsOf``), at
    the one before, against the same versions read by delta-rs: the tables and versions
    whose rows differ."""
    from storage.delta import delta_tables
    from storage.location import spark_path
    from storage.tables import dataset, open_table

    def normal(rows) -> Counter:
        return Counter(tuple(sorted((k, str(v)) for k, v in r.items())) for r in rows)

    differences, tables = [], delta_tables(root)
    if one_of_each_kind:
        kinds = {path.removeprefix(root).strip("/").split("/")[0]: path for path in reversed(tables)}
        tables = sorted(kinds.values())
    for path in tables:
        latest = open_table(path).version()
        for version in sorted({latest, max(latest - 1, 0)}):
            expected = normal(dataset(open_table(path, version)).to_table().to_pylist())
            read = spark.read.format("delta").option("versionAsOf", version).load(spark_path(path))
            if normal(r.asDict() for r in read.collect()) != expected:
                differences.append(f"{path}@{version}")
    return differences
