"""Produces and reads on the embedded broker (Apache Kafka), in one run against one fresh node.

* ``produce``: ``--produce`` records of a demo bid's size (about 110 bytes) sent by the demo's
  producer (``KafkaClient.produce``, one producer) to a topic of ``--partitions``
  partitions: records acknowledged per second.
* ``read``: for each of ``--sizes`` (records), a step's division of that many bids over
  ``--partitions`` partitions, read and decoded into the bids' columns by one Spark job
  (a ``noop`` write of every decoded column: a count would let Spark prune the decoding
  away), three ways on the same ranges, alternating, ``--rounds`` rounds after one to warm
  up (the best and the median of each way: the machine's speed moves between rounds):

  - ``consumers``: the engine's reader of a small step (``sensors.decode.read_ranges`` below
    ``LARGE_READ``: confluent-kafka consumers in ``mapInArrow`` tasks, JSON decoded and
    validated in Python);
  - ``spark source``: the engine's reader of a large step (Spark's Kafka source, ``assign``,
    per-partition ``startingOffsets``/``endingOffsets``, ``failOnDataLoss``,
    ``read_committed``, each record decoded and validated by the JVM decoder,
    ``circuits/java``);
  - ``json file`` (the peer): ``spark.read.json`` of the same records from a file, with the
    same schema.

  Each reader's ratio to the file is given twice: of the best rounds, and the median of
  each round's own ratio (the readers of a round run back to back, so a round's ratio
  sees one speed of the machine).  ``--no-consumers`` leaves the first way out (at 1M it
  takes ten times the others, and the load it leaves moves their rounds).

Run: ``PYTHONPATH=. python bench/broker_io.py`` (``--url sc://...`` to use a running server).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from pyspark.sql import DataFrame, SparkSession

from bench.common import on_spark, timed
from circuits.library.nexmark import SCHEMAS
from circuits.zset import parse_schema
from sensors.broker import LocalBroker, ensure_topics
from sensors.decode import read_ranges
from sensors.kafka import KafkaClient
from storage.logs import Range

BIDS = SCHEMAS["bids"]


def bid(i: int) -> bytes:
    return json.dumps(
        {
            "auction": 1_000_000 + i,
            "bidder": 1_000_000 + i % 977,
            "price": i % 5000,
            "channel": "Facebook",
            "date_time": 1_700_000_000_000 + i,
        }
    ).encode()


def produce_rate(bootstrap: str, records: int, partitions: int) -> float:
    ensure_topics(bootstrap, {"produce": partitions})
    seconds = timed(lambda: KafkaClient(bootstrap, timeout=30).produce("produce", (bid(i) for i in range(records))))
    return records / seconds


def decoded(df: DataFrame, count: bool) -> int | None:
    """Computes every column of every row of ``df`` in one job (a ``noop`` write: a count
    would let Spark skip parsing what it does not return); with ``count``, then counts them
    (a second job, outside the measured rounds)."""
    df.write.format("noop").mode("overwrite").save()
    return df.count() if count else None


def engine(spark: SparkSession, bootstrap: str, ranges: list[Range], topic: str, count: bool, large: int) -> int | None:
    read = read_ranges(spark, bootstrap, None, ranges, {topic: BIDS}, large=large)
    try:
        count = decoded(read.inputs[topic], count)
        more = read.rest and read.rest()  # what the JVM left: the bench's bids leave nothing
        assert more is None, "the JVM decoder left valid bids to Python"
        return count
    finally:
        read.unpersist()


def json_file(spark: SparkSession, path: str, count: bool) -> int | None:
    return decoded(spark.read.schema(parse_schema(BIDS)).json(path), count)


def compare(spark: SparkSession, work: str, bootstrap: str, size: int, args: argparse.Namespace) -> dict[str, float]:
    """The best seconds of each way to read ``size`` records, after a round that warms up."""
    topic = f"read-{size}"
    ensure_topics(bootstrap, {topic: args.partitions})
    client = KafkaClient(bootstrap, timeout=30)
    for p in range(args.partitions):
        client.produce(topic, (bid(i) for i in range(p, size, args.partitions)), partition=p)
    ranges = [Range(topic, p, low, high) for (_, p), (low, high) in client.offsets([topic]).items()]
    path = os.path.join(work, f"{topic}.json")
    with open(path, "wb") as f:
        f.writelines(bid(i) + b"\n" for i in range(size))
    ways = {
        "consumers": lambda count: engine(spark, bootstrap, ranges, topic, count, size),
        "spark source": lambda count: engine(spark, bootstrap, ranges, topic, count, 0),
        "json": lambda count: json_file(spark, path, count),
    }
    if args.no_consumers:
        del ways["consumers"]
    seconds: dict[str, list[float]] = {name: [] for name in ways}
    for round_ in range(args.rounds + 1):
        for name, way in ways.items() if round_ % 2 else reversed(ways.items()):
            started = time.perf_counter()
            count = way(not round_)
            if round_:
                seconds[name].append(time.perf_counter() - started)
            else:
                assert count == size, f"{name} read {count} of {size}"
    return seconds


def paired(seconds: dict[str, list[float]], name: str) -> float:
    """The median of each round's ratio of ``name``'s seconds to the file's."""
    return statistics.median(a / b for a, b in zip(seconds[name], seconds["json"]))


def run(spark: SparkSession, work: str, args: argparse.Namespace) -> None:
    with LocalBroker() as broker:
        rate = produce_rate(broker.bootstrap, args.produce, args.partitions)
        print(f"produce: {args.produce:,} records, one producer, {args.partitions} partitions: {rate:,.0f} records/s\n")
        print("Seconds, best and median of the rounds; the ratios of the best, then the median of the rounds' own.\n")
        print("| records | consumers s | spark source s | json file s | consumers / json | spark source / json |")
        print("| --- | --- | --- | --- | --- | --- |")
        for size in args.sizes:
            seconds = compare(spark, work, broker.bootstrap, size, args)
            best = {name: min(s) for name, s in seconds.items()}
            median = {name: statistics.median(s) for name, s in seconds.items()}
            cells = [
                f"{best[name]:.2f} / {median[name]:.2f}" if name in seconds else "-"
                for name in ("consumers", "spark source", "json")
            ]
            ratios = [
                f"{best[name] / best['json']:.2f}x / {paired(seconds, name):.2f}x" if name in seconds else "-"
                for name in ("consumers", "spark source")
            ]
            print(f"| {size:,} | {' | '.join(cells)} | {' | '.join(ratios)} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--produce", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 100_000, 1_000_000])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-consumers", action="store_true", help="leave the engine's consumers out")
    parser.add_argument("--url", help="a running Spark Connect server (default: one started for the run)")
    started = time.perf_counter()
    on_spark(run, parser.parse_args(), "broker-io-")
    print(f"\n{time.perf_counter() - started:.0f} s in all")


if __name__ == "__main__":
    main()
