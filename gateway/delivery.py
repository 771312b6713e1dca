"""Delivery of the gateway's buffers to Kafka, and the cursors it may commit.

A buffer is produced to its source group's topic with the source id as key (so a
source's bytes stay in one partition, in order) and its byte range in header
:data:`~circuits.framing.RANGE_HEADER`.  A message holds whole records: the bytes after a
buffer's last newline wait for the rest of their record and go out at the head of the
source's next message.  This is the only look the gateway takes at the bytes, so that a
record never spans two messages (and hence two steps); splitting a message into records
and decoding them happen in the step's Spark job.  A record longer than a buffer goes out
in pieces marked with :data:`~circuits.framing.PARTIAL_HEADER`, which the step turns into
dead letters.

A buffer goes back to the pool when the broker acknowledged its message, so an
unacknowledged backlog holds buffers and stops sources from reading (backpressure).  A
source's cursor is the end of the longest acknowledged prefix of its bytes; only that is
committed.  :attr:`Delivery.commit_due` is set once ``commit_bytes`` were acknowledged
since the last commit, so the gateway commits them without waiting for a flush.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from circuits.framing import client_config, consumer_config, gateway_range, no_broker, range_headers

from .errors import GatewayBrokerError
from .pool import Buffer


@dataclass
class _Source:
    """What delivery knows of one source."""

    topic: str
    acked: int
    """The end of the longest acknowledged prefix of the source's bytes (its cursor)."""
    rereadable: bool
    tail: bytes = b""
    """Bytes after the last newline sent: the start of a record still being read."""
    long_record: bool = False
    """Whether the bytes being read continue a record longer than a buffer."""
    pending: dict[int, int] = field(default_factory=dict)
    """Acknowledged ranges beyond ``acked`` (start: end): acknowledgements can come out of order."""
    partition_offsets: dict[int, tuple[tuple[str, int], int]] = field(default_factory=dict)
    """Where each acknowledged range beyond ``acked`` went (start: (topic partition, offset))."""
    sent: int = 0
    """The end of the bytes produced so far (where the tail starts)."""
    bytes_sent: int = 0
    messages: int = 0
    failures: int = 0
    last_failure: str | None = None


def cut(state: _Source, data: bytes, first: int, size: int) -> Iterable[tuple[bytes, int, bool]]:
    """The messages of ``data``, a source's bytes from ``first`` read into buffers of
    ``size``: ``(value, start, partial)``.  Whole records go out; the bytes after the last
    newline stay in ``state.tail``; a record longer than a buffer goes out in pieces marked
    partial, up to and including its newline."""
    if state.long_record:
        newline = data.find(b"\n")
        piece = data if newline < 0 else data[: newline + 1]
        state.long_record = newline < 0
        yield piece, first, True
        data, first = data[len(piece) :], first + len(piece)
    newline = data.rfind(b"\n")
    if newline >= 0:
        yield data[: newline + 1], first, False
        data, first = data[newline + 1 :], first + newline + 1
    if len(data) >= size:
        state.long_record = True
        yield data, first, True
        data = b""
    state.tail = data


