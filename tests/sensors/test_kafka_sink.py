"""The Kafka-topic sink publishes each message once, even after a crash between publishing
and recording its tokens (with no broker transactions), and every
message of a fan-out."""

import json
import random
from collections import defaultdict

import pytest
from confluent_kafka import Consumer, TopicPartition

from circuits.framing import consumer_config
from circuits.klogs import deploy
from sensors.sinks import TOKEN_HEADER, KafkaSink
from storage.faults import InjectedCrash
from storage.sinks import Message, StaleEpochError, TokenStore
from tests.storage.test_klogs_pipeline import counted_words, run_docs, word_counts


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


@pytest.mark.slow
def test_a_crash_after_publishing_publishes_nothing_twice(broker, new_topic, tmp_path, monkeypatch):
    topic, tokens = new_topic(1), TokenStore(str(tmp_path))
    sink = KafkaSink(broker.bootstrap, topic, {}, timeout=5)
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


def random_docs(seed: int, steps: int, per_step: int) -> list[list[tuple[str, str]]]:
    """Seeded random texts of 0-6 words from a small vocabulary (so words repeat within a text)."""
    rng = random.Random(seed)
    docs = iter(range(steps * per_step))
    return [
        [(f"doc{next(docs)}", " ".join(rng.choices("abcde", k=rng.randint(0, 6)))) for _ in range(per_step)]
        for _ in range(steps)
    ]


@pytest.mark.slow
@pytest.mark.parametrize("crash", [None, "sink_after_publish"])
def test_a_fan_out_reaches_the_topic_whole(spark, broker, new_topic, tmp_path, monkeypatch, crash):
    """Word counts of "a a b" and of seeded random texts, through a Kafka sink: per word, the
    topic holds what a sequential run emits, each once, even after a crash between publishing
    and recording the tokens."""
    topic = new_topic(1)
    steps = [[("doc", "a a b")], *random_docs(seed=32, steps=2, per_step=12)]
    sink = KafkaSink(broker.bootstrap, topic, {}, timeout=5)
    circuit = deploy(lambda: word_counts(sink), "word_counts_kafka", vnodes=4)
    run_docs(spark, str(tmp_path / "pipeline"), circuit, steps, monkeypatch, crash)
    expected = counted_words(steps)
    got = defaultdict(list)
    found = records(broker.bootstrap, topic, sum(map(len, expected.values())))
    for key, n, _ in found:
        got[json.loads(key)].append(n)
    assert got == expected
    assert len({token for _, _, token in found}) == len(found)
