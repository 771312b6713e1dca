"""The Kafka-topic sink publishes each message once, even after a crash between publishing
and recording its tokens (the bundled broker has no finished transactions)."""

import json

import pytest
from confluent_kafka import Consumer, TopicPartition

from sensors.broker import local_producer_config
from sensors.kafka import consumer_config
from sensors.sinks import TOKEN_HEADER, KafkaSink
from storage.faults import InjectedCrash
from storage.sinks import Message, StaleEpochError, TokenStore


def records(bootstrap: str, topic: str, count: int) -> list[tuple]:
    consumer = Consumer(consumer_config(bootstrap))
    consumer.assign([TopicPartition(topic, 0, 0)])
    found = []
    try:
        while len(found) < count:
            batch = consumer.consume(count, 5)
            assert batch, f"only {len(found)} of {count} records"
            found += [(r.key(), json.loads(r.value()), dict(r.headers())[TOKEN_HEADER]) for r in batch]
        assert not consumer.consume(10, 1)  # and no more
    finally:
        consumer.close()
    return found


def test_a_crash_after_publishing_publishes_nothing_twice(broker, new_topic, tmp_path, monkeypatch):
    topic, tokens = new_topic(1), TokenStore(str(tmp_path))
    sink = KafkaSink(broker.bootstrap, topic, local_producer_config(), timeout=5)
    step0 = [Message('"f"', "0.0.0.0", "f", 1), Message('"m"', "0.1.0.0", "m", 3)]
    monkeypatch.setenv("DBSP_FAULT", "sink_after_publish:0")
    monkeypatch.setenv("DBSP_FAULT_MODE", "raise")
    with pytest.raises(InjectedCrash):
        sink.publish("sink_3", 0, 1, step0, tokens)
    monkeypatch.delenv("DBSP_FAULT")
    sink.publish("sink_3", 0, 2, step0, tokens)  # the replay finds both in the topic
    sink.publish("sink_3", 1, 2, [Message('"f"', "1.0.0.0", "f", 5)], tokens)
    sink.publish("sink_3", 1, 2, [Message('"f"', "1.0.0.0", "f", 5)], tokens)  # its tokens are recorded
    assert [(k, v) for k, v, _ in records(broker.bootstrap, topic, 3)] == [(b'"f"', 1), (b'"m"', 3), (b'"f"', 5)]
    with pytest.raises(StaleEpochError):
        sink.publish("sink_3", 2, 1, [Message('"m"', "0.1.1.0", "m", 7)], tokens)
