"""Step cost of an incrementally maintained view against recomputing it with Spark batch SQL.

Views (``--query``): bids revenue by category (a join, then an aggregate) and Nexmark q4
(a join, then two chained aggregations), from circuits.library.  State: ``--bids`` bids
over ``--bids // 15`` auctions (the Nexmark 46:3 ratio), loaded in step 0.  Then
``--steps`` steps each insert ``fraction * bids`` new bids, for each fraction in turn
(state is loaded once per size).  Ours: median wall time of a
step; with ``--store memory`` that is ``StepRunner.step`` (plan + the step's one fused
Spark job + state update) on the in-memory store; with ``--store delta`` it is a durable
step of ``storage.pipeline.Pipeline``: input persisted, state and output committed to
Delta, checkpoint committed.  Peer, same server and data, in a session of its own with
Spark's default settings (``common.peer_session``): Spark batch SQL computing the
same view over the integrated inputs, median of as many runs.  Over several fractions it
also prints the marginal cost of a delta row (the step's extra seconds per extra delta row,
smallest to largest fraction) against the recompute's cost per row of state.

Both run on a Spark Connect server started for the run (as ``dbsp`` starts the embedded
one; ``--url`` names a running one), or with ``--classic`` in an in-process session.

    python bench/incremental_vs_recompute.py --bids 1000000 --fractions 0.001 0.01 0.1 --store delta
"""

from __future__ import annotations

import argparse
import statistics
from collections import Counter

from common import auctions, bids, integrated_output, on_spark, peer_session, rounded, stepper, timed
from pyspark.sql import SparkSession

from circuits.library.nexmark_queries import RECOMPUTE_SQL as RECOMPUTE
from circuits.spark import local_session


def measure(spark: SparkSession, args: argparse.Namespace, total_bids: int) -> list[dict]:
    """Loads ``total_bids`` of state once, then runs ``args.steps`` steps per fraction, the
    fractions in the order given (so a later series starts from the state the earlier ones grew)."""
    auction_count = max(total_bids // 15, 1)
    step = stepper(spark, args.query, args.store, args.workers, args.root)
    load = timed(lambda: step({"auctions": auctions(spark, auction_count), "bids": bids(spark, 0, total_bids, auction_count)}))
    peer = peer_session(spark)
    auctions(peer, auction_count).drop("_weight").createOrReplaceTempView("auctions")
    rows, next_id = [], total_bids
    for fraction in args.fractions:
        delta = max(int(total_bids * fraction), 1)
        ours, recompute, state = [], [], next_id
        for _ in range(args.steps):
            batch = bids(spark, next_id, delta, auction_count)
            ours.append(timed(lambda batch=batch: step({"bids": batch})))
            next_id += delta
            bids(peer, 0, next_id, auction_count).drop("_weight").createOrReplaceTempView("bids")
            recompute.append(timed(lambda: peer.sql(RECOMPUTE[args.query]).collect()))
        rows.append(
            {
                "state_bids": state,
                "delta_bids": delta,
                "load_s": load,
                "ours_s": statistics.median(ours),
                "recompute_s": statistics.median(recompute),
            }
        )
    if args.store == "delta":
        expected = Counter(tuple(r) for r in peer.sql(RECOMPUTE[args.query]).collect())
        last = len(args.fractions) * args.steps
        same = rounded(integrated_output(spark, args.root, args.query, last)) == rounded(expected)
        print(f"integrated output of steps 0..{last} equals the recompute: {same}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bids", type=int, nargs="+", default=[100_000])
    parser.add_argument("--fractions", type=float, nargs="+", default=[0.001, 0.01, 0.1])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--query", choices=["bids_by_category", "q4"], default="bids_by_category")
    parser.add_argument("--store", choices=["memory", "delta"], default="memory")
    parser.add_argument("--root", default="/tmp/dbsp-bench", help="where --store delta keeps the pipeline")
    parser.add_argument("--classic", action="store_true", help="an in-process session instead of Spark Connect")
    parser.add_argument("--url", help="a running Spark Connect server (default: start one for the run)")
    args = parser.parse_args()
    if args.classic:
        run(local_session(cores=2, app_name="bench", extra={"spark.driver.memory": "8g"}), None, args)
    else:
        on_spark(run, args, "recompute-bench-", driver_memory="8g")


def run(spark: SparkSession, _work: str | None, args: argparse.Namespace) -> None:
    mode = "classic" if args.classic else "Spark Connect"
    print(f"{args.query}, {args.store} store, {args.workers} workers, {mode}, median of {args.steps} steps")
    print(f"{'state bids':>11} {'delta':>8} {'load s':>7} {'step s':>7} {'recompute s':>11} {'step/recompute':>14}")
    for total in args.bids:
        rows = measure(spark, args, total)
        for r in rows:
            print(
                f"{r['state_bids']:>11,} {r['delta_bids']:>8,} {r['load_s']:>7.1f} {r['ours_s']:>7.2f} "
                f"{r['recompute_s']:>11.2f} {r['ours_s'] / r['recompute_s']:>14.2f}",
                flush=True,
            )
        if len(rows) > 1:
            print(marginal(rows[0], rows[-1]), flush=True)


def marginal(small: dict, large: dict) -> str:
    """The step's cost per extra delta row between two fractions, against the recompute's
    cost per row of state (at the larger state)."""
    per_delta_row = (large["ours_s"] - small["ours_s"]) / (large["delta_bids"] - small["delta_bids"])
    per_state_row = large["recompute_s"] / (large["state_bids"] + large["delta_bids"])
    return (
        f"marginal delta row {per_delta_row * 1e6:.2f} us ({small['delta_bids']:,} -> {large['delta_bids']:,} rows);"
        f" recompute per row of state {per_state_row * 1e6:.2f} us; ratio {per_delta_row / per_state_row:.1f}x"
    )


if __name__ == "__main__":
    main()
