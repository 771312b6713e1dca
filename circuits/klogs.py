"""KLogs (docs/klogs.md): keyed logs and pipelines of ``merge``, ``partition``, ``loop``, ``sink``.

A keyed log (:class:`KLog`) is an infinite sequence of ``(key, value)`` messages, backed
by a Kafka topic of the log's name (message key = the key's JSON text, value = the
value's JSON text).  Messages of one key are in FIFO order: the producer sends a key to
one partition, and a step handles a key's messages in offset order.  A pipeline is
built inside :func:`deploy`::

    upper, lower = KLog.named("word-counts-uppercase"), KLog.named("word-counts-lowercase")

    def pipeline():
        merge([upper, lower]).partition(lambda k, _: [k.lower()]).loop(
            0, lambda total, word, count: (total + count, [total + count])
        ).sink(print_count_json)

    circuit = deploy(pipeline, "word_count")

and is an ordinary :class:`~circuits.circuit.Circuit` underneath: each named log is an
input handle of that name (``RECORD_SCHEMA``), ``merge`` a union, ``partition`` and
``loop`` the keyed operators of :mod:`circuits.operators.keyed`, and each ``sink`` an
output (the messages it is handed, step by step) whose side effect the storage layer
performs once per message, with the idempotency token ``(stage, key, offset)``, where
``offset`` is the message's position without its timestamp: the source message's place
in its log, plus the index of each copy and output that led to this message (unique,
and the same on a replay: see :mod:`circuits.operators.keyed`).  Records
that could not be handled go to the output :data:`DEAD_LETTERS`.

Ordering: within a step, messages are handled (and handed to sinks) in the order of
their position ``(timestamp, source log, partition, offset)``: ``timestamp`` is the
record's Kafka timestamp (the producer's CreateTime, in milliseconds), made monotonic per
partition (the largest timestamp of the step's records of that partition up to and
including this one), so a key's messages, which share a partition, keep their offset
order even when a producer's clock goes back.  The source log is numbered in the order
the pipeline first uses the named logs.  So messages produced in order, in different
milliseconds, are handled in the order they were produced, whichever logs and keys they
went to; messages of the same millisecond on different logs or partitions fall back to
(source log, partition, offset).  A record without a timestamp counts as 0.  A message
a ``loop`` emits follows the message that caused it; copies a ``partition`` makes of one
message follow the order of the keys its function returned.  Steps are handled in order, so a
message of a later step follows every message of an earlier one.
Keys, values and states are JSON values.
"""

from __future__ import annotations

import contextvars
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import Window
from pyspark.sql import functions as F

from .circuit import Circuit, Stream
from .errors import CircuitDefinitionError
from .operators.keyed import KEY, MESSAGE_SCHEMA, ORD, REASON, STAGE, VALUE, Loop, Partition, to_json
from .vnodes import DEFAULT_VNODES

PARTITION, OFFSET, TIMESTAMP = "partition", "offset", "timestamp"
RECORD_SCHEMA = "key string, value string, partition int, offset bigint, timestamp bigint"
"""A named log's input handle: the record's key and value (JSON texts), its position and
its Kafka timestamp (milliseconds since the epoch; null when the record has none)."""
DEAD_LETTERS = "dead_letters"
DEAD_LETTER_COLUMNS = (STAGE, KEY, VALUE, ORD, REASON)

_building: contextvars.ContextVar[_Builder] = contextvars.ContextVar("klogs_pipeline")


class KLog:
    """A keyed log: a named one (:meth:`named`, backed by a topic), or one a pipeline derives."""

    def __init__(self, name: str | None = None, stream: Stream | None = None) -> None:
        self.name = name
        self._stream = stream

    @staticmethod
    def named(name: str) -> KLog:
        """The keyed log backed by topic ``name``."""
        if not name or name.startswith("_"):
            raise CircuitDefinitionError(
                f"keyed log name {name!r} is not allowed: give a topic name not starting with '_'"
            )
        return KLog(name=name)

    def partition(self, fn: Callable[[Any, Any], Sequence[Any]]) -> KLog:
        return partition(fn, self)

    def loop(self, init: Any, fn: Callable[[Any, Any, Any], tuple[Any, Sequence[Any]]]) -> KLog:
        return loop(init, fn, self)

    def sink(self, fn: Callable[[Any, Any], None]) -> None:
        sink(fn, self)

    def __repr__(self) -> str:
        return f"KLog({self.name!r})" if self.name else "KLog(<derived>)"


def record(key: Any, value: Any) -> tuple[bytes, bytes]:
    """The Kafka record ``(key, value)`` of a message: both as JSON text."""
    return to_json("key", "produce", repr(key), key).encode(), to_json("value", "produce", repr(key), value).encode()


class KLogs:
    """The KLogs paper's handler: where messages are produced.  ``send(topic, key, value)`` delivers
    one record (bytes); the sensors layer gives one over Kafka."""

    named = staticmethod(KLog.named)

    def __init__(self, send: Callable[[str, bytes, bytes], None]) -> None:
        self.send = send

    def produce(self, klog: KLog, key: Any, value: Any) -> None:
        produce(klog, key, value, self.send)


def produce(klog: KLog, key: Any, value: Any, send: Callable[[str, bytes, bytes], None]) -> None:
    """Appends the message ``(key, value)`` to the named log ``klog`` through ``send``."""
    if klog.name is None:
        raise CircuitDefinitionError("produce: messages go to a named keyed log (KLog.named), not a derived one")
    send(klog.name, *record(key, value))


