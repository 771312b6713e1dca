"""Step cost of an incrementally maintained view against recomputing it with Spark batch SQL.

Views (``--query``): bids revenue by category (a join, then an aggregate) and Nexmark q4
(a join, then two chained aggregations), from circuits.library.  State: ``--bids`` bids
over ``--bids // 15`` auctions (the Nexmark 46:3 ratio), loaded in step 0.  Then
``--steps`` steps each insert ``fraction * bids`` new bids.  Ours: median wall time of a
step; with ``--store memory`` that is ``StepRunner.step`` (plan + the step's one fused
Spark job + state update) on the in-memory store; with ``--store delta`` it is a durable
step of ``storage.pipeline.Pipeline``: input persisted, state and output committed to
Delta, checkpoint committed.  Peer, same session and data: Spark batch SQL computing the
same view over the integrated inputs, median of as many runs.

    python bench/incremental_vs_recompute.py --bids 1000000 --fractions 0.001 0.01 0.1 --store delta
"""

from __future__ import annotations

import argparse
import statistics

from common import auctions, bids, stepper, timed
from pyspark.sql import SparkSession

from circuits.library.nexmark_queries import RECOMPUTE_SQL as RECOMPUTE
from circuits.spark import local_session


def measure(spark: SparkSession, args: argparse.Namespace, total_bids: int, fraction: float) -> dict:
    auction_count = max(total_bids // 15, 1)
    step = stepper(spark, args.query, args.store, args.workers, args.root)
    auction_rows = auctions(spark, auction_count)
    load = timed(lambda: step({"auctions": auction_rows, "bids": bids(spark, 0, total_bids, auction_count)}))
    delta = max(int(total_bids * fraction), 1)
    ours, recompute, next_id = [], [], total_bids
    for _ in range(args.steps):
        batch = bids(spark, next_id, delta, auction_count)
        ours.append(timed(lambda batch=batch: step({"bids": batch})))
        next_id += delta
        auction_rows.drop("_weight").createOrReplaceTempView("auctions")
        bids(spark, 0, next_id, auction_count).drop("_weight").createOrReplaceTempView("bids")
        recompute.append(timed(lambda: spark.sql(RECOMPUTE[args.query]).collect()))
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
    parser.add_argument("--query", choices=sorted(RECOMPUTE), default="bids_by_category")
    parser.add_argument("--store", choices=["memory", "delta"], default="memory")
    parser.add_argument("--root", default="/tmp/dbsp-bench", help="where --store delta keeps the pipeline")
    args = parser.parse_args()
    spark = local_session(cores=2, app_name="bench", extra={"spark.driver.memory": "8g"})
    print(f"{args.query}, {args.store} store, {args.workers} workers, median of {args.steps} steps")
    print(f"{'state bids':>11} {'delta':>8} {'load s':>7} {'step s':>7} {'recompute s':>11} {'step/recompute':>14}")
    for total in args.bids:
        for fraction in args.fractions:
            r = measure(spark, args, total, fraction)
            print(
                f"{r['state_bids']:>11,} {r['delta_bids']:>8,} {r['load_s']:>7.1f} {r['ours_s']:>7.2f} "
                f"{r['recompute_s']:>11.2f} {r['ours_s'] / r['recompute_s']:>14.2f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
