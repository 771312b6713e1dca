"""Steps of one pipeline of many SQL views: what a step costs as views are added, and what
Spark runs for it (jobs and tasks, read from the server's own REST API), against Spark
batch SQL of the same views over the integrated inputs, measured in the same run.

    python bench/many_views.py --views 30 --rows 1000 --steps 3 --workers 2

Each view is one of four shapes (a grouping, a join, a filter and projection, a grouping
with a filter) with its own constant; every step inserts ``--rows`` rows into each of the
two inputs.  At the end each view's output log, integrated, is compared with the batch.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import urllib.request
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from bench.common import integrated_output, peer_session, rounded
from circuits.daemon import free_port
from circuits.spark import connect_server, remote_session, stop_connect_server
from circuits.sql import compile_sql, parse_views
from storage.logs import Range
from storage.pipeline import Pipeline

SCHEMAS = {"t": "k int, v int", "u": "k int, x int"}
SHAPES = (
    "SELECT k % {m} AS g, count(*) AS n, sum(v) AS s FROM t GROUP BY k % {m}",
    "SELECT t.k, t.v, u.x FROM t JOIN u ON t.k = u.k WHERE t.v % {m} = 0",
    "SELECT k, v + {m} AS w FROM t WHERE v % 100 > {m}",
    "SELECT k, max(x) AS top, count(*) AS n FROM u WHERE x % {m} <> 0 GROUP BY k",
)


def views(count: int) -> str:
    """``count`` views, the shapes in turn, each with a constant of its own."""
    return "\n".join(
        f"CREATE MATERIALIZED VIEW v{i} AS {SHAPES[i % len(SHAPES)].format(m=i // len(SHAPES) + 2)};"
        for i in range(count)
    )


def rows_of(spark: SparkSession, name: str, first: int, count: int) -> DataFrame:
    """Rows ``first ..`` of input ``name``: keys over 97 values, each row inserted once."""
    value = "v" if name == "t" else "x"
    return spark.range(first, first + count).select(
        (F.col("id") % 97).cast("int").alias("k"),
        (F.col("id") * 7 % 1000).cast("int").alias(value),
        F.lit(1).cast("bigint").alias("_weight"),
    )


class Jobs:
    """The Spark application's jobs, from its REST API (the UI's port)."""

    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}/api/v1"
        self.app = self._get("/applications")[0]["id"]
        self.seen: set[int] = set()

    def _get(self, path: str):
        with urllib.request.urlopen(self.base + path, timeout=30) as response:
            return json.load(response)

    def since_last(self) -> tuple[int, int, int]:
        """Jobs, their tasks, and the tasks of the largest job, since the last call."""
        jobs = [j for j in self._get(f"/applications/{self.app}/jobs") if j["jobId"] not in self.seen]
        self.seen |= {j["jobId"] for j in jobs}
        tasks = [j["numTasks"] for j in jobs]
        return len(jobs), sum(tasks), max(tasks, default=0)


def run(args: argparse.Namespace) -> None:
    work = tempfile.mkdtemp(prefix="many-views-")
    port, ui = free_port(), free_port()
    conf = {"spark.ui.enabled": "true", "spark.ui.port": str(ui)}
    url = connect_server(os.path.join(work, "spark"), port, driver_memory="4g", conf=conf)
    try:
        spark = remote_session(url)
        text = views(args.views)
        circuit = compile_sql(text, SCHEMAS, spark)
        pipeline = Pipeline(spark, os.path.join(work, "pipeline"), circuit, workers=args.workers)
        jobs = Jobs(ui)
        jobs.since_last()
        print(f"{args.views} views over 2 inputs, {args.workers} workers, {args.rows} rows a step into each input")
        seconds = []
        for step in range(args.steps):
            first = step * args.rows
            inputs = {name: rows_of(spark, name, first, args.rows) for name in SCHEMAS}
            started = time.perf_counter()
            pipeline.submit(step, inputs, [Range("bench", 0, step, step + 1)])
            pipeline.run()
            took = time.perf_counter() - started
            count, tasks, largest = jobs.since_last()
            seconds.append(took)
            print(f"  step {step}: {took:6.2f} s  Spark jobs {count:3d}, tasks {tasks:4d} (largest job {largest})")
        peer = peer_session(spark, url)
        total = args.steps * args.rows
        for name in SCHEMAS:
            rows_of(peer, name, 0, total).drop("_weight").createOrReplaceTempView(name)
        parsed = parse_views(text)
        batch: dict[str, Counter] = {}
        started = time.perf_counter()
        for view in parsed:
            batch[view.name] = Counter(tuple(r) for r in peer.sql(view.text).collect())
        recompute = time.perf_counter() - started
        equal = all(
            rounded(integrated_output(spark, pipeline.root, v.name, args.steps - 1)) == rounded(batch[v.name])
            for v in parsed
        )
        later = seconds[1:] or seconds
        step = sorted(later)[len(later) // 2]
        print(
            f"median step after the first {step:.2f} s ({step / args.views:.3f} s a view); Spark batch SQL of the"
            f" {args.views} views over the {total} rows of each input {recompute:.2f} s: step / batch"
            f" {step / recompute:.2f}x; every view's integrated log equals batch SQL: {equal}"
        )
    finally:
        stop_connect_server(os.path.join(work, "spark"), port)
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--views", type=int, default=30)
    parser.add_argument("--rows", type=int, default=1000, help="rows a step inserts into each input")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    run(parser.parse_args())


if __name__ == "__main__":
    main()
