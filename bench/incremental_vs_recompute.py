"""Step cost of an incrementally maintained view against recomputing it with Spark batch SQL.

View: bids revenue by category (a join, then an aggregate) from circuits.library.
State: ``--bids`` bids over ``--bids // 15`` auctions (the Nexmark 46:3 ratio), loaded in
step 0.  Then ``--steps`` steps each insert ``fraction * bids`` new bids.  Ours: median
wall time of ``StepRunner.step`` (plan + the step's one fused Spark job + state update),
in-memory state store.  Peer, same session and data: Spark batch SQL computing the same
view over the integrated inputs, median of as many runs.

    python bench/incremental_vs_recompute.py --bids 1000000 --fractions 0.001 0.01 0.1
"""

from __future__ import annotations

import argparse
import statistics
import time

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from circuits import InMemoryStateStore, StepRunner
from circuits.library import nexmark_circuit
from circuits.spark import local_session

RECOMPUTE = (
    "SELECT a.category, sum(b.price) AS revenue, count(*) AS bids "
    "FROM bids b JOIN auctions a ON b.auction = a.id GROUP BY a.category"
)


def auctions(spark: SparkSession, count: int) -> DataFrame:
    return spark.range(count).select(
        F.col("id"),
        F.concat(F.lit("item-"), F.col("id").cast("string")).alias("item_name"),
        (F.col("id") % 1000).alias("initial_bid"),
        (F.col("id") % 3000).alias("reserve"),
        (F.col("id") * 1000).alias("date_time"),
        (F.col("id") * 1000 + 600_000).alias("expires"),
        (F.col("id") % 997).alias("seller"),
        (F.col("id") % 5 + 10).alias("category"),
        F.lit(1).cast("bigint").alias("_weight"),
    )


def bids(spark: SparkSession, first: int, count: int, auction_count: int) -> DataFrame:
    return spark.range(first, first + count).select(
        (F.col("id") * 7919 % auction_count).alias("auction"),
        (F.col("id") % 10007).alias("bidder"),
        (F.col("id") * 31 % 10000 + 1).alias("price"),
        F.lit("Google").alias("channel"),
        (F.col("id") * 100).alias("date_time"),
        F.lit(1).cast("bigint").alias("_weight"),
    )


def timed(action) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def measure(spark: SparkSession, total_bids: int, fraction: float, steps: int, workers: int) -> dict:
    auction_count = max(total_bids // 15, 1)
    runner = StepRunner(nexmark_circuit("bench", ("bids_by_category",)), spark, InMemoryStateStore(), workers=workers)
    auction_rows = auctions(spark, auction_count)
    load = timed(lambda: runner.step({"auctions": auction_rows, "bids": bids(spark, 0, total_bids, auction_count)}))
    delta = max(int(total_bids * fraction), 1)
    ours, recompute, next_id = [], [], total_bids
    for _ in range(steps):
        batch = bids(spark, next_id, delta, auction_count)
        ours.append(timed(lambda: runner.step({"bids": batch}).collect_outputs()))
        next_id += delta
        auction_rows.drop("_weight").createOrReplaceTempView("auctions")
        bids(spark, 0, next_id, auction_count).drop("_weight").createOrReplaceTempView("bids")
        recompute.append(timed(lambda: spark.sql(RECOMPUTE).collect()))
    return {
        "state_bids": total_bids,
        "delta_bids": delta,
        "load_s": load,
        "ours_s": statistics.median(ours),
        "recompute_s": statistics.median(recompute),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bids", type=int, nargs="+", default=[100_000])
    parser.add_argument("--fractions", type=float, nargs="+", default=[0.001, 0.01, 0.1])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    spark = local_session(cores=2, app_name="bench", extra={"spark.driver.memory": "8g"})
    print(f"{'state bids':>11} {'delta':>8} {'load s':>7} {'step s':>7} {'recompute s':>11} {'step/recompute':>14}")
    for total in args.bids:
        for fraction in args.fractions:
            r = measure(spark, total, fraction, args.steps, args.workers)
            print(
                f"{r['state_bids']:>11,} {r['delta_bids']:>8,} {r['load_s']:>7.1f} {r['ours_s']:>7.2f} "
                f"{r['recompute_s']:>11.2f} {r['ours_s'] / r['recompute_s']:>14.2f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
