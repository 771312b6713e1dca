"""read_ranges against the real broker and the shared Spark session."""

import json
import time
from contextlib import contextmanager

import pytest
from pyspark.sql import functions as F
from pyspark.sql import types as T

from circuits.daemon import free_port
from circuits.library.nexmark import SCHEMAS
from circuits.library.nexmark_queries import revenue_circuit
from circuits.zset import parse_schema, with_weight_schema
from sensors.broker import LocalBroker, ensure_topics
from sensors.decode import Decoded, read_ranges, undelivered
from sensors.errors import BrokerStalledError, BrokerUnavailableError, OffsetsLostError, SourceError
from sensors.ingest import KafkaSource
from sensors.kafka import KafkaClient
from storage.faults import InjectedCrash
from storage.logs import DEAD_LETTER_SCHEMA, Range
from storage.pipeline import Pipeline
from storage.tables import open_table

BIDS = SCHEMAS["bids"]
NOT_UTF8 = "undecodable value: not UTF-8 JSON ('utf-8' codec can't decode byte 0xff in position 0: invalid start byte)"


def bid(i: int, **extra) -> bytes:
    return json.dumps(
        {"auction": i, "bidder": 7, "price": 10 * i, "channel": f"c{i}", "date_time": 1000 + i, **extra}
    ).encode()


def rows(df) -> set[tuple]:
    return {tuple(r) for r in df.collect()}


@pytest.fixture(params=["engine", "spark"])
def reader(request, monkeypatch):
    """Each way a step reads: the engine's consumers, and (every read counting as large)
    Spark's Kafka source with the JVM decoder."""
    if request.param == "spark":
        monkeypatch.setattr("sensors.decode.LARGE_READ", 0)
    return request.param


@contextmanager
def read_whole(spark, *args, **kwargs):
    """:func:`read_ranges`' result with its rest folded in, as a step writes both: a large
    read's first job (over its inputs) runs here, then the second, where the JVM left
    records to Python."""
    decoded = read_ranges(spark, *args, **kwargs)
    try:
        more = None
        if decoded.rest is not None:
            for df in decoded.inputs.values():
                df.write.format("noop").mode("overwrite").save()
            more = decoded.rest()
        if more is None:
            more = Decoded({}, spark.createDataFrame([], DEAD_LETTER_SCHEMA), None, [])
        yield Decoded(
            {t: df.unionByName(more.inputs[t]) if t in more.inputs else df for t, df in decoded.inputs.items()},
            *[
                mine if theirs is None else theirs if mine is None else mine.unionByName(theirs)
                for mine, theirs in ((decoded.dead_letters, more.dead_letters), (decoded.taken, more.taken))
            ],
            decoded.cached,
        )
    finally:
        decoded.unpersist()


def test_exactly_the_ranges_are_read_typed_and_weighted(spark, broker, client, new_topic):
    topic = new_topic(2)
    client.produce(topic, [bid(i) for i in range(6)], partition=0)
    client.produce(topic, [bid(100), bid(101, _weight=-1), bid(102, _weight=3), bid(103)], partition=1)
    ranges = [Range(topic, 0, 1, 5), Range(topic, 1, 0, 3)]

    decoded = read_ranges(spark, broker.bootstrap, None, ranges, {topic: BIDS}, chunk_size=3)
    try:
        tasks = decoded.cached[0].select(F.spark_partition_id().alias("task"), "partition").distinct().collect()
        assert len({t.task for t in tasks}) == 3  # [1, 4) and [4, 5) of partition 0, [0, 3) of partition 1
        bids = decoded.inputs[topic]
        assert bids.dtypes == [
            (f.name, f.dataType.simpleString()) for f in with_weight_schema(parse_schema(BIDS)).fields
        ]
        expected = {(i, 7, 10 * i, f"c{i}", 1000 + i, 1) for i in range(1, 5)}
        expected |= {(100, 7, 1000, "c100", 1100, 1), (101, 7, 1010, "c101", 1101, -1), (102, 7, 1020, "c102", 1102, 3)}
        assert rows(bids) == expected
        assert decoded.dead_letters.count() == 0
    finally:
        decoded.unpersist()


