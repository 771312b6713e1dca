"""KLogs ``loop`` throughput: messages per second of a keyed-log pipeline's steps (a
running sum per key, state on Delta, output log, a sink) against a plain Spark job doing
the same per-key fold with ``groupBy(key).applyInPandas`` over the same messages (written
to Parquet), measured in the same run on one Spark Connect server.

Two shapes: ``--messages`` over ``--keys`` keys in one step, and ``--steps`` steps of
``--per-step`` messages over the same keys.  The plain job keeps no state between steps
(each step's fold starts from zero): a lower bound for what a stateful job would cost.

    python bench/klogs.py --messages 1000000 --keys 100000 --steps 100 --per-step 10000
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pandas as pd
from common import on_spark
from pyspark.sql import functions as F

from circuits.klogs import KLog, deploy
from storage.logs import Range
from storage.pipeline import Pipeline

LOG = "bench"


def add(total: int, _key: str, value: int) -> tuple[int, list[int]]:
    total += value
    return total, [total]


def discard(_key: str, _value: int) -> None:
    pass


def messages(spark, first: int, count: int, keys: int):
    """Messages ``first..first+count`` of one partition: key ``k<i mod keys>``, value ``i mod 100``."""
    i = F.col("id")
    return spark.range(first, first + count).select(
        F.concat(F.lit('"k'), (i % keys).cast("string"), F.lit('"')).alias("key"),
        (i % 100).cast("string").alias("value"),
        F.lit(0).alias("partition"),
        i.alias("offset"),
        F.lit(None).cast("bigint").alias("timestamp"),  # none: the order falls back to the offsets
        F.lit(1).cast("bigint").alias("_weight"),
    )


def plain_fold(pdf: pd.DataFrame) -> pd.DataFrame:
    """The same fold as the pipeline's loop, per key in offset order, with ``add`` per message."""
    pdf = pdf.sort_values("offset")
    total, out = 0, []
    for value in pdf["value"]:
        total, emitted = add(total, "", int(value))
        out += emitted
    return pd.DataFrame({"key": pdf["key"].iloc[: len(out)], "offset": pdf["offset"].iloc[: len(out)], "total": out})


def plain_step(spark, frame, path: str) -> None:
    frame.groupBy("key").applyInPandas(plain_fold, "key string, offset bigint, total bigint").write.mode(
        "overwrite"
    ).parquet(path)


def run(spark, work: str, args) -> None:
    def pipeline():
        KLog.named(LOG).loop(0, add).sink(discard)

    circuit = deploy(pipeline, "klogs_bench")
    shapes = {
        f"one step of {args.messages:,} over {args.keys:,} keys": [args.messages],
        f"{args.steps} steps of {args.per_step:,}": [args.per_step] * args.steps,
    }
    print("| shape | KLogs pipeline msg/s | sinks s | plain applyInPandas msg/s | ratio |")
    print("| --- | --- | --- | --- | --- |")
    for n, (shape, sizes) in enumerate(shapes.items()):
        klogs = Pipeline(spark, os.path.join(work, f"klogs{n}"), circuit, workers=2)
        spent = {"klogs": 0.0, "plain": 0.0}
        first = 0
        for step, size in enumerate(sizes):
            frame = messages(spark, first, size, args.keys)
            started = time.perf_counter()
            klogs.submit(step, {LOG: frame}, [Range(LOG, 0, first, first + size)])
            klogs.run()
            spent["klogs"] += time.perf_counter() - started
            started = time.perf_counter()
            plain_step(spark, frame, os.path.join(work, f"plain{n}"))
            spent["plain"] += time.perf_counter() - started
            first += size
        total = sum(sizes)
        rates = {name: total / seconds for name, seconds in spent.items()}
        print(
            f"| {shape} | {rates['klogs']:,.0f} | {klogs.timings['sinks']:.1f} | {rates['plain']:,.0f} | "
            f"{rates['klogs'] / rates['plain']:.2f} |",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--per-step", type=int, default=10_000)
    parser.add_argument("--url", help="a running Spark Connect server (default: start one for the run)")
    on_spark(run, parser.parse_args(), "klogs-bench-")


if __name__ == "__main__":
    main()