class Delivery:
    """Produces the buffers of every source and tracks their acknowledgements.

    ``deliver`` is called on the I/O threads and never blocks; acknowledgements are served
    by a thread of this object, which returns each acknowledged message's buffer with
    ``release`` and calls ``on_failure(source, position)`` when the broker refused a
    message (a re-readable source then reads again from ``position``).
    """

    def __init__(
        self,
        bootstrap_servers: str,
        config: dict | None,
        release: Callable[[Buffer], None],
        on_failure: Callable[[str, int], None],
        commit_bytes: int = 1 << 22,
    ) -> None:
        # Idempotence: a retried request is neither written twice nor reordered.  The step's
        # reader skips a source's bytes below what it already read, so a later range landing
        # before an earlier one would lose the earlier one.
        self._producer = Producer(
            client_config(bootstrap_servers, {"linger.ms": 0, "enable.idempotence": True, **(config or {})})
        )
        self._release = release
        self._on_failure = on_failure
        self._sources: dict[str, _Source] = {}
        self._lock = threading.Lock()
        # Per partition: the highest offset acknowledged, the read-back start when nothing is pending.
        self._high: dict[tuple[str, int], int] = {}
        self._commit_bytes = commit_bytes
        self._read_back_before: dict[tuple[str, int], int] = {}
        self.unsaved = 0
        """Bytes acknowledged since the last commit of the cursors (see :meth:`saved`)."""
        self.commit_due = threading.Event()
        """Set once ``unsaved`` reaches ``commit_bytes``."""
        self._running = True
        self._idle_listeners: list[Callable[[], None]] = []
        self._sent_since_idle = False
        self._poller = threading.Thread(target=self._poll, name="gateway-acks", daemon=True)
        self._poller.start()

    def add(self, source: str, topic: str, position: int, rereadable: bool) -> None:
        """Starts tracking ``source``, whose next byte is at ``position``."""
        with self._lock:
            self._sources[source] = _Source(topic, position, rereadable, sent=position)

    def remove(self, source: str) -> None:
        with self._lock:
            self._sources.pop(source, None)

    def tail(self, source: str) -> tuple[bytes, bool]:
        """The bytes kept after the source's last newline, and whether they continue a long record."""
        with self._lock:
            state = self._sources[source]
            return state.tail, state.long_record

    def resume(self, source: str, tail: bytes, long_record: bool) -> None:
        """The source goes on (on another worker) with the kept bytes it had."""
        with self._lock:
            state = self._sources[source]
            state.tail, state.long_record = tail, long_record

    def rewind(self, source: str, position: int) -> None:
        """The source reads again from ``position``: what was kept of its bytes is dropped."""
        with self._lock:
            state = self._sources[source]
            state.tail, state.long_record, state.sent = b"", False, position

    def on_idle(self, listener: Callable[[], None]) -> None:
        """Calls ``listener`` whenever the producer's queue has just emptied."""
        self._idle_listeners.append(listener)

    @property
    def idle(self) -> bool:
        """Whether no message waits for the broker's acknowledgement."""
        return len(self._producer) == 0

    def deliver(self, source: str, buffer: Buffer, start: int, end: int) -> None:
        """Produces the whole records of ``buffer`` (``source``'s bytes ``start..end``)."""
        state = self._sources[source]
        data = state.tail + bytes(buffer.filled())
        first = start - len(state.tail)
        messages = list(cut(state, data, first, len(buffer.data)))
        if not messages:
            self._release(buffer)
            return
        for i, (value, begin, partial) in enumerate(messages):
            # The buffer goes back with the acknowledgement of the last message cut from it.
            held = buffer if i == len(messages) - 1 else None
            self._produce(source, state, value, begin, partial, held)

    def end(self, source: str) -> None:
        """The source ended: its unterminated last record goes out as it is."""
        state = self._sources.get(source)
        if state is not None and state.tail:
            tail, state.tail = state.tail, b""
            self._produce(source, state, tail, state.sent, state.long_record, None)

    def _produce(
        self, source: str, state: _Source, value: bytes, start: int, partial: bool, buffer: Buffer | None
    ) -> None:
        end = start + len(value)
        headers = range_headers(start, end, partial)

        def delivered(error: KafkaError | None, message: Message) -> None:
            self._delivered(source, start, end, error, message, buffer)

        state.sent = end
        self._sent_since_idle = True
        state.bytes_sent += len(value)
        state.messages += 1
        while True:
            try:
                self._producer.produce(
                    state.topic, value=value, key=source.encode(), headers=headers, on_delivery=delivered
                )
                return
            except BufferError:
                # librdkafka's queue is full: serve acknowledgements to make room (rare: the
                # pool's buffers bound what is in flight).
                self._producer.poll(0.01)

    def _delivered(
        self, source: str, start: int, end: int, error: KafkaError | None, message: Message, buffer: Buffer | None
    ) -> None:
        with self._lock:
            state = self._sources.get(source)
            if state is not None and error is None:
                self._acknowledged(state, start, end, (message.topic(), message.partition()), message.offset())
            elif state is not None:
                state.failures += 1
                state.last_failure = error.str()
        if buffer is not None:
            self._release(buffer)
        if error is not None and state is not None:
            self._on_failure(source, state.acked)

    def _acknowledged(self, state: _Source, start: int, end: int, partition: tuple[str, int], offset: int) -> None:
        self._high[partition] = max(self._high.get(partition, -1), offset)
        self.unsaved += end - start
        if self.unsaved >= self._commit_bytes:
            self.commit_due.set()
        state.pending[start] = end
        state.partition_offsets[start] = (partition, offset)
        while state.acked in state.pending:
            state.partition_offsets.pop(state.acked)
            state.acked = state.pending.pop(state.acked)

    def _poll(self) -> None:
        while self._running:
            self._producer.poll(0.05)
            # A message may be sent and acknowledged between two looks at the queue: what
            # counts is that something was sent since the listeners last heard.
            if self._sent_since_idle and self.idle:
                self._sent_since_idle = False
                for listener in self._idle_listeners:
                    listener()

    def wait(self, timeout: float) -> int:
        """Waits until every message produced so far is acknowledged; returns how many are not."""
        return self._producer.flush(timeout)

    def cursors(self) -> tuple[dict[tuple[str, str], int], dict[tuple[str, int], int]]:
        """What may be committed now: each re-readable source's acknowledged prefix (per
        ``(topic, source)``), and per ``(topic, partition)`` the offset from which every
        message beyond those prefixes lies."""
        with self._lock:
            positions = {(s.topic, name): s.acked for name, s in self._sources.items() if s.rereadable}
            # A partition this process had nothing acknowledged in keeps the read-back offset it
            # started from: without one, the next start would read it whole.
            read_back = self._read_back_before | {p: o + 1 for p, o in self._high.items()}
            for s in self._sources.values():
                # Out-of-order acknowledgements: the read-back starts at the earliest beyond a cursor.
                for p, offset in s.partition_offsets.values():
                    read_back[p] = min(read_back[p], offset)
        return positions, read_back

    def read_back_from(self, committed: dict[tuple[str, int], int]) -> None:
        """The read-back offsets of the cursors this process started from."""
        with self._lock:
            self._read_back_before = dict(committed)

    def saved(self, unsaved: int) -> None:
        """The cursors taken when ``unsaved`` bytes were unsaved are committed."""
        with self._lock:
            self.unsaved -= unsaved
            if self.unsaved < self._commit_bytes:
                self.commit_due.clear()

    def stats(self) -> dict[str, dict]:
        """Per source: topic, bytes produced and acknowledged, messages, failures."""
        with self._lock:
            return {
                name: {
                    "topic": s.topic,
                    "bytes_sent": s.bytes_sent,
                    "acked": s.acked,
                    "messages": s.messages,
                    "delivery_failures": s.failures,
                    "last_delivery_failure": s.last_failure,
                }
                for name, s in self._sources.items()
            }

    def close(self, timeout: float = 10.0) -> None:
        self.wait(timeout)
        self._running = False
        self._poller.join()