def test_a_small_steps_ranges_share_one_task_each_read_by_a_consumer_of_its_own(spark, broker, client, new_topic):
    topics = [new_topic(2), new_topic(2)]
    for topic in topics:
        for partition in (0, 1):
            client.produce(topic, [bid(i) for i in range(3)], partition=partition)
    ranges = [Range(topic, partition, 0, 3) for topic in topics for partition in (0, 1)]
    # A broker holds a fetch this long when it has nothing more to send (past a range's end):
    # a consumer assigned to the next range would wait it out.
    config = {"fetch.wait.max.ms": "60000"}
    for _ in range(2):  # the second read is timed: the first starts the server's Python workers
        started = time.monotonic()
        decoded = read_ranges(spark, broker.bootstrap, config, ranges, {topic: BIDS for topic in topics})
        try:
            assert decoded.cached[0].select(F.spark_partition_id()).distinct().count() == 1
            assert [decoded.inputs[topic].count() for topic in topics] == [6, 6]
        finally:
            decoded.unpersist()
    assert time.monotonic() - started < 60


def test_malformed_records_become_dead_letters_and_no_valid_record_is_lost(reader, spark, broker, client, new_topic):
    topic, other = new_topic(1), new_topic(1)
    values = [
        bid(0),
        b"not json",
        bid(2),
        json.dumps({"auction": 3, "bidder": 7, "price": "30", "channel": "c", "date_time": 1}).encode(),
        json.dumps({"auction": 4, "bidder": 7, "channel": "c", "date_time": 1}).encode(),
        b"\xff\xfe\x00",
        bid(6, _weight=-1),
    ]
    client.produce(topic, values, partition=0)
    client.produce(other, [json.dumps({"word": "a", "n": 1}).encode(), json.dumps({"word": 1, "n": 1}).encode()])
    schemas = {
        topic: BIDS,
        other: T.StructType([T.StructField("word", T.StringType()), T.StructField("n", T.IntegerType())]),
    }

    with read_whole(spark, broker.bootstrap, None, [Range(topic, 0, 0, 7), Range(other, 0, 0, 2)], schemas) as decoded:
        assert rows(decoded.inputs[topic].select("auction", "_weight")) == {(0, 1), (2, 1), (6, -1)}
        assert rows(decoded.inputs[other]) == {("a", 1, 1)}
        assert decoded.dead_letters.columns == ["topic", "partition", "offset", "reason", "value"]
        assert rows(decoded.dead_letters.drop("value")) == {
            (topic, 0, 1, "undecodable value: not UTF-8 JSON (Expecting value: line 1 column 1 (char 0))"),
            (topic, 0, 3, "wrong schema: field 'price' expected bigint, got str"),
            (topic, 0, 4, "wrong schema: missing field 'price'"),
            (topic, 0, 5, NOT_UTF8),
            (other, 0, 1, "wrong schema: field 'word' expected string, got int"),
        }
        values_by_offset = {r.offset: r.value for r in decoded.dead_letters.where(f"topic = '{topic}'").collect()}
        assert values_by_offset[1] == "not json"
        assert values_by_offset[5] == "\\xff\\xfe\x00"


@pytest.mark.slow
def test_records_are_consumed_once(spark):
    with LocalBroker() as local:
        ensure_topics(local.bootstrap, {"once": 1}, timeout=5)
        KafkaClient(local.bootstrap).produce("once", [bid(1), b"bad"])
        decoded = read_ranges(spark, local.bootstrap, None, [Range("once", 0, 0, 2)], {"once": BIDS}, timeout=2)
        assert decoded.inputs["once"].count() == 1  # the first job reads the broker
    # The broker and its records are gone: the other derived DataFrames read the cached records.
    assert decoded.dead_letters.count() == 1
    decoded.unpersist()


def test_offsets_the_broker_no_longer_has_are_an_error_and_leave_the_step_unpersisted(
    reader, spark, broker, client, new_topic, tmp_path
):
    topic = new_topic(1)
    client.produce(topic, [bid(i) for i in range(3)], partition=0)
    pipeline = Pipeline(spark, str(tmp_path), revenue_circuit())
    ranges = [Range(topic, 0, 1, 5)]
    pipeline.divisions.record(0, ranges)
    source = KafkaSource(
        broker.bootstrap, {"bids": topic, "auctions": new_topic(1), "persons": new_topic(1)}, read_timeout=1
    )
    with pytest.raises(
        OffsetsLostError,
        match=rf"topic '{topic}' partition 0: offsets 3 to 4: the broker at '{broker.bootstrap}' ends at offset 3, below the end 5 the division recorded",
    ):
        pipeline.ingest(0, source.read)
    assert not pipeline.inputs.persisted(0)
    tables = [open_table(pipeline.inputs.uri(h)) for h in pipeline.circuit.inputs]
    assert all(t is None or t.version() == 0 for t in tables)  # never committed to
    # Once the offsets exist, the same division is ingested whole; nothing of the failed read remains.
    client.produce(topic, [bid(3), bid(4)], partition=0)
    pipeline.ingest(0, source.read)
    assert pipeline.inputs.persisted(0)
    persisted = pipeline.inputs.read(0)
    assert persisted.deltas["bids"].select("auction").count() == 4


