"""Who should commit a step's tables: delta-rs (the engine's writer) or delta-spark, measured
on the frames of real demo steps, in one run.

The demo circuit (four views) runs durably on a Spark Connect server with Delta's SQL
extension.  For each measured step, the frames the step hands to its write (every state
trace's and every output log's rows: ``storage.delta.write_tables`` as
``DeltaStateStore.materialize`` calls it) are written again, both ways, into copies of the
same tables' logs at the same versions, alternating, ``--rounds`` times after the step's
own write (which makes its shared frames):

* ``delta-rs``: the engine's path: one Spark job writes every table's Parquet files
  (``mapInArrow``), and delta-rs commits each table from this process, tagged with an
  app transaction (``storage.delta.commit``);
* ``delta-spark``: one ``df.write.format("delta").mode("append")`` per table, tagged with
  ``txnAppId``/``txnVersion`` (delta-spark's idempotent write), each a Spark job that
  computes its table's rows, writes and commits them on the server;
* ``delta-spark once``: the same appends from the step's rows computed once: every
  table's rows packed into one cached union (``circuits.state.pack``, as the engine's
  writer takes them), each append reading its part of it.

Both delta-spark ways write no file per worker or sorted cut, as the engine's writer
does for its lookups: they are delta-spark's cheapest form.

delta-spark runs with the settings of :data:`DELTA_SPARK_CONF` (its state reconstruction
in one partition and no checksum file: by default each append reconstructs the table's
state in 50 tasks, which made a ten-row append 7-25 s on this machine's 2 cores, 1-2 s
with them).  Both sides have their table handles warm (delta-rs's kept handles, delta-spark's log
cache on the server, by a read of each copy first), as a committer of those tables would.
The cases: ``--events`` events a step onto a warmed pipeline (a demo step), and a first
load of ``--load`` events into a new pipeline (the tables are created inside the
measured write, both ways).

    PYTHONPATH=. python bench/committer.py --events 1000 --load 200000 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import time
from collections.abc import Callable

from pyspark.sql import SparkSession

from bench.common import on_spark
from circuits.library import nexmark_circuit
from circuits.library.nexmark import NexmarkGenerator, nexmark_inputs
from circuits.state import FILE, pack, unpack
from storage import database
from storage.delta import commit, ensured_schema, latest
from storage.logs import Range
from storage.pipeline import Pipeline

DELTA_SPARK_CONF = {
    "spark.databricks.delta.snapshotPartitions": "1",
    "spark.databricks.delta.writeChecksumFile.enabled": "false",
}

WAYS = ("delta-rs", "delta-spark", "delta-spark once")


class Measured:
    """Replaces ``storage.database.write_tables``: while ``armed``, a call is measured both
    ways (see the module) before it returns the step's own write."""

    def __init__(self, spark: SparkSession, work: str, rounds: int, ways: list[str]) -> None:
        self.spark, self.work, self.rounds, self.ways = spark, work, rounds, ways
        self.real = database.write_tables
        self.armed = False
        self.seconds: dict[str, list[float]] = {way: [] for way in ways}
        self.tables = 0
        self._copies = 0

    def __call__(self, parts, orders=None, rows=0, *, size=None, workers=1):
        written = self.real(parts, orders, rows, size=size, workers=workers)
        if self.armed:
            self.armed = False
            self.tables = len(parts)
            write = {
                "delta-rs": lambda copies: self._delta_rs(copies, orders, rows, size, workers),
                "delta-spark": self._delta_spark,
                "delta-spark once": self._delta_spark_once,
            }
            for round_ in range(self.rounds):
                for way in self.ways if round_ % 2 == 0 else reversed(self.ways):
                    copies = self._copy(parts, way)
                    started = time.perf_counter()
                    write[way](copies)
                    self.seconds[way].append(time.perf_counter() - started)
        return written

    def _copy(self, parts: dict, way: str) -> dict:
        """``parts`` aimed at copies of their tables' logs (data files are not read by an
        append), each warmed as its committer would have it."""
        self._copies += 1
        copies = {}
        for name, (uri, df) in parts.items():
            copy = os.path.join(self.work, "copies", str(self._copies), name.replace(":", "_"))
            log = os.path.join(uri, "_delta_log")
            if os.path.isdir(log):
                shutil.copytree(log, os.path.join(copy, "_delta_log"))
                if way == "delta-rs":
                    ensured_schema(copy, lambda: None)
                    with latest(copy):
                        pass
                else:
                    self.spark.read.format("delta").load(copy).schema  # noqa: B018 (loads the log on the server)
            copies[name] = (copy, df)
        return copies

    def _delta_rs(self, copies: dict, orders, rows: int, size: int | None, workers: int) -> None:
        for files in self.real(copies, orders, rows, size=size, workers=workers).values():
            commit(files, "bench", self._copies)

    def _delta_spark(self, copies: dict) -> None:
        for copy, df in copies.values():
            self._append(df.drop(FILE), copy)

    def _delta_spark_once(self, copies: dict) -> None:
        packed = pack({name: df.drop(FILE) for name, (_, df) in copies.items()}).persist()
        try:
            for (copy, _), part in zip(copies.values(), unpack(packed, list(copies)).values()):
                self._append(part, copy)
        finally:
            packed.unpersist()

    def _append(self, df, uri: str) -> None:
        df.write.format("delta").mode("append").option("txnAppId", "bench").option("txnVersion", self._copies).save(uri)


