"""KafkaClient and the local broker, against a real Apache Kafka broker."""

import contextlib
import itertools
import os
import re
import signal
import socket
import threading
import time

import pytest

from circuits.daemon import free_port
from sensors.broker import (
    LocalBroker,
    ensure_local_broker,
    ensure_topics,
    stop_local_broker,
)
from sensors.errors import BrokerStalledError, BrokerUnavailableError, SourceError, TopicNotFoundError
from sensors.kafka import KafkaClient


def test_offsets_count_the_records_of_each_partition(client, new_topic):
    topic = new_topic(3)
    for partition, n in enumerate([5, 0, 12]):
        assert client.produce(topic, (b"%d" % i for i in range(n)), partition=partition) == n
    assert client.offsets([topic]) == {(topic, 0): (0, 5), (topic, 1): (0, 0), (topic, 2): (0, 12)}


def test_produce_without_a_partition_spreads_records(client, new_topic):
    topic = new_topic(2)
    client.produce(topic, [b"%d" % i for i in range(20)])
    assert sum(high for _low, high in client.offsets([topic]).values()) == 20


@pytest.mark.slow
def test_a_produce_outlasting_the_timeout_succeeds_while_acknowledgements_progress(broker, new_topic):
    topic = new_topic(2)
    client = KafkaClient(broker.bootstrap, timeout=1)
    records = 400_000  # several seconds: longer than the limit, which bounds a pause
    assert client.produce(topic, (b"%d" % i for i in range(records))) == records
    assert sum(high for _low, high in client.offsets([topic]).values()) == records


@pytest.mark.slow
def test_a_produce_that_stops_progressing_reports_what_was_acknowledged():
    RECORDS = 2_000_000
    with LocalBroker() as local:
        ensure_topics(local.bootstrap, {"t": 1}, timeout=5)
        client = KafkaClient(local.bootstrap, timeout=2)
        watcher = KafkaClient(local.bootstrap, timeout=5)

        def freeze_once_acknowledging() -> None:
            # Past the first batches (whose answers have left the broker), well before the last.
            while watcher.offsets(["t"])[("t", 0)][1] < RECORDS // 5:
                time.sleep(0.01)
            os.kill(local.process.pid, signal.SIGSTOP)  # a broker that hangs mid-produce

        threading.Thread(target=freeze_once_acknowledging).start()
        try:
            with pytest.raises(BrokerStalledError) as stalled:
                client.produce("t", itertools.repeat(b"x", RECORDS))
        finally:
            os.kill(local.process.pid, signal.SIGCONT)
    match = re.search(
        r"acknowledged (\d+) of \d+ records to topic 't' in [\d.]+ s, then nothing for 2 s", str(stalled.value)
    )
    assert match and 0 < int(match[1]) < RECORDS, str(stalled.value)


def test_a_missing_topic_is_named_and_not_created(client, new_topic):
    topic = new_topic(1)
    with pytest.raises(TopicNotFoundError, match=r"'no-such-topic' do not exist.*create them"):
        client.offsets([topic, "no-such-topic"])
    with pytest.raises(TopicNotFoundError, match="'no-such-topic'"):
        client.produce("no-such-topic", [b"x"])
    assert "no-such-topic" not in client.topics()


def test_ensure_topics_creates_missing_topics_and_keeps_existing_ones(broker, client, new_topic):
    existing = new_topic(2)
    created = f"{existing}-new"
    ensure_topics(broker.bootstrap, {existing: 5, created: 3}, timeout=5)
    assert client.partitions([existing, created]) == {existing: 2, created: 3}


def test_a_stopped_broker_is_reported_within_the_timeout():
    with LocalBroker() as down:
        ensure_topics(down.bootstrap, {"t": 1}, timeout=5)
    client = KafkaClient(down.bootstrap, timeout=1)
    started = time.monotonic()
    with pytest.raises(
        BrokerUnavailableError, match=rf"'{down.bootstrap}' answered within 1 s.*bootstrap servers setting"
    ):
        client.offsets(["t"])
    assert time.monotonic() - started < 3


