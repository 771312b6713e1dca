"""Reads and produces on the bundled broker (tansu): what the step's fetch settings and the
demo producer's partitions and connections give, in one run against one fresh broker.

* ``produce``: records of a demo bid's size (about 110 bytes) sent to a fresh topic with
  ``--partitions`` partitions each, by one producer and by ``--producers`` at once, at
  most one per partition (``KafkaClient.produce`` and ``produce_parallel``, with the
  embedded broker's one-record batches): records acknowledged per second.
* ``read``: one partition grown to each of ``--sizes`` records; at each size, for each
  ``fetch.wait.max.ms`` of ``--waits``, the step's reader (``sensors.decode._read_range``,
  the code a Spark task runs, here in this process) reads a small step (the last 10
  records: the latency of a small step) and a large one (the last ``--large`` records:
  records per second), each with a fresh consumer and a limit of ``--limit`` seconds
  without progress.  A read that makes no progress for that long is reported as starved.
* ``step``: a demo step of ``--step-events`` Nexmark events produced to the demo's three
  topics with each of ``--partitions`` partitions, then read one range at a time as a
  step's Spark tasks read them (a fresh consumer per range; here one after another, in
  this process): the reader's fixed cost per partition, ``--rounds`` times per count.

Run: ``PYTHONPATH=. python bench/broker_io.py`` (defaults as in ``bench/RESULTS.md``).

Kafka itself is not measured (none is installable here): there a fetch returns as soon as
``fetch.min.bytes`` (1 by default) are available, so ``fetch.wait.max.ms`` only bounds
the wait at the end of a partition, which a range read never asks for.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from confluent_kafka import Consumer

from circuits.framing import consumer_config
from circuits.library.nexmark import nexmark_records
from sensors.broker import LocalBroker, ensure_topics
from sensors.decode import KEYED, READER_CONFIG, _read_range
from sensors.errors import SourceError
from sensors.kafka import KafkaClient

RECORD = b'{"auction": 1234567, "bidder": 1234567, "price": 4321, "channel": "Facebook", "date_time": 1700000000000}'


def produce_rates(bootstrap: str, records: int, partitions: list[int], producers: int) -> None:
    print("| partitions | producers | records/s |\n| --- | --- | --- |")
    for count in partitions:
        for k in sorted({1, min(producers, count)}):
            topic = f"produce-{count}-{k}"
            ensure_topics(bootstrap, {topic: count})
            client = KafkaClient(bootstrap, timeout=30)
            started = time.perf_counter()
            client.produce_parallel(topic, [RECORD] * records, k)
            print(f"| {count} | {k} | {records / (time.perf_counter() - started):,.0f} |", flush=True)


def read(bootstrap: str, topic: str, start: int, end: int, wait: int, limit: float) -> str:
    """Seconds to read offsets [start, end) of partition 0, or why it failed."""
    try:
        started = time.perf_counter()
        rows = _read(bootstrap, (topic, 0, start, end), {"fetch.wait.max.ms": wait}, limit)
        seconds = time.perf_counter() - started
        return f"{seconds:.2f} s ({rows / seconds:,.0f}/s)" if end - start > 10 else f"{seconds:.2f} s"
    except SourceError as error:
        return f"starved: {type(error).__name__}"


def read_rates(bootstrap: str, sizes: list[int], waits: list[int], large: int, limit: float, producers: int) -> None:
    ensure_topics(bootstrap, {"read": 1})
    client = KafkaClient(bootstrap, timeout=30)
    print("| partition size | fetch.wait.max.ms | small step (10 records) | large step |\n| --- | --- | --- | --- |")
    held = 0
    for size in sizes:
        client.produce_parallel("read", [RECORD] * (size - held), producers)
        held = size
        for wait in waits:
            small = read(bootstrap, "read", size - 10, size, wait, limit)
            big = read(bootstrap, "read", size - large, size, wait, limit)
            print(f"| {size:,} | {wait} | {small} | {large:,}: {big} |", flush=True)


def step_reads(bootstrap: str, partitions: list[int], events: int, rounds: int, limit: float) -> None:
    print("| partitions per topic | ranges | read, median of rounds |\n| --- | --- | --- |")
    for count in partitions:
        client = KafkaClient(bootstrap, timeout=30)
        topics = {kind: f"step-{count}-{kind}" for kind in ("persons", "auctions", "bids")}
        ensure_topics(bootstrap, {t: count for t in topics.values()})
        for kind, records in nexmark_records(0, events).items():
            client.produce(topics[kind], [json.dumps(r).encode() for r in records])
        ranges = [
            (t, p, low, high) for (t, p), (low, high) in client.offsets(list(topics.values())).items() if high > low
        ]
        times = []
        for _ in range(rounds):
            started = time.perf_counter()
            for topic, partition, low, high in ranges:
                _read(bootstrap, (topic, partition, low, high), READER_CONFIG, limit)
            times.append(time.perf_counter() - started)
        print(f"| {count} | {len(ranges)} | {statistics.median(times):.2f} s |", flush=True)


def _read(bootstrap: str, chunk: tuple[str, int, int, int], config: dict, limit: float) -> int:
    settings = consumer_config(bootstrap, config)
    consumer = Consumer(settings)
    try:
        return sum(1 for _ in _read_range(consumer, chunk, KEYED, limit, settings, {}))
    finally:
        consumer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=60_000, help="records per produce configuration")
    parser.add_argument("--partitions", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--producers", type=int, default=4)
    parser.add_argument("--sizes", type=int, nargs="+", default=[20_000, 60_000, 150_000, 300_000])
    parser.add_argument("--waits", type=int, nargs="+", default=[10, 500, 5000])
    parser.add_argument("--large", type=int, default=10_000)
    parser.add_argument("--limit", type=float, default=10.0)
    parser.add_argument("--step-events", type=int, default=1_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", choices=["produce", "read", "step"], help="run one part only")
    args = parser.parse_args()
    with LocalBroker() as broker:
        if args.only in (None, "produce"):
            produce_rates(broker.bootstrap, args.records, args.partitions, args.producers)
        if args.only in (None, "read"):
            read_rates(broker.bootstrap, args.sizes, args.waits, args.large, args.limit, args.producers)
        if args.only in (None, "step"):
            step_reads(broker.bootstrap, args.partitions, args.step_events, args.rounds, args.limit)


if __name__ == "__main__":
    main()