LARGE = 60_000
"""Records of a partition larger than one fetch of the reader."""


@pytest.fixture(scope="module")
def large_partition(broker) -> str:
    """A topic of one partition holding ``bid(i)`` for each ``i < LARGE``, once each."""
    topic = "large-partition"
    ensure_topics(broker.bootstrap, {topic: 1}, timeout=5)
    KafkaClient(broker.bootstrap, timeout=10).produce(topic, (bid(i) for i in range(LARGE)))
    return topic


@pytest.mark.slow
def test_a_step_of_10000_records_is_read_from_a_large_partition_within_seconds(spark, broker, large_partition):
    # A demo step of 20,000 events holds about 10,000 bids per topic partition.
    ranges = [Range(large_partition, 0, LARGE - 10_000, LARGE)]
    decoded = read_ranges(spark, broker.bootstrap, None, ranges, {large_partition: BIDS}, timeout=5)
    try:
        auctions = decoded.inputs[large_partition].agg(F.count("*"), F.count_distinct("auction")).first()
        assert tuple(auctions) == (10_000, 10_000)
        assert decoded.dead_letters.count() == 0
    finally:
        decoded.unpersist()


def test_an_undelivered_range_is_reported_by_what_the_broker_says_after():
    chunk = ("t", 1, 100, 200)
    seen = {
        "no answer": (
            undelivered(chunk, 150, "Local: Timed out", 2, "h:1"),
            BrokerUnavailableError,
            "no Kafka broker at bootstrap servers 'h:1' answered within 2 s (topic 't' partition 1: offsets 150 to 199 not delivered: Local: Timed out)",
        ),
        "below the log start": (
            undelivered(chunk, 150, (170, 300), 2, "h:1"),
            OffsetsLostError,
            "topic 't' partition 1: offsets 150 to 199 are below the log start 170 of the broker at 'h:1': they were deleted",
        ),
        "above the end": (
            undelivered(chunk, 150, (0, 160), 2, "h:1"),
            OffsetsLostError,
            "topic 't' partition 1: offsets 150 to 199: the broker at 'h:1' ends at offset 160, below the end 200",
        ),
        "held, not delivered": (
            undelivered(chunk, 150, (0, 300), 2, "h:1"),
            BrokerStalledError,
            "topic 't' partition 1: offsets 150 to 199: the broker at 'h:1' answered (it holds offsets 0 to 299) "
            "but delivered nothing for 2 s after 50 of the range's 100 records",
        ),
    }
    for case, (error, kind, text) in seen.items():
        assert type(error) is kind and str(error).startswith(text), case
    # Only offsets below the log start are gone for good.
    assert [case for case, (error, _, _) in seen.items() if "cannot be recovered" in str(error)] == [
        "below the log start"
    ]


def test_a_topic_without_a_schema_or_a_bad_config_is_refused_before_reading(spark, broker):
    with pytest.raises(SourceError, match="no schema for topic.*'bids'"):
        read_ranges(spark, broker.bootstrap, None, [Range("bids", 0, 0, 1)], {"persons": SCHEMAS["persons"]})
    with pytest.raises(SourceError, match="config is invalid: No such configuration property"):
        read_ranges(spark, broker.bootstrap, {"no.such.setting": "1"}, [Range("bids", 0, 0, 1)], {"bids": BIDS})


def test_every_supported_type_is_parsed_as_declared(reader, spark, broker, client, new_topic):
    topic = new_topic(1)
    schema = "t tinyint, s smallint, i int, l bigint, d double, f float, b boolean, name string"
    client.produce(
        topic,
        [
            b'{"t": -128, "s": 300, "i": 70000, "l": 9223372036854775807, "d": 2, "f": 0.5, "b": true, "name": "x"}',
            b'{"t": null, "s": null, "i": null, "l": null, "d": null, "f": null, "b": null, "name": null, "_weight": -2}',
        ],
    )
    with read_whole(spark, broker.bootstrap, None, [Range(topic, 0, 0, 2)], {topic: schema}) as decoded:
        z = decoded.inputs[topic]
        assert z.dtypes == [
            (f.name, f.dataType.simpleString()) for f in with_weight_schema(parse_schema(schema)).fields
        ]
        assert rows(z) == {(-128, 300, 70000, 9223372036854775807, 2.0, 0.5, True, "x", 1), (None,) * 8 + (-2,)}


