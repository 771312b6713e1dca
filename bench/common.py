"""Data and step drivers shared by the benchmarks: synthetic Nexmark auctions and bids
(bid ``i`` depends only on ``i``), a timer, and a function running one step of a view
in memory or durably on Delta."""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import tempfile
import time
from collections import Counter

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from circuits import InMemoryStateStore, StepRunner
from circuits.daemon import free_port
from circuits.library import nexmark_circuit
from circuits.spark import connect_server, remote_session, stop_connect_server, unnamed
from circuits.zset import WEIGHT, consolidate, data_columns
from storage.logs import STEP, OutputLog, Range
from storage.pipeline import Pipeline


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
    """Bids spread over every auction; six in seven fall within their auction's 600 s
    window (so q4's filter keeps most of them and its aggregates change every step)."""
    auction = F.col("id") * 7919 % auction_count
    return spark.range(first, first + count).select(
        auction.alias("auction"),
        (F.col("id") % 10007).alias("bidder"),
        (F.col("id") * 31 % 10000 + 1).alias("price"),
        F.lit("Google").alias("channel"),
        (auction * 1000 + F.col("id") * 37 % 700_000).alias("date_time"),
        F.lit(1).cast("bigint").alias("_weight"),
    )


SPARK_DEFAULTS = {
    "spark.sql.adaptive.enabled": "true",
    "spark.sql.autoBroadcastJoinThreshold": "10MB",
    "spark.sql.requireAllClusterKeysForCoPartition": "true",
    "spark.sql.maxSinglePartitionBytes": "128MB",
    "spark.sql.constraintPropagation.enabled": "true",
    "spark.sql.optimizer.excludedRules": "",
    "spark.sql.codegen.wholeStage": "true",
    "spark.sql.codegen.factoryMode": "FALLBACK",
}
"""Spark's defaults of the settings the engine changes in its session that bear on a batch
or streaming query (``circuits.spark.ENGINE_CONF``, ``INTERPRETED``)."""


def peer_session(spark: SparkSession, url: str | None = None) -> SparkSession:
    """A session of its own on ``spark``'s server or JVM for the peer (Spark batch SQL,
    Structured Streaming), with Spark's defaults: in the engine's session the peer ran with
    adaptive execution and broadcast joins off and, after a small step, interpreted rows.
    Over Spark Connect, ``url`` names the server (a Connect session has no ``newSession``);
    the peer leaves the server session the URL may name, which is the engine's: settings
    are a server session's, so the peer's would be the engine's too."""
    peer = SparkSession.builder.remote(unnamed(url)).create() if url else spark.newSession()
    for key, value in SPARK_DEFAULTS.items():
        peer.conf.set(key, value)
    return peer


def timed(action) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def stepper(spark: SparkSession, query: str, store: str, workers: int, root: str):
    """A function running one step on its inputs: in memory, or durably on Delta."""
    circuit = nexmark_circuit("bench", (query,))
    if store == "memory":
        runner = StepRunner(circuit, spark, InMemoryStateStore(), workers=workers)
        return lambda inputs: runner.step(inputs).collect_outputs()
    shutil.rmtree(root, ignore_errors=True)
    pipeline = Pipeline(spark, root, circuit, workers=workers)
    steps = itertools.count()

    def durable(inputs):
        step = next(steps)
        pipeline.submit(step, inputs, [Range("bench", 0, step, step + 1)])
        pipeline.run()

    return durable


def integrated_output(spark: SparkSession, root: str, query: str, last: int) -> Counter:
    """What the output log of a durable :func:`stepper` at ``root`` adds up to through step
    ``last``: each row of view ``query`` with its summed weight (rows summing to zero left out)."""
    changes = OutputLog(spark, root).read(query, 0, last)
    columns = [c for c in data_columns(changes.schema) if c != STEP]
    return Counter({tuple(row[:-1]): row[-1] for row in consolidate(changes.select(*columns, WEIGHT)).collect()})


def rounded(rows: Counter) -> Counter:
    """``rows`` with floats rounded to 6 places: an average kept incrementally and one
    recomputed in batch may differ in the last bits."""
    return Counter({tuple(round(v, 6) if isinstance(v, float) else v for v in row): n for row, n in rows.items()})


def on_spark(run, args, prefix: str, driver_memory: str = "4g") -> None:
    """``run(spark, work, args)`` in a fresh work directory, on the Spark Connect server at
    ``args.url``, else on one started for the run and stopped after (``run``'s ``args.url``
    is the server's, either way)."""
    work = tempfile.mkdtemp(prefix=prefix)
    port = free_port()
    url = args.url or connect_server(os.path.join(work, "spark"), port, driver_memory=driver_memory)
    try:
        run(remote_session(url), work, argparse.Namespace(**{**vars(args), "url": url}))
    finally:
        if not args.url:
            stop_connect_server(os.path.join(work, "spark"), port)
        shutil.rmtree(work, ignore_errors=True)