@dataclass
class _Builder:
    circuit: KLogsCircuit
    sources: dict[str, Stream] = field(default_factory=dict)
    dead: list[Stream] = field(default_factory=list)
    stages: int = 0

    def stage(self, kind: str) -> str:
        self.stages += 1
        return f"{kind}_{self.stages}"

    def stream(self, klog: KLog) -> Stream:
        if klog._stream is not None:
            if klog._stream.circuit is not self.circuit:
                raise CircuitDefinitionError(f"{klog!r} belongs to another pipeline")
            return klog._stream
        if klog.name not in self.sources:
            index = len(self.sources)
            records = self.circuit.input(klog.name, RECORD_SCHEMA)
            self.sources[klog.name] = records.select(
                KEY,
                VALUE,
                **{
                    ORD: F.array(
                        _monotonic_timestamp(),
                        F.lit(index).cast("bigint"),
                        F.col(PARTITION).cast("bigint"),
                        F.col(OFFSET),
                    )
                },
            )
        return self.sources[klog.name]

    def tagged(self, stream: Stream) -> KLog:
        """The messages of a tagged stream (see :mod:`circuits.operators.keyed`); its dead letters are kept."""
        self.dead.append(stream.filter(F.col(REASON).isNotNull()).select(*DEAD_LETTER_COLUMNS))
        return KLog(stream=stream.filter(F.col(REASON).isNull()).select(*MESSAGE_SCHEMA.names[:3]))


def _monotonic_timestamp():
    """A record's timestamp as the first element of its position: the largest timestamp of
    the step's records of its partition up to its offset (0 when none has one)."""
    so_far = Window.partitionBy(PARTITION).orderBy(OFFSET).rowsBetween(Window.unboundedPreceding, Window.currentRow)
    return F.coalesce(F.max(F.col(TIMESTAMP)).over(so_far), F.lit(0)).cast("bigint")


def _builder(what: str) -> _Builder:
    builder = _building.get(None)
    if builder is None:
        raise CircuitDefinitionError(f"{what}() builds a pipeline: call it inside the function given to deploy()")
    return builder


def merge(logs: Sequence[KLog]) -> KLog:
    """One log of the messages of ``logs``; each key's messages keep their relative order.
    A message's ``ord`` gains the index of its log in ``logs`` (when there are several), so
    that a message reaching the merge along two paths (a log merged with a log derived
    from it, or with itself) is two messages."""
    builder = _builder("merge")
    if not logs:
        raise CircuitDefinitionError("merge() needs at least one keyed log")
    if len(logs) == 1:
        return KLog(stream=builder.stream(logs[0]))
    first, *rest = [
        builder.stream(log).select(KEY, VALUE, **{ORD: F.concat(F.col(ORD), F.array(F.lit(i).cast("bigint")))})
        for i, log in enumerate(logs)
    ]
    return KLog(stream=first.union(*rest))


def partition(fn: Callable[[Any, Any], Sequence[Any]], log: KLog) -> KLog:
    """Re-keys each message ``(k, v)`` to each key of ``fn(k, v)`` (zero, one or many)."""
    builder = _builder("partition")
    stage = builder.stage("partition")
    return builder.tagged(builder.stream(log)._then(Partition(stage, fn)))


def loop(init: Any, fn: Callable[[Any, Any, Any], tuple[Any, Sequence[Any]]], log: KLog) -> KLog:
    """Per key, folds the messages in order: ``(state, [v2]) = fn(state, k, v)``, starting
    from ``init``; the ``v2`` are the output's messages of key ``k``."""
    builder = _builder("loop")
    stage = builder.stage("loop")
    return builder.tagged(builder.stream(log)._then(Loop(stage, init, fn)))


def sink(fn: Callable[[Any, Any], None], log: KLog) -> None:
    """Hands each message ``(k, v)`` to ``fn`` once (the storage layer runs it after the step)."""
    builder = _builder("sink")
    stage = builder.stage("sink")
    builder.stream(log).output(stage)
    builder.circuit.sinks[stage] = fn


class KLogsCircuit(Circuit):
    """A circuit deployed from a KLogs pipeline: its inputs are the named logs it reads
    (each the handle of its topic) and its outputs are its sinks' messages, plus the dead letters."""

    def __init__(self, name: str, *, vnodes: int = DEFAULT_VNODES) -> None:
        super().__init__(name, vnodes=vnodes)
        self.sinks: dict[str, Callable[[Any, Any], None]] = {}


def deploy(pipeline: Callable[[], None], name: str, *, vnodes: int = DEFAULT_VNODES) -> KLogsCircuit:
    """Builds the pipeline that ``pipeline()`` describes as a circuit named ``name``."""
    circuit = KLogsCircuit(name, vnodes=vnodes)
    builder = _Builder(circuit)
    token = _building.set(builder)
    try:
        pipeline()
    finally:
        _building.reset(token)
    if not circuit.sinks:
        raise CircuitDefinitionError(f"pipeline {name!r} has no sink: end it with .sink(fn)")
    if builder.dead:
        first, *rest = builder.dead
        (first.union(*rest) if rest else first).output(DEAD_LETTERS)
    return circuit


def messages(rows: Sequence[Sequence[Any]]) -> list[tuple[Any, Any, tuple[int, ...]]]:
    """A sink's output rows ``(key, value, ord, weight)`` (as collected) as ``(key, value,
    ord)`` messages, decoded, one per copy, in order."""
    out = []
    for key, value, ord_, w in rows:
        out += [(json.loads(key), json.loads(value), tuple(ord_))] * w
    return sorted(out, key=lambda m: m[2])


__all__ = [
    "DEAD_LETTERS",
    "RECORD_SCHEMA",
    "KLog",
    "KLogs",
    "KLogsCircuit",
    "deploy",
    "loop",
    "merge",
    "messages",
    "partition",
    "produce",
    "record",
    "sink",
]
