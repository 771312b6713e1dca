"""A step of a windowed SQL view over a large state that touches few of its partitions,
against Spark batch SQL recomputing the view over the integrated input, measured in the
same run, on the same server.

    python bench/window_step.py --rows 1000000 --partitions 1000 --touched 1 --steps 3

The input ``t(k, o, v)`` holds ``--rows`` rows over ``--partitions`` keys ``k``, loaded as
step 0 of a durable pipeline (its output log; no view table).  Each measured step inserts
``--changed`` rows into ``--touched`` partitions and deletes as many there, at random
orders ``o`` (so a running sum changes for the rows after them).  The peer reads the
integrated input from Parquet (the load's rows, then each step's inserts and deletes as
files of their own, in a session with Spark's default settings) and writes the view
whole to Parquet, as a batch refresh of a materialized view does.  Each view's output
log, integrated, is compared with the peer's result at the end.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from bench.common import integrated_output, peer_session, rounded, timed
from circuits.daemon import free_port
from circuits.spark import connect_server, remote_session, stop_connect_server
from circuits.sql import compile_sql
from storage.logs import Range
from storage.pipeline import Pipeline

SCHEMAS = {"t": "k int, o bigint, v int"}
VIEWS = {
    "running": "SELECT k, o, v, sum(v) OVER (PARTITION BY k ORDER BY o) AS run FROM t",
    "ranked": "SELECT k, o, rank() OVER (PARTITION BY k ORDER BY v DESC) AS r FROM t",
}


def loaded(spark: SparkSession, rows: int, partitions: int) -> DataFrame:
    """The load's rows: order ``o`` ten times the row's number (a step inserts between
    them), value ``v`` from it."""
    return spark.range(rows).select(
        (F.col("id") % partitions).cast("int").alias("k"),
        (F.col("id") * 10).alias("o"),
        (F.col("id") * 7919 % 1000).cast("int").alias("v"),
    )


def changes(args: argparse.Namespace, step: int, rng: random.Random) -> list[tuple[int, int, int, int]]:
    """A step's ``(k, o, v, weight)``: ``--changed`` new rows in ``--touched`` partitions,
    at random orders between the loaded ones, and as many loaded rows of them deleted."""
    touched = rng.sample(range(args.partitions), args.touched)
    per = args.rows // args.partitions
    rows = []
    for i in range(args.changed):
        k = touched[i % len(touched)]
        rows.append((k, (k + args.partitions * rng.randrange(per)) * 10 + step % 9 + 1, rng.randrange(1000), 1))
        old = k + args.partitions * rng.randrange(per)  # a loaded row of partition k
        rows.append((k, old * 10, old * 7919 % 1000, -1))
    # A loaded row is deleted at most once over the run: orders of deletes are kept apart.
    return list({(k, o): (k, o, v, w) for k, o, v, w in rows}.values())


def run(args: argparse.Namespace) -> None:
    work = tempfile.mkdtemp(prefix="window-step-")
    port = free_port()
    url = connect_server(os.path.join(work, "spark"), port, driver_memory="4g")
    try:
        spark = remote_session(url)
        text = "\n".join(f"CREATE MATERIALIZED VIEW {name} AS {sql};" for name, sql in VIEWS.items())
        pipeline = Pipeline(spark, os.path.join(work, "pipeline"), compile_sql(text, SCHEMAS, spark), workers=2)
        peer = peer_session(spark, url)
        data = os.path.join(work, "data")
        loaded(peer, args.rows, args.partitions).write.parquet(os.path.join(data, "load"))
        load = loaded(spark, args.rows, args.partitions).withColumn("_weight", F.lit(1).cast("bigint"))
        started = time.perf_counter()
        pipeline.submit(0, {"t": load}, [Range("bench", 0, 0, 1)])
        pipeline.run()
        print(f"loaded {args.rows:,} rows over {args.partitions:,} partitions in {time.perf_counter() - started:.1f} s")
        rng = random.Random(args.seed)
        deleted: set[tuple[int, int]] = set()
        rows = []
        for step in range(1, args.steps + 1):
            batch = [r for r in changes(args, step, rng) if r[3] > 0 or (r[0], r[1]) not in deleted]
            deleted |= {(k, o) for k, o, _, w in batch if w < 0}
            frame = spark.createDataFrame(batch, "k int, o bigint, v int, _weight bigint")
            pd = peer.createDataFrame(batch, "k int, o bigint, v int, _weight bigint")
            pd.write.parquet(os.path.join(data, f"step{step:04d}"))
            pipeline.submit(step, {"t": frame}, [Range("bench", 0, step, step + 1)])
            before = dict(pipeline.timings)
            engine = timed(pipeline.run)
            phases = {k: v - before.get(k, 0.0) for k, v in pipeline.timings.items() if v > before.get(k, 0.0)}
            batch_seconds = timed(lambda: refresh(peer, data, os.path.join(work, "refreshed")))
            rows.append((engine, batch_seconds))
            print(
                f"  step {step}: {len(batch)} changed rows in {args.touched} partitions: {engine:.2f} s; "
                f"Spark batch SQL of the views, written whole: {batch_seconds:.2f} s; {engine / batch_seconds:.3f}x"
            )
            print(f"    the step's phases: {', '.join(f'{k} {v:.2f} s' for k, v in phases.items())}")
        ratios = sorted(e / b for e, b in rows)
        print(
            f"step / batch refresh, median of {len(rows)}: {ratios[len(ratios) // 2]:.3f}x "
            f"(spread {ratios[0]:.3f}-{ratios[-1]:.3f}); views equal: {equal(spark, peer, pipeline, data, args.steps)}"
        )
    finally:
        stop_connect_server(os.path.join(work, "spark"), port)
        shutil.rmtree(work, ignore_errors=True)


def integrated_input(peer: SparkSession, data: str) -> DataFrame:
    """The load and every step's changes, summed: the rows of ``t`` now."""
    changed = peer.read.parquet(os.path.join(data, "step*"))
    load = peer.read.parquet(os.path.join(data, "load")).withColumn("_weight", F.lit(1).cast("bigint"))
    whole = load.unionByName(changed).groupBy("k", "o", "v").agg(F.sum("_weight").alias("n")).where("n > 0")
    return whole.select("k", "o", "v", F.explode(F.array_repeat(F.lit(1), F.col("n").cast("int"))).alias("_")).drop("_")


def refresh(peer: SparkSession, data: str, out: str) -> None:
    integrated_input(peer, data).createOrReplaceTempView("t")
    for name, sql in VIEWS.items():
        peer.sql(sql).write.mode("overwrite").parquet(os.path.join(out, name))


def equal(spark: SparkSession, peer: SparkSession, pipeline: Pipeline, data: str, last: int) -> bool:
    integrated_input(peer, data).createOrReplaceTempView("t")
    return all(
        rounded(integrated_output(spark, pipeline.root, name, last))
        == rounded(Counter(tuple(r) for r in peer.sql(sql).collect()))
        for name, sql in VIEWS.items()
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=1_000)
    parser.add_argument("--touched", type=int, default=1, help="partitions a step changes")
    parser.add_argument("--changed", type=int, default=10, help="rows a step inserts (and as many it deletes)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--seed", type=int, default=7)
    run(parser.parse_args())


if __name__ == "__main__":
    main()
