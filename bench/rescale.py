"""Layout changes: how much state moves, and how long a change pauses the pipeline.

1. For 4->5, 8->9, 5->4 and 4->8 workers, the fraction of vnodes (so of state, which is
   spread evenly over vnodes) that changes owner under the fixed and the dynamic strategy,
   against the least possible (the bound: 1/(W+1) when adding one worker) and against
   ``hash % W``, measured on the same keys' hashes.
2. A pipeline with ``--rows`` rows of state (bids joined to auctions, then aggregated):
   after compaction, the pause of a cold change, and the copy time and pause of a hot
   one (a step runs between the copy and the switch).

    python bench/rescale.py --rows 1000000
"""

from __future__ import annotations

import argparse
import shutil
import time

from pyspark.sql import functions as F

from circuits.layouts import initial, moved, rescale
from circuits.library import nexmark_circuit
from circuits.spark import local_session
from circuits.vnodes import DEFAULT_VNODES, spark_hash_int
from storage.logs import Range
from storage.pipeline import Pipeline

CHANGES = [(4, 5), (8, 9), (5, 4), (4, 8)]


def least_fraction(before: int, after: int) -> float:
    """The least share of state any balanced layout change must move."""
    if after > before:
        return (after - before) / after  # each new worker must receive a full share
    return (before - after) / before  # each removed worker's share must go somewhere


def hash_mod_fraction(before: int, after: int, keys: int = 200_000) -> float:
    """Share of keys whose worker changes under ``hash % W``."""
    return sum(spark_hash_int(k) % before != spark_hash_int(k) % after for k in range(keys)) / keys


def movement_table() -> None:
    print("| change | least possible | fixed | dynamic (k=0.1) | hash % W |")
    print("| --- | --- | --- | --- | --- |")
    for before, after in CHANGES:
        fractions = []
        for strategy in ("fixed", "dynamic"):
            layout = initial(DEFAULT_VNODES, before, strategy)
            fractions.append(len(moved(layout, rescale(layout, after))) / DEFAULT_VNODES)
        print(
            f"| {before}->{after} | {least_fraction(before, after):.3f} | {fractions[0]:.3f} | {fractions[1]:.3f} "
            f"| {hash_mod_fraction(before, after):.3f} |"
        )


def state_inputs(spark, rows: int, first: int):
    """``rows`` bids over 10,000 auctions (first step: the auctions too)."""
    bids = spark.range(first, first + rows).select(
        (F.col("id") % 10_000).alias("auction"),
        (F.col("id") % 7919).alias("bidder"),
        (F.col("id") % 997 + 1).alias("price"),
        F.lit("bench").alias("channel"),
        F.col("id").alias("date_time"),
        F.lit(1).cast("bigint").alias("_weight"),
    )
    inputs = {"bids": bids}
    if first == 0:
        inputs["auctions"] = spark.range(10_000).select(
            F.col("id"),
            F.concat(F.lit("item-"), F.col("id")).alias("item_name"),
            F.lit(1).cast("bigint").alias("initial_bid"),
            F.lit(2).cast("bigint").alias("reserve"),
            F.lit(0).cast("bigint").alias("date_time"),
            F.lit(10**12).cast("bigint").alias("expires"),
            F.lit(1).cast("bigint").alias("seller"),
            (F.col("id") % 5 + 10).alias("category"),
            F.lit(1).cast("bigint").alias("_weight"),
        )
    return inputs


def timing_table(rows: int, root: str) -> None:
    spark = local_session(cores=2, app_name="bench-rescale")
    pipeline = Pipeline(spark, root, nexmark_circuit("bench", ("bids_by_category",)), workers=4)
    started = time.perf_counter()
    pipeline.submit(0, state_inputs(spark, rows, 0), [Range("bench", 0, 0, rows)])
    pipeline.run()
    loaded = time.perf_counter() - started
    started = time.perf_counter()
    pipeline.compact()  # maintained state: traces consolidated into one file per layout unit
    print(
        f"\nstate: {rows:,} bids joined to 10,000 auctions; loading took {loaded:.1f} s, "
        f"compaction {time.perf_counter() - started:.1f} s"
    )

    cold = pipeline.rescale(5)
    step = 1
    pipeline.submit(step, state_inputs(spark, 1000, rows), [Range("bench", 0, rows, rows + 1000)])
    prepared = pipeline.prepare_rescale(6)
    step_started = time.perf_counter()
    pipeline.run()  # a step runs between the copy and the switch
    step_seconds = time.perf_counter() - step_started
    hot = pipeline.finish_rescale(prepared)
    print("| change | vnodes moved | state rows rewritten | copy while steps run | pause |")
    print("| --- | --- | --- | --- | --- |")
    for name, report in (("cold 4->5", cold), ("hot 5->6", hot)):
        print(
            f"| {name} | {report.vnodes_moved} ({report.fraction_moved:.1%}) | {report.rows_rewritten:,} "
            f"| {report.copy_seconds:.1f} s | {report.pause_seconds:.1f} s |"
        )
    print(f"(the 1,000-row step between the hot copy and its switch took {step_seconds:.1f} s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--root", default="/tmp/dbsp-bench-rescale")
    args = parser.parse_args()
    shutil.rmtree(args.root, ignore_errors=True)
    movement_table()
    timing_table(args.rows, args.root)


if __name__ == "__main__":
    main()