def acknowledged_since(
    bootstrap_servers: str,
    config: dict | None,
    read_back: dict[tuple[str, int], int],
    topics: Iterable[str],
    timeout: float = 10.0,
) -> dict[tuple[str, str], dict[int, int]]:
    """The byte ranges ``{start: end}`` of each ``(topic, source)`` found on the broker from
    the ``read_back`` offsets on: what a gateway had delivered after its last cursor commit.
    A partition of ``topics`` without a read-back offset (no commit saw a message of it:
    the gateway died before its first commit, or the partition is new) is read from its
    earliest offset."""
    found: dict[tuple[str, str], dict[int, int]] = {}
    consumer = Consumer(consumer_config(bootstrap_servers, {"group.id": "dbsp-gateway", **(config or {})}))
    try:
        for topic, partition in _partitions(consumer, bootstrap_servers, set(topics), timeout) | read_back.keys():
            low, high = _broker(
                bootstrap_servers, timeout, consumer.get_watermark_offsets, TopicPartition(topic, partition), timeout
            )
            start = read_back.get((topic, partition), low)
            for message in _messages(consumer, topic, partition, start, high, timeout):
                framed = gateway_range(message)
                if framed is not None:
                    found.setdefault((topic, message.key().decode()), {})[framed[0]] = framed[1]
    finally:
        consumer.close()
    return found


def _broker(bootstrap_servers: str, timeout: float, request: Callable, *args):
    """``request(*args)``, a failure to reach the broker raised as a :class:`GatewayBrokerError`."""
    try:
        return request(*args)
    except KafkaException as e:
        raise GatewayBrokerError(no_broker(bootstrap_servers, timeout, str(e))) from e


def _partitions(consumer: Consumer, bootstrap_servers: str, topics: set[str], timeout: float) -> set[tuple[str, int]]:
    """Every partition of ``topics``.  From a listing of every topic: a metadata request
    naming a missing topic would make a broker with auto-creation create it."""
    listed = _broker(bootstrap_servers, timeout, consumer.list_topics, None, timeout).topics
    missing = sorted(topics - listed.keys())
    if missing:
        raise GatewayBrokerError(
            f"topic(s) {', '.join(map(repr, missing))} do not exist on the broker at {bootstrap_servers!r}: "
            "create them, or correct the topic of the sources that write to them"
        )
    return {(t, p) for t in topics for p in listed[t].partitions}


def _messages(
    consumer: Consumer, topic: str, partition: int, start: int, high: int, timeout: float
) -> Iterable[Message]:
    """The messages of a partition from ``start`` to ``high``, its end."""
    if start >= high:
        return
    consumer.assign([TopicPartition(topic, partition, start)])
    position = start
    while position < high:
        messages = consumer.consume(min(high - position, 10_000), timeout)
        if not messages:
            raise GatewayBrokerError(
                f"reading back topic {topic!r} partition {partition} from offset {position} for the gateway's restart: "
                f"nothing delivered within {timeout:g} s; check the broker"
            )
        for message in messages:
            if message.error() is None:
                position = message.offset() + 1
                yield message
