"""A small Kafka client for the sensors: topics, partition counts, watermarks, and producing.

Every call has a timeout, and confluent_kafka's ``KafkaException`` is translated here into
:mod:`sensors.errors` that name the setting to fix.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from functools import cached_property, partial

from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

from circuits.framing import client_config, no_broker

from .errors import BrokerStalledError, BrokerUnavailableError, SourceError, TopicNotFoundError


def error_text(error: KafkaException) -> str:
    """The human-readable text of a confluent_kafka exception."""
    kafka_error = error.args[0] if error.args else None
    return kafka_error.str() if isinstance(kafka_error, KafkaError) else str(error)


def unreachable(bootstrap_servers: str, timeout: float, cause: str) -> BrokerUnavailableError:
    """The error for a broker that did not answer; names the setting to check."""
    return BrokerUnavailableError(no_broker(bootstrap_servers, timeout, cause))


_ELECTING = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_LEADER_EPOCH,
        KafkaError.FENCED_LEADER_EPOCH,
        # librdkafka's word for metadata naming no leader yet ("No leaders found"), seen
        # on a node just restarted.
        KafkaError._NOENT,
    }
)
"""What a broker answers for a partition while its leader is elected."""


def _electing(error: KafkaException) -> bool:
    """Whether the broker answered that a partition's leader is being elected (not a
    client-side failure to reach it)."""
    kafka_error = error.args[0] if error.args else None
    return isinstance(kafka_error, KafkaError) and kafka_error.code() in _ELECTING


class KafkaClient:
    """Metadata, watermarks and producing for one Kafka cluster."""

    def __init__(self, bootstrap_servers: str, config: dict[str, str] | None = None, timeout: float = 10.0) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.config = client_config(bootstrap_servers, config)
        self.timeout = timeout
        self._admin = AdminClient(self.config)

    @cached_property
    def _producer(self) -> Producer:
        return Producer(self.config)

    def _call(self, request: Callable):
        """``request()``, with a failure to reach the broker translated."""
        try:
            return request()
        except KafkaException as error:
            raise unreachable(self.bootstrap_servers, self.timeout, error_text(error)) from error

    def topics(self) -> dict[str, int]:
        """Every topic on the broker with its partition count."""
        # Never ask for named topics: a metadata request naming a missing topic makes a
        # broker with auto-creation create it.
        metadata = self._call(lambda: self._admin.list_topics(timeout=self.timeout))
        return {name: len(topic.partitions) for name, topic in metadata.topics.items()}

    def partitions(self, topics: Iterable[str]) -> dict[str, int]:
        """The partition count of each of ``topics``; a missing topic is an error naming it."""
        existing = self.topics()
        missing = [t for t in topics if t not in existing]
        if missing:
            raise TopicNotFoundError(
                f"topic(s) {', '.join(map(repr, missing))} do not exist on the broker at {self.bootstrap_servers!r}: "
                "create them (sensors.broker.ensure_topics does for the local broker) or correct the topic names"
            )
        return {t: existing[t] for t in topics}

    def offsets(self, topics: Iterable[str]) -> dict[tuple[str, int], tuple[int, int]]:
        """The (low, high) watermark of every partition of ``topics``, asked of the broker now."""
        parts = [TopicPartition(t, p) for t, n in self.partitions(topics).items() for p in range(n)]
        low = self._list_offsets(parts, OffsetSpec.earliest())
        high = self._list_offsets(parts, OffsetSpec.latest())
        return {key: (low[key], high[key]) for key in low}

    def _list_offsets(self, parts: list[TopicPartition], spec: OffsetSpec) -> dict[tuple[str, int], int]:
        """The offsets of ``parts``.  A partition whose leader the broker is still electing (a
        topic just created, a broker just started) is asked again until ``self.timeout``; one
        that never gets a leader is named with what the broker answered: it did answer."""
        found: dict[tuple[str, int], int] = {}
        deadline = time.monotonic() + self.timeout
        while parts:
            futures = self._admin.list_offsets({tp: spec for tp in parts}, request_timeout=self.timeout)
            waiting: dict[TopicPartition, KafkaException] = {}
            for tp, future in futures.items():
                try:
                    found[(tp.topic, tp.partition)] = future.result().offset
                except KafkaException as error:
                    if not _electing(error):
                        raise unreachable(self.bootstrap_servers, self.timeout, error_text(error)) from error
                    waiting[tp] = error
            if waiting and time.monotonic() > deadline:
                raise self._leaderless(waiting)
            parts = list(waiting)
            if parts:
                time.sleep(0.1)
        return found

    def _leaderless(self, waiting: dict[TopicPartition, KafkaException]) -> BrokerStalledError:
        tp, error = next(iter(waiting.items()))
        named = ", ".join(f"{t.topic}[{t.partition}]" for t in list(waiting)[:5])
        return BrokerStalledError(
            f"the broker at {self.bootstrap_servers!r} answered, but {len(waiting)} partition(s) ({named}) had no "
            f"leader for {self.timeout:g} s ({error_text(error)}): the cluster is electing leaders (a broker starting, "
            "stopping or overloaded) or a replica is down; check the brokers' logs, then retry"
        )

    def create_topics(self, topics: dict[str, int], replication_factor: int = 1) -> None:
        """Creates each topic with its partition count; a topic that exists already is left as it is."""
        if not topics:
            return
        futures = self._admin.create_topics(
            [NewTopic(t, num_partitions=n, replication_factor=replication_factor) for t, n in topics.items()],
            request_timeout=self.timeout,
        )
        for topic, future in futures.items():
            try:
                future.result()
            except KafkaException as error:
                if error.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise SourceError(
                        f"cannot create topic {topic!r} on {self.bootstrap_servers!r}: {error_text(error)}"
                    ) from error

    def produce(
        self,
        topic: str,
        values: Iterable[bytes],
        partition: int | None = None,
        keys: Iterable[bytes] | None = None,
        headers: Iterable[list[tuple[str, bytes]]] | None = None,
        timestamps: Iterable[int] | None = None,
    ) -> int:
        """Sends ``values`` to ``topic`` (to ``partition``, or as the producer partitions, by
        the record's key among ``keys`` when given; with its ``headers`` and its timestamp
        among ``timestamps``, milliseconds since the epoch, when given) and waits until the
        broker acknowledged every one; returns how many were sent."""
        self.partitions([topic])  # a missing topic is named, never created by the broker
        acks = _Acks()
        target = {} if partition is None else {"partition": partition}
        given = [
            (name, column)
            for name, column in (("key", keys), ("headers", headers), ("timestamp", timestamps))
            if column is not None
        ]
        names = [name for name, _ in given]
        produce = partial(self._producer.produce, topic, on_delivery=acks)
        sent = 0
        for value, *extra in zip(values, *(column for _, column in given)):
            kwargs = {**target, **dict(zip(names, extra))} if names else target
            try:
                produce(value, **kwargs)
            except BufferError:
                self._make_room(acks, topic, sent)
                produce(value, **kwargs)
            sent += 1
        self._await(acks, topic, sent, lambda: len(self._producer) == 0)
        if acks.failures:
            raise SourceError(
                f"{len(acks.failures)} of {sent} records to topic {topic!r} were refused: {acks.failures[0].str()}"
            )
        return sent

    def _make_room(self, acks: _Acks, topic: str, sent: int) -> None:
        """Waits until the local queue, found full, has room: an acknowledgement came."""
        waiting = len(self._producer)
        self._await(acks, topic, sent, lambda: len(self._producer) < waiting)

    def _await(self, acks: _Acks, topic: str, sent: int, settled: Callable[[], bool]) -> None:
        """Serves acknowledgements until ``settled()``; fails once none came for ``self.timeout``
        seconds: a limit on no progress, never on the whole batch (a slow broker acknowledging
        steadily takes as long as it needs)."""
        entered = time.monotonic()
        while not settled():
            self._producer.poll(0.1)
            if time.monotonic() - max(acks.last, entered) > self.timeout:
                raise self._stalled(acks, topic, sent)

    def _stalled(self, acks: _Acks, topic: str, sent: int) -> SourceError:
        if not acks.acked and not acks.failures:
            return unreachable(
                self.bootstrap_servers, self.timeout, f"none of {sent} records to topic {topic!r} acknowledged"
            )
        return BrokerStalledError(
            f"the broker at {self.bootstrap_servers!r} acknowledged {acks.acked} of {sent} records to topic {topic!r} "
            f"in {acks.last - acks.started:.1f} s, then nothing for {self.timeout:g} s: check that it still runs "
            "(bootstrap.servers) and its log"
        )


class _Acks:
    """The broker's answers to one :meth:`KafkaClient.produce`, counted as they are served."""

    def __init__(self) -> None:
        self.acked = 0
        self.failures: list[KafkaError] = []
        self.started = self.last = time.monotonic()

    def __call__(self, error: KafkaError | None, _message) -> None:
        self.last = time.monotonic()
        if error is None:
            self.acked += 1
        else:
            self.failures.append(error)