def steps(spark: SparkSession, root: str, measured: Measured, events: int, count: int, measure: Callable[[int], bool]):
    """Runs ``count`` demo steps of ``events`` events on the pipeline at ``root``, arming the
    measurement for the steps ``measure`` picks."""
    pipeline = Pipeline(spark, root, nexmark_circuit(), workers=2)
    generator, first = NexmarkGenerator(), 0
    for step in range(count):
        batch = list(generator.events(first, events))
        first += events
        measured.armed = measure(step)
        pipeline.submit(step, nexmark_inputs(spark, batch), [Range("bench", 0, step, step + 1)])
        pipeline.run()


def report(case: str, measured: Measured) -> None:
    median = {way: statistics.median(seconds) for way, seconds in measured.seconds.items()}
    figures = " | ".join(f"{median[way]:.2f} s ({median[way] / median['delta-rs']:.2f}x)" for way in measured.ways)
    print(f"| {case} | {measured.tables} | {figures} | {len(measured.seconds['delta-rs'])} |", flush=True)


def run(spark: SparkSession, work: str, args: argparse.Namespace) -> None:
    for key, value in DELTA_SPARK_CONF.items():
        spark.conf.set(key, value)
    ways = ["delta-rs", *(way for way in args.ways if way != "delta-rs")]
    print(f"| case | tables | {' | '.join(f'{way} (median, / delta-rs)' for way in ways)} | samples |")
    print(f"| --- | --- | {' | '.join('---' for _ in ways)} | --- |")
    step_case = Measured(spark, os.path.join(work, "step"), args.rounds, ways)
    database.write_tables = step_case
    try:
        if args.steps:
            measure = lambda step: step >= args.warmup
            steps(spark, os.path.join(work, "demo"), step_case, args.events, args.warmup + args.steps, measure)
            report(f"a demo step of {args.events:,} events ({args.steps} after {args.warmup})", step_case)
        if args.load:
            load_case = Measured(spark, os.path.join(work, "load"), args.rounds, ways)
            database.write_tables = load_case
            steps(spark, os.path.join(work, "first-load"), load_case, args.load, 1, lambda step: True)
            report(f"a first load of {args.load:,} events", load_case)
    finally:
        database.write_tables = step_case.real


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1000, help="events per demo step")
    parser.add_argument("--warmup", type=int, default=3, help="demo steps before the measured ones")
    parser.add_argument("--steps", type=int, default=2, help="demo steps measured (0: none)")
    parser.add_argument("--load", type=int, default=200_000, help="events of the first load (0: none)")
    parser.add_argument("--rounds", type=int, default=3, help="writes of each way per measured step")
    parser.add_argument("--ways", nargs="+", choices=WAYS, default=list(WAYS), help="delta-rs is always measured")
    parser.add_argument("--url", help="a running Spark Connect server (default: one started for the run)")
    on_spark(run, parser.parse_args(), "committer-")


if __name__ == "__main__":
    main()
