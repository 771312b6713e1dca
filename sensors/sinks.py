"""A KLogs sink that publishes to a Kafka topic, each message once (see :mod:`storage.sinks`).

Each record carries its idempotency token in the header ``dbsp-token``.  Exactly once rests
on Delta, not on the broker's transactions (a sink's consumers need not read committed), so
before a step's first attempt the sink records where the topic ended; a later attempt of the same
step (after a crash before the checkpoint) reads the topic from there and publishes only
the messages whose tokens it does not find.
"""

from __future__ import annotations

import json

from confluent_kafka import Consumer, TopicPartition

from circuits.framing import consumer_config
from storage.faults import failpoint
from storage.sinks import Message, TokenStore

from .errors import SourceError
from .kafka import KafkaClient

TOKEN_HEADER = "dbsp-token"


def token_of(stage: str, step: int, message: Message) -> bytes:
    return json.dumps([stage, step, message.key_text, message.offset]).encode()


class KafkaSink:
    """Publishes each message to ``topic``: key and value as JSON text, token in a header."""

    def __init__(self, bootstrap_servers: str, topic: str, config: dict | None = None, timeout: float = 10.0) -> None:
        self.client = KafkaClient(bootstrap_servers, config, timeout)
        self.topic = topic
        self.config = config
        self.timeout = timeout

    def publish(self, stage: str, step: int, epoch: int, messages: list[Message], tokens: TokenStore) -> None:
        done = tokens.begin(stage, step, epoch)
        todo = [m for m in messages if (m.key_text, m.offset) not in done]
        if not todo:
            return
        ends = lambda: json.dumps([[p, high] for (_, p), (_, high) in self.client.offsets([self.topic]).items()])
        start = tokens.intent(stage, step, epoch, ends)
        published = set() if start is None else self._tokens_since(json.loads(start))  # by a crashed attempt
        pending = [m for m in todo if token_of(stage, step, m) not in published]
        self.client.produce(
            self.topic,
            [json.dumps(m.value).encode() for m in pending],
            keys=[m.key_text.encode() for m in pending],
            headers=[[(TOKEN_HEADER, token_of(stage, step, m))] for m in pending],
        )
        failpoint("sink_after_publish", step)
        tokens.record(stage, step, epoch, todo)

    def _tokens_since(self, start: list[list[int]]) -> set[bytes]:
        """The tokens of the records the topic got after ``start`` (partition, offset pairs)."""
        ends = {p: high for (_, p), (_, high) in self.client.offsets([self.topic]).items()}
        position = {p: offset for p, offset in start if offset < ends[p]}
        found: set[bytes] = set()
        if not position:
            return found
        consumer = Consumer(consumer_config(self.client.bootstrap_servers, self.config))
        try:
            consumer.assign([TopicPartition(self.topic, p, offset) for p, offset in position.items()])
            while any(position[p] < ends[p] for p in position):
                records = consumer.consume(100, self.timeout)
                if not records:
                    raise SourceError(
                        f"sink topic {self.topic!r}: records up to {ends} were not delivered within {self.timeout:g} s"
                    )
                for record in records:
                    if record.error() is None:
                        found.update(v for k, v in record.headers() or [] if k == TOKEN_HEADER)
                        position[record.partition()] = record.offset() + 1
        finally:
            consumer.close()
        return found


__all__ = ["TOKEN_HEADER", "KafkaSink"]
