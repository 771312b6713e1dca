"""Durable state, input and output on Delta Lake (imports circuits; never sensors or dagster)."""
