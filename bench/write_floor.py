"""The floor under the marginal cost of a delta row: what writing a row once costs with
Spark, against a Spark batch recompute's cost per row of state, measured in one run.

A durable step writes every delta row at least once (the input log, so that a replay
never depends on the source), and a row of an input that a join reads twice (the input
log and the join's trace of that input, as ``bids_by_category``'s bids).  So a step's
marginal cost per delta row cannot fall below one write's, whatever the circuit does.

Per writer, the median seconds of writing ``--rows`` rows (generated bids with their
weight and step, as the input log holds them, in Spark's default partitions of the
session), over ``--repeats`` writes alternating the writers, and the marginal cost per
row from the smallest to the largest size:

- ``noop``: the rows generated and dropped (Spark's ``noop`` sink): no write at all;
- ``spark parquet``: Spark's own Parquet writer (``DataFrame.write.parquet``), the
  cheapest a Spark job writes Parquet;
- ``engine``: the engine's writer (:func:`storage.delta.write_tables`: files written by
  ``mapInArrow`` tasks into a Delta table's directory, with their statistics, uncommitted).

Peer, on the same server in a session of its own with Spark's defaults
(``common.peer_session``): ``bids_by_category`` recomputed by Spark batch SQL over
``--state`` generated bids, per row of state.

    python bench/write_floor.py --state 1000000 --rows 1000 100000
"""

from __future__ import annotations

import argparse
import os
import statistics

from common import auctions, bids, on_spark, peer_session, timed
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from circuits.library.nexmark_queries import RECOMPUTE_SQL
from circuits.zset import WEIGHT
from storage.delta import write_tables
from storage.logs import STEP


def writers(work: str) -> dict:
    """Each writer as a function of (rows, a name unique per write)."""
    return {
        "noop": lambda df, _name: df.write.format("noop").mode("overwrite").save(),
        "spark parquet": lambda df, name: df.write.parquet(os.path.join(work, "parquet", name)),
        "engine": lambda df, name: write_tables({"t": (os.path.join(work, "engine", name), df)}),
    }


def rows(spark: SparkSession, first: int, count: int, auction_count: int) -> DataFrame:
    return bids(spark, first, count, auction_count).withColumn(STEP, F.lit(1).cast("bigint"))


def recompute_per_row(spark: SparkSession, state: int, repeats: int) -> float:
    """Seconds per row of state of the peer's ``bids_by_category`` recompute (median)."""
    peer = peer_session(spark)
    auction_count = max(state // 15, 1)
    auctions(peer, auction_count).drop(WEIGHT).createOrReplaceTempView("auctions")
    bids(peer, 0, state, auction_count).drop(WEIGHT).createOrReplaceTempView("bids")
    seconds = [timed(lambda: peer.sql(RECOMPUTE_SQL["bids_by_category"]).collect()) for _ in range(repeats + 1)]
    return statistics.median(seconds[1:]) / state


def run(spark: SparkSession, work: str, args: argparse.Namespace) -> None:
    auction_count = max(args.state // 15, 1)
    ways = writers(work)
    times: dict[tuple[str, int], list[float]] = {}
    first, write = 0, 0
    for repeat in range(args.repeats + 1):  # the first round warms the server and is not counted
        for size in args.rows:
            for name, writer in ways.items():
                df = rows(spark, first, size, auction_count)
                first, write = first + size, write + 1
                seconds = timed(lambda df=df, writer=writer, write=write: writer(df, f"w{write}"))
                if repeat:
                    times.setdefault((name, size), []).append(seconds)
    per_state_row = recompute_per_row(spark, args.state, args.repeats)
    small, large = min(args.rows), max(args.rows)
    print(
        f"writing generated bids ({args.repeats} writes each, medians); recompute of bids_by_category over "
        f"{args.state:,} bids: {per_state_row * 1e6:.3f} us per row of state"
    )
    print(
        f"{'writer':>14} "
        + " ".join(f"{f'{n:,} rows s':>14}" for n in args.rows)
        + f" {'marginal us/row':>15} {'x recompute/row':>15}"
    )
    for name in ways:
        medians = {n: statistics.median(times[(name, n)]) for n in args.rows}
        marginal = (medians[large] - medians[small]) / (large - small)
        print(
            f"{name:>14} "
            + " ".join(f"{medians[n]:>14.3f}" for n in args.rows)
            + f" {marginal * 1e6:>15.3f} {marginal / per_state_row:>15.1f}",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--state", type=int, default=1_000_000, help="bids the peer recomputes over")
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000, 100_000], help="rows per write")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--url", help="a running Spark Connect server (default: start one for the run)")
    on_spark(run, parser.parse_args(), "write-floor-", driver_memory="8g")


if __name__ == "__main__":
    main()