def test_gateway_messages_are_framed_into_records_and_resent_bytes_dropped(reader, spark, broker, client, new_topic):
    topic = new_topic(1)

    def message(source: str, start: int, value: bytes, partial: bool = False):
        headers = [("dbsp-bytes", f"{start}-{start + len(value)}".encode())] + (
            [("dbsp-partial", b"1")] if partial else []
        )
        return value, source.encode(), headers

    first = bid(0) + b"\n\n" + bid(1) + b"\r\n"
    sent = [
        message("s1", 0, first),
        message("s2", 0, b"not json\n" + bid(2) + b"\n"),
        message("s1", 0, first),  # re-sent by a gateway restarted from an older cursor
        message("s2", 0, b"not json\n" + bid(2) + b"\n" + bid(3) + b"\n"),  # overlaps: only bid 3 is new
        message("s1", len(first), b'{"auction": 3, "bid', partial=True),
        (bid(9), None, None),  # a record produced directly: one message, one record
    ]
    client.produce(
        topic, [v for v, _, _ in sent], partition=0, keys=[k for _, k, _ in sent], headers=[h for _, _, h in sent]
    )
    with read_whole(spark, broker.bootstrap, None, [Range(topic, 0, 0, len(sent))], {topic: BIDS}) as decoded:
        assert {r[0] for r in rows(decoded.inputs[topic].select("auction"))} == {0, 1, 2, 3, 9}
        assert decoded.inputs[topic].count() == 5
        letters = sorted(rows(decoded.dead_letters.select("offset", "reason")))
        assert letters[0][0] == 1 and letters[0][1].startswith(
            "source 's2' bytes 0-8: undecodable value: not UTF-8 JSON"
        )
        assert letters[1][0] == 4 and "raise gateway.buffer_size" in letters[1][1]
        assert len(letters) == 2


def gateway_message(source: str, start: int, value: bytes):
    return value, source.encode(), [("dbsp-bytes", f"{start}-{start + len(value)}".encode())]


def resent_across_tasks(topic: str) -> list[tuple]:
    """Source s1's bids 0, 1, then both again (a gateway restarted from an older cursor), then bid 2."""
    zero, one = bid(0) + b"\n", bid(1) + b"\n"
    return [
        gateway_message("s1", 0, zero),
        gateway_message("s1", len(zero), one),
        gateway_message("s1", 0, zero + one),
        gateway_message("s1", len(zero + one), bid(2) + b"\n"),
    ]


def test_bytes_taken_by_another_task_or_an_earlier_step_are_dropped(spark, broker, client, new_topic):
    topic = new_topic(1)
    sent = resent_across_tasks(topic)
    client.produce(
        topic, [v for v, _, _ in sent], partition=0, keys=[k for _, k, _ in sent], headers=[h for _, _, h in sent]
    )
    ranges = [Range(topic, 0, 0, len(sent))]
    decoded = read_ranges(spark, broker.bootstrap, None, ranges, {topic: BIDS}, chunk_size=2)  # two tasks
    try:
        assert sorted(r.auction for r in decoded.inputs[topic].collect()) == [0, 1, 2]
        ends: dict[tuple[str, str], int] = {}
        for r in decoded.taken.collect():  # a row per task: the largest end counts
            ends[r.topic, r.source] = max(ends.get((r.topic, r.source), 0), r.end)
        assert ends == {(topic, "s1"): len(bid(0) + bid(1) + bid(2)) + 3}
    finally:
        decoded.unpersist()
    # An earlier step took bids 0 and 1: only bid 2 is new.
    decoded = read_ranges(
        spark, broker.bootstrap, None, ranges, {topic: BIDS}, taken={(topic, "s1"): len(bid(0) + bid(1)) + 2}
    )
    try:
        assert [r.auction for r in decoded.inputs[topic].collect()] == [2]
    finally:
        decoded.unpersist()