def test_a_local_broker_refuses_a_port_in_use(broker):
    with pytest.raises(SourceError, match=f"port {broker.port} is in use"):
        LocalBroker(port=broker.port)


def test_ensure_local_broker_starts_one_detached_broker_and_reuses_it(tmp_path):
    port = free_port()
    try:
        bootstrap = ensure_local_broker(port, str(tmp_path))
        pid = (tmp_path / f"kafka-{port}.pid").read_text()
        ensure_topics(bootstrap, {"kept": 1}, timeout=5)
        assert ensure_local_broker(port, str(tmp_path)) == bootstrap
        assert (tmp_path / f"kafka-{port}.pid").read_text() == pid
        assert "kept" in KafkaClient(bootstrap, timeout=2).topics()  # the same broker, not a new one
    finally:
        assert stop_local_broker(port, str(tmp_path))
    assert not stop_local_broker(port, str(tmp_path))


def test_an_embedded_broker_whose_controller_port_is_taken_takes_another_and_keeps_it(tmp_path):
    port = free_port()
    other = socket.socket()  # on port + 1: another process's
    with contextlib.suppress(OSError):  # taken already: the same case
        other.bind(("127.0.0.1", port + 1))
        other.listen()
    try:
        bootstrap = ensure_local_broker(port, str(tmp_path))
        ensure_topics(bootstrap, {"kept": 1}, timeout=5)
        KafkaClient(bootstrap).produce("kept", [b"a"])
    finally:
        other.close()
        assert stop_local_broker(port, str(tmp_path))
    # Started again with port + 1 free: the controller stays where its formatted data has it.
    try:
        assert KafkaClient(ensure_local_broker(port, str(tmp_path))).offsets(["kept"]) == {("kept", 0): (0, 1)}
    finally:
        assert stop_local_broker(port, str(tmp_path))


def test_a_broker_that_could_not_bind_says_which_address_was_taken(tmp_path):
    from sensors.broker import _exit_cause

    log = tmp_path / "kafka.log"
    log.write_text(
        "ERROR ...\nCaused by: KafkaException: Socket server failed to bind to 127.0.0.1:5: Address already in use.\n"
    )
    assert _exit_cause(str(log)) == ": 127.0.0.1:5 is in use by another process (stop it, or choose another port)"
    log.write_text("ERROR something else\n")
    assert _exit_cause(str(log)) == ""


def test_a_produce_with_the_broker_down_names_the_bootstrap_servers_and_what_was_seen():
    bootstrap = f"127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(BrokerUnavailableError, match=rf"bootstrap servers '{bootstrap}' answered within 1 s \(.+\)"):
        KafkaClient(bootstrap, timeout=1).produce("t", [b"x"])


def test_a_restarted_broker_keeps_its_topics_and_records(tmp_path):
    with LocalBroker(state_dir=str(tmp_path)) as local:
        ensure_topics(local.bootstrap, {"kept": 1}, timeout=5)
        KafkaClient(local.bootstrap).produce("kept", [b"a", b"b", b"c"])
        local.stop()
        local.start()
        assert KafkaClient(local.bootstrap).offsets(["kept"]) == {("kept", 0): (0, 3)}


def test_a_new_cluster_id_never_starts_with_a_dash(monkeypatch):
    import uuid

    from sensors import broker

    # A UUID whose first byte is 0xf8 encodes to "-..." in URL-safe base64, which Kafka's
    # format tool would take for an option: one broker start in 64 failed so.
    drawn = iter([uuid.UUID(bytes=b"\xf8" + bytes(15)), uuid.UUID(bytes=b"\x01" + bytes(15))])
    monkeypatch.setattr(broker.uuid, "uuid4", lambda: next(drawn))
    assert broker._cluster_id() == "AQAAAAAAAAAAAAAAAAAAAA"
