"""This engine against Spark Structured Streaming (SS), same machine and data, on a Spark
Connect server started for the run (``--url`` names a running one; ``--classic``: an
in-process session).

1. Per-step latency of bids revenue by category (bids JOIN auctions, then an aggregate).
   State: ``--bids`` bids over ``--bids // 15`` auctions, then ``--batches`` micro-batches
   of ``--batch-rows`` new bids.  Ours: a durable step of ``storage.pipeline.Pipeline``
   per batch (input persisted, state and output committed to Delta, checkpoint committed),
   the initial bids and the auctions in step 0.  SS, in a session of its own with Spark's
   default settings (``common.peer_session``): the same bids as one Parquet file per
   batch (the initial bids first), read with ``maxFilesPerTrigger`` 1 and joined to the
   auctions as a static DataFrame, aggregated in update mode with a checkpoint on disk and
   an idempotent ``foreachBatch`` sink writing ``<out>/batch=<id>``; a batch's latency is
   its ``triggerExecution`` time.  Both: batch 0 is the load, then ``--warmup`` unmeasured
   batches (ours runs first, on the server the run started, whose JIT is still cold then,
   and SS would otherwise run on the JVM that our steps warmed), then the median over the
   ``--batches`` measured ones; shuffle partitions = ``--workers``, and the final result
   checked against Spark batch SQL.  Over Spark Connect it also prints the part of our
   step that the client spent waiting on the server (planning and running the step's
   Spark jobs), against SS's batch: what is left once Python and delta-rs cost nothing.
2. Nexmark views SS refuses: each is started as an SS query in update mode over tiny file
   streams (the error's first line is recorded), then run for two durable steps in this
   engine, whose integrated output is checked against Spark batch SQL over the same input.

    python bench/structured_streaming.py --bids 1000000 --batches 10 --batch-rows 1000
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
from collections import Counter

from common import auctions, bids, integrated_output, on_spark, peer_session, rounded, stepper, timed
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from circuits.library.nexmark import (
    BID_SCHEMA,
    SCHEMAS,
    NexmarkGenerator,
    nexmark_inputs,
)
from circuits.library.nexmark_queries import RECOMPUTE_SQL
from circuits.spark import is_remote, local_session, round_trips
from circuits.zset import WEIGHT

# Part 2: view, its description, the inputs SS reads as streams, and the grouping keys of
# the view (an update-mode result is each key's last emitted row; None: every emitted row).
REFUSED = [
    (
        "q4",
        "q4: join, then two chained aggregations (auctions and bids streaming)",
        ("auctions", "bids"),
        ("category",),
    ),
    ("q15", "q15: per day count(*), count(DISTINCT bidder), count(DISTINCT auction)", ("bids",), ("day",)),
    (
        "bids_by_category",
        "bids_by_category with auctions and bids streaming (stream-stream join + aggregate)",
        ("auctions", "bids"),
        ("category",),
    ),
    ("q3", "q3 with auctions and persons streaming (stream-stream join, no aggregate)", ("persons", "auctions"), None),
]
CORRECTNESS_CHECK = "spark.sql.streaming.statefulOperator.checkCorrectness.enabled"
REFUSAL_EVENTS = 500  # Nexmark events per step in part 2: 10 persons, 30 auctions, 460 bids

CAVEAT = (
    "Semantics differ: SS keeps no join state here (the auctions are a static DataFrame, re-evaluated by every batch, "
    "and bids may only be appended); ours maintains both sides of the join and accepts deletions on either input."
)


def bag(df: DataFrame) -> Counter:
    return bag_of(df.collect())


def bag_of(rows) -> Counter:
    return Counter(tuple(row) for row in rows)


def append_file(df: DataFrame, directory: str) -> None:
    """Adds ``df`` (weights dropped) to ``directory`` as one new Parquet file: one file of a file stream."""
    df.drop(WEIGHT).coalesce(1).write.mode("append").parquet(directory)


def first_line(error: Exception) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def structured_streaming(spark: SparkSession, args: argparse.Namespace, auction_count: int) -> list[float]:
    """Runs SS over the batches; returns each batch's ``triggerExecution`` seconds (batch 0 first)."""
    root = os.path.join(args.root, "ss")
    shutil.rmtree(root, ignore_errors=True)
    source, out = os.path.join(root, "input"), os.path.join(root, "output")
    append_file(bids(spark, 0, args.bids, auction_count), source)
    for batch in range(total(args)):
        append_file(bids(spark, args.bids + batch * args.batch_rows, args.batch_rows, auction_count), source)
    spark.readStream.schema(BID_SCHEMA).option("maxFilesPerTrigger", 1).parquet(source).createOrReplaceTempView("bids")
    auctions(spark, auction_count).drop(WEIGHT).createOrReplaceTempView("auctions")
    spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", str(max(100, total(args) + 10)))
    spark.conf.set("spark.sql.shuffle.partitions", str(args.workers))

    def sink(changes: DataFrame, batch_id: int) -> None:
        changes.write.mode("overwrite").parquet(os.path.join(out, f"batch={batch_id}"))

    query = (
        spark.sql(RECOMPUTE_SQL["bids_by_category"])
        .writeStream.outputMode("update")
        .option("checkpointLocation", os.path.join(root, "checkpoint"))
        .foreachBatch(sink)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    seconds = {p["batchId"]: p["durationMs"]["triggerExecution"] / 1000 for p in query.recentProgress}
    if sorted(seconds) != list(range(total(args) + 1)):
        raise AssertionError(f"SS ran batches {sorted(seconds)}, expected 0..{total(args)}")
    # Update mode emits each changed group's new value: a category's result is its last one.
    latest = Window.partitionBy("category").orderBy(F.col("batch").desc())
    emitted = spark.read.parquet(out).withColumn("_rank", F.row_number().over(latest))
    result = emitted.where("_rank = 1").select("category", "revenue", "bids")
    if bag(result) != recomputed(spark, auction_count, args.bids + total(args) * args.batch_rows):
        raise AssertionError("SS result differs from Spark batch SQL")
    return [seconds[batch] for batch in range(total(args) + 1)]


def total(args: argparse.Namespace) -> int:
    """Batches after the load, the warm-up ones included."""
    return args.warmup + args.batches


def ours(spark: SparkSession, args: argparse.Namespace, auction_count: int) -> tuple[list[float], list[float | None]]:
    """Runs our durable steps over the batches; returns each step's seconds (step 0 first)
    and, over Spark Connect, the seconds of each step that the client waited on the server
    (its round trips: planning and running its Spark jobs; the rest is Python and delta-rs)."""
    root = os.path.join(args.root, "ours")
    step = stepper(spark, "bids_by_category", "delta", args.workers, root)
    load = {"auctions": auctions(spark, auction_count), "bids": bids(spark, 0, args.bids, auction_count)}
    seconds, on_server, remote = [], [], is_remote(spark.range(0))

    def measured(inputs: dict) -> None:
        waited: Counter = Counter()
        with round_trips(spark, seconds=waited) if remote else contextlib.nullcontext():
            seconds.append(timed(lambda: step(inputs)))
        on_server.append(sum(waited.values()) if waited else None)

    measured(load)
    for batch in range(total(args)):
        measured({"bids": bids(spark, args.bids + batch * args.batch_rows, args.batch_rows, auction_count)})
    expected = recomputed(spark, auction_count, args.bids + total(args) * args.batch_rows)
    if integrated_output(spark, root, "bids_by_category", total(args)) != expected:
        raise AssertionError("our integrated output differs from Spark batch SQL")
    return seconds, on_server


def recomputed(spark: SparkSession, auction_count: int, bid_count: int) -> Counter:
    """bids_by_category by Spark batch SQL over the first ``bid_count`` bids."""
    auctions(spark, auction_count).drop(WEIGHT).createOrReplaceTempView("auctions")
    bids(spark, 0, bid_count, auction_count).drop(WEIGHT).createOrReplaceTempView("bids")
    return bag(spark.sql(RECOMPUTE_SQL["bids_by_category"]))


def latency(spark: SparkSession, args: argparse.Namespace) -> None:
    auction_count = max(args.bids // 15, 1)
    mine, on_server = ours(spark, args, auction_count)
    theirs = structured_streaming(peer_session(spark), args, auction_count)
    measured = slice(1 + args.warmup, None)
    ours_s, ss_s = statistics.median(mine[measured]), statistics.median(theirs[measured])
    server = [s for s in on_server[measured] if s is not None]
    server_s = statistics.median(server) if server else float("nan")
    print(
        f"bids_by_category, {args.workers} workers / shuffle partitions, median of batches "
        f"{args.warmup + 1}..{total(args)} (after {args.warmup} warm-up batches); "
        "'ours on server': the part of our step spent waiting on Spark Connect round trips"
    )
    print(
        f"{'state bids':>11} {'batch rows':>10} {'batches':>7} {'ours load s':>11} {'SS load s':>9} "
        f"{'ours s':>7} {'SS s':>7} {'ours/SS':>7} {'ours on server s':>16} {'on server/SS':>12}"
    )
    print(
        f"{args.bids:>11,} {args.batch_rows:>10,} {args.batches:>7} {mine[0]:>11.2f} {theirs[0]:>9.2f} "
        f"{ours_s:>7.2f} {ss_s:>7.2f} {ours_s / ss_s:>7.2f} {server_s:>16.2f} {server_s / ss_s:>12.2f}"
    )
    print(CAVEAT, flush=True)


def try_structured_streaming(
    spark: SparkSession,
    query: str,
    streams: tuple[str, ...],
    keys: tuple[str, ...] | None,
    root: str,
    expected: Counter,
) -> str:
    """Starts ``query`` as an SS query in update mode over the file streams of ``streams`` (one
    file of each per batch): what SS says (refused, with its error's first line, or accepted,
    with whether its result equals ``expected``)."""
    for name in streams:
        stream = spark.readStream.schema(SCHEMAS[name]).option("maxFilesPerTrigger", 1)
        stream.parquet(os.path.join(root, "input", name)).createOrReplaceTempView(name)
    # Over Spark Connect the sink runs in a Python process of the server: it leaves each
    # batch's rows in a directory of its own, read back here.
    out = os.path.join(root, "output", query)

    def sink(changes: DataFrame, batch_id: int) -> None:
        changes.write.mode("overwrite").parquet(os.path.join(out, f"batch={batch_id}"))

    checkpoint = os.path.join(root, "checkpoint", query)
    shutil.rmtree(checkpoint, ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)
    try:
        handle = (
            spark.sql(RECOMPUTE_SQL[query])
            .writeStream.outputMode("update")
            .option("checkpointLocation", checkpoint)
            .foreachBatch(sink)
            .start()
        )
    except Exception as error:
        return f"refused at start: `{first_line(error)}`"
    try:
        handle.processAllAvailable()
    except StreamingQueryException as error:
        return f"refused while running: `{first_line(error)}`"
    finally:
        handle.stop()
    emitted = spark.read.parquet(out)
    batches = {row.batch for row in emitted.select("batch").distinct().collect()}
    rows = emitted.orderBy("batch").drop("batch").collect()
    if keys is None:
        result = bag_of(rows)
    else:  # a key's result is its row of the latest batch
        result = bag_of({tuple(row[k] for k in keys): row for row in rows}.values())
    verdict = "yes" if rounded(result) == expected else "NO"
    return f"accepted; ran {len(batches)} batches, result equals batch SQL: {verdict}"


def refusals(spark: SparkSession, args: argparse.Namespace) -> None:
    root = os.path.join(args.root, "refusals")
    shutil.rmtree(root, ignore_errors=True)
    generator = NexmarkGenerator()
    steps = [nexmark_inputs(spark, list(generator.events(s * REFUSAL_EVENTS, REFUSAL_EVENTS))) for s in range(2)]
    for inputs in steps:
        for name, df in inputs.items():
            append_file(df, os.path.join(root, "input", name))
    print(f"\n{len(steps)} steps (files) of {REFUSAL_EVENTS} Nexmark events; SS over file streams, update mode")
    print("| query | Structured Streaming (update mode) | this engine (result equals batch SQL) |")
    print("| --- | --- | --- |")
    for query, description, streams, keys in REFUSED:
        for name in SCHEMAS:
            spark.read.schema(SCHEMAS[name]).parquet(os.path.join(root, "input", name)).createOrReplaceTempView(name)
        expected = rounded(bag(spark.sql(RECOMPUTE_SQL[query])))
        ss = try_structured_streaming(spark, query, streams, keys, root, expected)
        if CORRECTNESS_CHECK in ss:  # SS names a switch to run the query anyway: try it too
            spark.conf.set(CORRECTNESS_CHECK, "false")
            try:
                unchecked = try_structured_streaming(spark, query, streams, keys, root, expected)
            finally:
                spark.conf.unset(CORRECTNESS_CHECK)
            ss += f"; with `{CORRECTNESS_CHECK}=false`: {unchecked}"
        ours_root = os.path.join(root, "ours", query)
        step = stepper(spark, query, "delta", args.workers, ours_root)
        for inputs in steps:
            step(inputs)
        got = rounded(integrated_output(spark, ours_root, query, len(steps) - 1))
        verdict = f"{'yes' if got == expected else 'NO'} ({sum(expected.values())} rows)"
        print(f"| {description} | {ss} | {verdict} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bids", type=int, default=100_000, help="bids loaded in batch 0")
    parser.add_argument("--batches", type=int, default=10, help="measured batches")
    parser.add_argument("--warmup", type=int, default=20, help="unmeasured batches first, on both sides")
    parser.add_argument("--batch-rows", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--part", choices=["latency", "refusals", "both"], default="both")
    parser.add_argument("--root", default="/tmp/dbsp-bench-ss", help="pipelines, SS checkpoints and inputs")
    parser.add_argument("--classic", action="store_true", help="an in-process session instead of Spark Connect")
    parser.add_argument("--url", help="a running Spark Connect server (default: start one for the run)")
    args = parser.parse_args()
    if args.classic:
        run(local_session(cores=2, app_name="bench-ss", extra={"spark.driver.memory": "8g"}), None, args)
    else:
        on_spark(run, args, "ss-bench-", driver_memory="8g")


def run(spark: SparkSession, _work: str | None, args: argparse.Namespace) -> None:
    print("classic in-process session" if args.classic else "Spark Connect server, both sides", flush=True)
    if args.part in ("latency", "both"):
        latency(spark, args)
    if args.part in ("refusals", "both"):
        refusals(spark, args)


if __name__ == "__main__":
    main()