def test_a_step_drops_the_bytes_earlier_steps_took_and_reads_again_the_same(
    reader, spark, broker, client, new_topic, tmp_path, monkeypatch
):
    topic = new_topic(1)
    sent = resent_across_tasks(topic)
    client.produce(
        topic, [v for v, _, _ in sent], partition=0, keys=[k for _, k, _ in sent], headers=[h for _, _, h in sent]
    )
    pipeline = Pipeline(spark, str(tmp_path), revenue_circuit())
    source = KafkaSource(broker.bootstrap, {"bids": topic, "auctions": new_topic(1), "persons": new_topic(1)})
    pipeline.divisions.record(0, [Range(topic, 0, 0, 2)])
    pipeline.divisions.record(1, [Range(topic, 0, 2, 4)])
    pipeline.ingest(0, source.read)
    # Step 1 dies after it kept what it took, before its inputs: read again, it drops the same.
    monkeypatch.setenv("DBSP_FAULT", "after_taken:1")
    monkeypatch.setenv("DBSP_FAULT_MODE", "raise")
    with pytest.raises(InjectedCrash):
        pipeline.ingest(1, source.read)
    assert not pipeline.inputs.persisted(1)
    monkeypatch.delenv("DBSP_FAULT")
    pipeline.ingest(1, source.read)
    auctions = lambda step: sorted(r.auction for r in pipeline.inputs.read(step).deltas["bids"].collect())
    assert (auctions(0), auctions(1)) == ([0, 1], [2])
    assert pipeline.inputs.taken_before(1) == {(topic, "s1"): len(bid(0) + bid(1)) + 2}
    assert pipeline.inputs.taken_before(2) == {(topic, "s1"): len(bid(0) + bid(1) + bid(2)) + 3}


def test_records_of_an_aborted_transaction_never_enter_a_step(reader, spark, broker, new_topic):
    from confluent_kafka import Producer

    topic = new_topic(1)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": f"tx-{topic}"})
    producer.init_transactions(10)
    for ids, finish in (([1, 2], producer.abort_transaction), ([3, 4], producer.commit_transaction)):
        producer.begin_transaction()
        for i in ids:
            producer.produce(topic, bid(i))
        producer.flush(10)
        finish(10)
    (_low, high), *_ = KafkaClient(broker.bootstrap).offsets([topic]).values()
    assert high > 4  # the aborted records and both transactions' markers take offsets too
    with read_whole(spark, broker.bootstrap, None, [Range(topic, 0, 0, high)], {topic: BIDS}, timeout=5) as decoded:
        assert {r.auction for r in decoded.inputs[topic].collect()} == {3, 4}
        assert decoded.dead_letters.count() == 0


@pytest.mark.slow
def test_a_broker_killed_mid_produce_keeps_every_acknowledged_record_and_the_next_step_reads_it(spark, tmp_path):
    import threading

    from confluent_kafka import Producer

    with LocalBroker(state_dir=str(tmp_path / "kafka")) as local:
        ensure_topics(local.bootstrap, {"t": 2}, timeout=5)
        acknowledged: list[int] = []
        producer = Producer({"bootstrap.servers": local.bootstrap, "acks": "all", "linger.ms": 5})
        on_delivery = lambda error, message: error or acknowledged.append(json.loads(message.value())["auction"])
        killer = threading.Timer(0.5, local.kill)
        killer.start()
        for i in range(2_000_000):
            if local.process.poll() is not None:
                break
            while True:
                try:
                    producer.produce("t", bid(i), on_delivery=on_delivery)
                    break
                except BufferError:
                    producer.poll(0.05)
            producer.poll(0)
        producer.poll(1)
        killer.join()
        assert acknowledged, "nothing was acknowledged before the kill"
        local.start()
        producer.flush(30)  # whatever it still held goes to the restarted broker
        offsets = KafkaClient(local.bootstrap).offsets(["t"])
        ranges = [Range("t", p, low, high) for (_, p), (low, high) in offsets.items()]
        decoded = read_ranges(spark, local.bootstrap, None, ranges, {"t": BIDS}, timeout=10)
        try:
            read = [r.auction for r in decoded.inputs["t"].select("auction").collect()]
        finally:
            decoded.unpersist()
    assert set(acknowledged) <= set(read)
    assert len(read) == sum(high - low for low, high in offsets.values())


def test_a_read_with_the_broker_down_names_the_bootstrap_servers_and_what_was_seen(reader, spark):
    bootstrap = f"127.0.0.1:{free_port()}"  # nothing listens there
    try:
        # Spark's Kafka source asks the broker for the offsets when the read is planned.
        decoded = read_ranges(spark, bootstrap, None, [Range("t", 0, 0, 5)], {"t": BIDS}, timeout=2)
    except SourceError as planned:
        error = planned
    else:
        try:
            with pytest.raises(Exception) as failed:
                decoded.inputs["t"].count()
        finally:
            decoded.unpersist()
        error = decoded.failed(failed.value)
    assert isinstance(error, BrokerUnavailableError), error
    assert f"bootstrap servers '{bootstrap}'" in str(error) and "offsets 0 to 4 not delivered" in str(error)
