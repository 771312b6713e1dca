"""What keeping a sink's current view (storage/views.py) costs per step, measured against
the same steps without it, in the same run.

Two pipelines over the same input on one Spark Connect server: a view of ``--rows`` rows
(a projection of the input, so the view is the input), then ``--steps`` steps that each
delete ``--changes / 2`` random rows and insert as many new ones (0.1% of 1M by default).
Steps alternate between the pipelines.  Prints, per pipeline, the median wall seconds of
a step (submit + run: input write, job, commits) and of its view phase, and the files the
view's commits added and removed.

    python bench/view_tables.py --rows 1000000 --changes 1000 --steps 5
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common import on_spark
from deltalake import DeltaTable
from pyspark.sql import functions as F

from circuits import Circuit, from_rows
from storage import views
from storage.logs import Range
from storage.pipeline import Pipeline

SCHEMA = "k bigint, v bigint"


def circuit() -> Circuit:
    c = Circuit("view_bench")
    c.input("x", SCHEMA).select("k", "v").output("rows")
    return c


def step_changes(spark, rng: random.Random, live: set[int], next_key: int, changes: int):
    deleted = rng.sample(sorted(live), changes // 2) if changes > 1 else []
    inserted = list(range(next_key, next_key + changes - len(deleted)))
    live.difference_update(deleted)
    live.update(inserted)
    rows = [(k, k * 7 % 1000, -1) for k in deleted] + [(k, k * 7 % 1000, 1) for k in inserted]
    return from_rows(spark, rows, SCHEMA), next_key + len(inserted)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--changes", type=int, default=1_000)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--url", help="a running Spark Connect server (default: start one for the run)")
    on_spark(run, parser.parse_args(), "view-bench-")


def run(spark, work: str, args) -> None:
    pipelines = {
        "with view": Pipeline(spark, os.path.join(work, "with"), circuit(), workers=2, views=["rows"]),
        "without": Pipeline(spark, os.path.join(work, "without"), circuit(), workers=2),
    }
    initial = spark.range(args.rows).select(
        F.col("id").alias("k"), (F.col("id") * 7 % 1000).alias("v"), F.lit(1).cast("bigint").alias("_weight")
    )
    figures = {name: {"step": [], "view": [], "files": []} for name in pipelines}
    for name, pipeline in pipelines.items():
        started = time.perf_counter()
        pipeline.submit(0, {"x": initial}, [Range("x", 0, 0, args.rows)])
        pipeline.run()
        print(f"{name}: first step ({args.rows:,} rows) {time.perf_counter() - started:.1f} s", flush=True)
    rng, live, next_key = random.Random(0), set(range(args.rows)), args.rows
    for step in range(1, args.steps + 1):
        delta, next_key = step_changes(spark, rng, live, next_key, args.changes)
        for name, pipeline in pipelines.items():
            pipeline.timings.clear()
            started = time.perf_counter()
            pipeline.submit(step, {"x": delta}, [Range("x", 0, step, step + 1)])
            pipeline.run()
            figures[name]["step"].append(time.perf_counter() - started)
            figures[name]["view"].append(pipeline.timings["view_commit"])
            figures[name]["files"].append(pipeline.views.last_rewrite.get("rows", (0, 0)))
    snapshot = views.read_view(pipelines["with view"].root, "rows", limit=0)
    assert snapshot.rows == len(live), (snapshot.rows, len(live))
    files = len(views.view_files(DeltaTable(views.view_uri(pipelines["with view"].root, "rows"))))
    print(f"\nview: {snapshot.rows:,} rows in {files} files; {args.changes} changed rows per step, {args.steps} steps")
    print("| pipeline | median step s | median view phase s | files added/removed per step |")
    print("| --- | --- | --- | --- |")
    for name, f in figures.items():
        print(
            f"| {name} | {statistics.median(f['step']):.2f} | {statistics.median(f['view']):.2f} | {f['files'] if name == 'with view' else '-'} |"
        )


if __name__ == "__main__":
    main()
