"""Reads offset ranges of Kafka topics on Spark executors and decodes them into Z-sets.

Two readers give the same rows: a small step's ranges are consumed by librdkafka consumers
in Python tasks and decoded there; a large step's (more than :data:`LARGE_READ` offsets)
by Spark's Kafka source, its records decoded in the JVM (``circuits/java``) where the JVM
can vouch for the result and in Python otherwise.  The rules below are the Python
decoder's, which defines them.

Sources pass raw bytes (docs/gateway.md); decoding is this separate stage. A record's value must
be a UTF-8 JSON object holding every field of its topic's schema (null allowed) in a JSON
form of the field's type (:mod:`sensors.values`), and optionally ``_weight``: a nonzero integer, 1 when absent (-1 deletes the
row). Other keys are ignored. A record that breaks these rules becomes a dead letter with
the reason, instead of failing the step.

A message the source gateway produced (:mod:`gateway`) is not one record but a
source's raw bytes: newline-delimited records, whole (the gateway cuts its buffers after a
newline), with the source id as key and the byte range in header :data:`~circuits.framing.RANGE_HEADER`.
Its records are framed here, each validated as above; a dead letter's reason names the
source and the record's bytes.  A piece of a record longer than the gateway's buffer
(header :data:`~circuits.framing.PARTIAL_HEADER`) is a dead letter.

Bytes of a source taken once are never taken again (a gateway re-sends bytes after a
refused delivery, or after a crash that came before the broker's acknowledgement or the
cursor's commit).  A source's messages are in one partition, in the order of their byte
ranges; the read of a step starts from ``taken``, the end of each source's bytes that
earlier steps took (kept in the input log, see :meth:`storage.logs.InputLog.taken_before`),
and a task drops the records below what it took since.  When a partition's range is read
by several tasks, a record is kept only in the copy at its lowest offset (records of
copies start at the same bytes: messages are cut after newlines).  So the rows of a step
depend only on its ranges and the steps before it: a replayed read gives the same rows.

A keyed log's topic (KLogs, declared with :data:`circuits.klogs.RECORD_SCHEMA`) is read
as records: the message key and the value (each any JSON value), with the record's
partition, offset and timestamp (milliseconds; null when the record has none).  Such a
log is append-only: a value that is an object with a ``_weight`` other than 1 is a
retraction, and a dead letter like an undecodable one.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from decimal import Decimal
from functools import cache, partial

import pyarrow as pa
from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, Consumer, KafkaException, TopicPartition
from pyspark.sql import DataFrame, Observation, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

from circuits.ddl import parse_type
from circuits.errors import raised_on_executor
from circuits.framing import RANGE_HEADER, consumer_config, framed_range
from circuits.klogs import RECORD_SCHEMA
from circuits.spark import map_in_arrow
from circuits.zset import WEIGHT, parse_schema
from storage.logs import DEAD_LETTER_SCHEMA, Range

from .errors import BrokerStalledError, BrokerUnavailableError, OffsetsLostError, SourceError, UnsupportedSchemaError
from .kafka import error_text, unreachable
from .values import SUPPORTED, Mismatch, checker, dumps, kind_of, plain, unsupported

CHUNK = 50_000
"""Most offsets one Spark task reads, so that a large step's read runs as several tasks;
the ranges of a small step share a task (a Python task costs more than its read)."""

MAX_BATCH = 10_000
"""Most records asked of the consumer at once."""

LARGE_READ = 10_000
"""Most offsets a step reads with the engine's consumers; a larger read goes through Spark's
Kafka source and the JVM decoder, which start about as fast and read faster: the two
cross between 3,000 and 10,000 records (``bench/broker_io.py``)."""

# One row per consumed record: ``weight`` when the value is valid, else ``reason``.
_RAW_SCHEMA = T.StructType(
    [
        T.StructField("topic", T.StringType()),
        T.StructField("partition", T.IntegerType()),
        T.StructField("offset", T.LongType()),
        T.StructField("key", T.StringType()),
        T.StructField("value", T.StringType()),
        T.StructField("weight", T.LongType()),
        T.StructField("reason", T.StringType()),
        T.StructField("timestamp", T.LongType()),
        # A gateway record: where its bytes start in its source.
        T.StructField("position", T.LongType()),
        # Not a record: the end of the bytes of source ``key`` a task took (see ``_read_tasks``).
        T.StructField("taken", T.LongType()),
    ]
)
_RAW_ARROW = to_arrow_schema(_RAW_SCHEMA)

Fields = tuple[tuple[str, str], ...]
"""The (column, type name) pairs a record's value is validated against."""
KEYED: Fields = (("*", "keyed log record"),)
"""The fields of a keyed log's topic: its values are any JSON, its rows the records."""


def fields_of(schema: T.StructType | str) -> Fields:
    """The fields ``validate`` checks for ``schema``; refuses types JSON input cannot carry
    (see :mod:`sensors.values`)."""
    if parse_schema(schema) == parse_schema(RECORD_SCHEMA):
        return KEYED
    fields = parse_schema(schema).fields
    for f in fields:
        if f.name == WEIGHT:
            raise UnsupportedSchemaError(f"column {WEIGHT!r} is reserved for the record's weight; rename the column")
        why = unsupported(f.dataType)
        if why:
            raise UnsupportedSchemaError(
                f"column {f.name!r} has type {f.dataType.simpleString()}, which JSON input does not carry ({why}); "
                f"declare it as one of {SUPPORTED}"
            )
    return tuple((f.name, f.dataType.simpleString()) for f in fields)


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def _bigint(value: object) -> bool:
    try:
        _BIGINT(value)
    except Mismatch:
        return False
    return True


_BIGINT = checker("bigint")


@cache
def _plan(fields: Fields) -> tuple[bool, tuple[tuple[str, str, Callable[[object], object]], ...]]:
    """Whether records of ``fields`` are written again for Spark (see :mod:`sensors.values`),
    and each field's name, type and check."""
    exact = fields != KEYED and not all(plain(parse_type(kind)) for _, kind in fields)
    return exact, () if fields == KEYED else tuple((name, kind, checker(kind)) for name, kind in fields)


def decode(value: bytes | None, fields: Fields) -> tuple[int | None, str | None, str | None]:
    """``(weight, text, None)`` for a valid record value, where ``text`` is the record as
    Spark parses it (None: the value as it came); ``(None, None, reason)`` for an invalid one."""
    if value is None:
        return None, None, "undecodable value: null (a tombstone carries no row)"
    exact, checks = _plan(fields)
    try:
        # NaN and Infinity are Python's extensions, not JSON.
        row = json.loads(
            value.decode("utf-8"), parse_constant=_refuse_constant, parse_float=Decimal if exact else float
        )
    except ValueError as error:  # UnicodeDecodeError and JSONDecodeError both are
        return None, None, f"undecodable value: not UTF-8 JSON ({error})"
    if fields == KEYED:
        weight = row.get(WEIGHT, 1) if isinstance(row, dict) else 1
        if weight == 1:
            return 1, None, None
        return None, None, f"retraction: a keyed log is append-only ({WEIGHT!r} {weight!r})"
    if not isinstance(row, dict):
        return None, None, f"undecodable value: a JSON {type(row).__name__}, not an object"
    spark = {}
    for name, expected, check in checks:
        if name not in row:
            return None, None, f"wrong schema: missing field {name!r}"
        try:
            spark[name] = None if row[name] is None else check(row[name])
        except Mismatch as error:
            got = error.detail or kind_of(error.value)
            return None, None, f"wrong schema: field {name!r} expected {expected}, got {got}"
    weight = row.get(WEIGHT, 1)
    if not _bigint(weight) or weight == 0:
        return None, None, f"wrong weight: {WEIGHT!r} must be a nonzero bigint, got {weight!r}"
    return weight, dumps(spark) if exact else None, None


def validate(value: bytes | None, fields: Fields) -> tuple[int | None, str | None]:
    """``(weight, None)`` for a valid record value, ``(None, reason)`` for an invalid one."""
    weight, _, reason = decode(value, fields)
    return weight, reason


def _row(
    topic: str, partition: int, offset: int, key: str | None, value: bytes | None, fields: Fields, where: str = ""
) -> dict:
    weight, text, reason = decode(value, fields)
    # A dead letter keeps its value as text: bytes that are not UTF-8 show as \\xNN escapes.
    if text is None and value is not None:
        text = value.decode("utf-8", errors="backslashreplace")
    if fields == KEYED and reason is None and validate(None if key is None else key.encode(), KEYED)[1] is not None:
        weight, reason = None, f"undecodable key: not UTF-8 JSON ({key!r})"
    return {
        "topic": topic,
        "partition": partition,
        "offset": offset,
        "key": key,
        "value": text,
        "weight": weight,
        "reason": None if reason is None else where + reason,
    }


def _records(
    topic: str,
    partition: int,
    offset: int,
    key: bytes | None,
    value: bytes | None,
    headers: list[tuple[str, bytes]] | None,
    fields: Fields,
    seen: dict[tuple[str, str], int],
) -> Iterator[dict]:
    """The rows of one message: itself, or the records of a gateway message's bytes."""
    key = None if key is None else key.decode("utf-8", errors="backslashreplace")
    framed = framed_range(headers)
    if framed is None:
        yield _row(topic, partition, offset, key, value, fields)
        return
    start, end, partial = framed
    # Bytes below ``read`` were taken from an earlier message of this source (see the
    # module): whole records are skipped.
    read = seen.get((topic, key), 0)
    if read >= end:
        return
    seen[(topic, key)] = end
    if partial:
        yield {
            "topic": topic,
            "partition": partition,
            "offset": offset,
            "key": key,
            "value": value.decode("utf-8", errors="backslashreplace"),
            "weight": None,
            "reason": f"source {key!r} bytes {start}-{end}: part of a record longer than the gateway's buffers; "
            "raise gateway.buffer_size above the longest record",
            "position": start,
        }
        return
    position = start
    for line in (value or b"").split(b"\n"):
        if line.strip() and position >= read:
            where = f"source {key!r} bytes {position}-{position + len(line)}: "
            yield _row(topic, partition, offset, key, line, fields, where) | {"position": position}
        position += len(line) + 1


def _read_range(
    consumer: Consumer,
    chunk: tuple[str, int, int, int],
    fields: Fields,
    timeout: float,
    settings: dict,
    seen: dict[tuple[str, str], int],
) -> Iterator[dict]:
    """The rows of offsets [start, end) of one partition, read by ``consumer`` (made with
    ``settings``); fails the Spark task (hence the step) once the broker delivers nothing
    new for ``timeout`` seconds, with the error :func:`undelivered` finds."""
    topic, partition, start, end = chunk
    position = start
    # A consumer learns of a topic it was not assigned before only at its next periodic
    # metadata scan (every second); asking first makes the fetch start at once.
    try:
        consumer.list_topics(topic, timeout)
    except KafkaException as error:
        raise undelivered(chunk, position, error_text(error), timeout, settings["bootstrap.servers"]) from error
    consumer.assign([TopicPartition(topic, partition, position)])
    while position < end:
        before = position
        # Ask for exactly what is missing: consume() waits out its timeout for a fuller batch.
        for message in consumer.consume(min(end - position, MAX_BATCH), timeout):
            if message.error() is None and position <= message.offset() < end:
                kind, timestamp = message.timestamp()
                records = _records(
                    topic, partition, message.offset(), message.key(), message.value(), message.headers(), fields, seen
                )
                for row in records:
                    yield {**row, "timestamp": None if kind == TIMESTAMP_NOT_AVAILABLE else timestamp}
                position = message.offset() + 1
        # Transaction markers take offsets but are never delivered; the consumer's position skips them.
        position = max(position, consumer.position([TopicPartition(topic, partition)])[0].offset)
        if position == before:
            watermarks = _watermarks(settings, topic, partition, timeout)
            raise undelivered(chunk, position, watermarks, timeout, settings["bootstrap.servers"])


def _watermarks(settings: dict, topic: str, partition: int, timeout: float) -> tuple[int, int] | str:
    """The partition's (log start, end offset) as the broker says now, or why it did not
    answer; asked over a connection of its own, since the reader's may be held by a fetch."""
    consumer = Consumer(settings)
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout, cached=False)
    except KafkaException as error:
        return error_text(error)
    finally:
        consumer.close()


def undelivered(
    chunk: tuple[str, int, int, int],
    position: int,
    watermarks: tuple[int, int] | str,
    timeout: float,
    bootstrap_servers: str,
) -> SourceError:
    """The error for a read of ``chunk`` that stopped at ``position`` for ``timeout`` seconds,
    by what the broker said of the partition after: nothing (``watermarks`` is the failure's
    text), a log start above the offsets (the only case where they are gone for good), an
    end below them, or offsets it holds but did not deliver."""
    topic, partition, start, end = chunk
    where = f"topic {topic!r} partition {partition}: offsets {position} to {end - 1}"
    if isinstance(watermarks, str):
        return unreachable(bootstrap_servers, timeout, f"{where} not delivered: {watermarks}")
    low, high = watermarks
    if position < low:
        return OffsetsLostError(
            f"{where} are below the log start {low} of the broker at {bootstrap_servers!r}: they were deleted "
            "(retention) before the step read them and cannot be recovered; raise the topic's retention or run steps sooner"
        )
    if high < end:
        return OffsetsLostError(
            f"{where}: the broker at {bootstrap_servers!r} ends at offset {high}, below the end {end} the division "
            "recorded: the topic was deleted and created again, or the broker lost its log. Re-run from a checkpoint "
            "whose input is still on the broker, or point the pipeline at a new store root to start over"
        )
    return BrokerStalledError(
        f"{where}: the broker at {bootstrap_servers!r} answered (it holds offsets {low} to {high - 1}) but delivered "
        f"nothing for {timeout:g} s after {position - start} of the range's {end - start} records; it is overloaded "
        "or unwell: check its log"
    )


def _read_tasks(
    bootstrap_servers: str,
    config: dict | None,
    fields: dict[str, Fields],
    timeout: float,
    chunks: list[tuple[str, int, int, int]],
    taken: dict[tuple[str, str], int],
    batches: Iterator[pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
    """The ``mapInArrow`` body, run on an executor: one batch of rows per chunk number it
    is given, then a row per gateway source it took bytes of, with the end of those bytes
    in ``taken``."""
    settings = consumer_config(bootstrap_servers, config)
    seen = dict(taken)
    for batch in batches:
        for i in batch.column("id").to_pylist():
            chunk = chunks[i]
            # A consumer per chunk: one assigned again waits out the fetch its last partition
            # has in flight (past a partition's end the broker holds it for fetch.wait.max.ms).
            consumer = Consumer(settings)
            try:
                rows = list(_read_range(consumer, chunk, fields[chunk[0]], timeout, settings, seen))
            finally:
                consumer.close()
            yield pa.RecordBatch.from_pylist(rows, schema=_RAW_ARROW)
    yield _taken_rows(seen, taken)


def read_failed(error: BaseException) -> SourceError | None:
    """The error a read task raised (:func:`undelivered`'s), recovered from the Spark error
    that failed the job (Spark passes an executor's Python error on as text), or None."""
    return raised_on_executor(error, OffsetsLostError, BrokerStalledError, BrokerUnavailableError)


def _check_config(bootstrap_servers: str, config: dict | None) -> None:
    """Refuses a client config librdkafka rejects here, before every executor would."""
    try:
        Consumer(consumer_config(bootstrap_servers, config)).close()
    except KafkaException as error:
        raise SourceError(f"the Kafka client config is invalid: {error_text(error)}; correct it") from error


def _chunks(ranges: list[Range], size: int) -> list[tuple[str, int, int, int]]:
    """The ranges cut into pieces of at most ``size`` offsets (empty ranges dropped)."""
    return [
        (r.source, r.partition, start, min(start + size, r.end))
        for r in ranges
        for start in range(r.start, r.end, size)
    ]


@dataclass(frozen=True)
class Decoded:
    """One read of offset ranges, planned but not run: each topic's valid records as a
    Z-set and the invalid ones as dead letters.  The first Spark job over them reads the
    broker (once: records a frame shares are kept, in :attr:`cached`; a large read's
    rows of the JVM are read straight from the broker by the one job over them); a job
    fails when the broker did not deliver every offset, and :meth:`failed` names why."""

    inputs: dict[str, DataFrame]
    dead_letters: DataFrame | None
    """None: no record of the read is one (a large read's :attr:`rest` may still hold some)."""
    taken: DataFrame | None
    """Per gateway source (``topic``, ``source``): the ``end`` of its bytes taken so far
    (:data:`storage.logs.TAKEN_SCHEMA`; a source may have several rows: the largest counts)."""
    cached: list[DataFrame] = field(repr=False)
    failed: Callable[[BaseException], SourceError | None] = field(repr=False, default=read_failed)
    """The read's error behind a failed job over the frames above, or None for another failure."""
    rest: Callable[[], Decoded | None] | None = field(repr=False, default=None)
    """A read in two jobs (see :func:`_read_large`): the records the frames above left out,
    read and decoded (None when there are none), to be called once a job over every input
    above has run."""

    def unpersist(self) -> None:
        """Frees the cached records; the DataFrames above (and the rest's) must not be used after."""
        for frame in self.cached:
            frame.unpersist()


def _zset(raw: DataFrame, topic: str, schema: T.StructType) -> DataFrame:
    valid = raw.where((F.col("topic") == topic) & F.col("reason").isNull() & F.col("taken").isNull())
    if fields_of(schema) == KEYED:
        return valid.select(*schema.names, F.col("weight").alias(WEIGHT))
    # Values were validated, so a parse that would null a field fails instead.
    parsed = F.from_json("value", schema, {"mode": "FAILFAST"}).alias("row")
    return valid.select(parsed, F.col("weight").alias(WEIGHT)).select("row.*", WEIGHT)


def _decoded(records: DataFrame, raw: DataFrame, schemas: dict[str, T.StructType | str]) -> dict:
    """The fields of :class:`Decoded` over ``records`` (the rows of ``raw`` that count)."""
    return {
        "inputs": {topic: _zset(records, topic, parse_schema(schema)) for topic, schema in schemas.items()},
        "dead_letters": records.where(F.col("reason").isNotNull()).select(*DEAD_LETTER_SCHEMA.names),
        "taken": raw.where(F.col("taken").isNotNull()).select(
            "topic", F.col("key").alias("source"), F.col("taken").alias("end")
        ),
    }


def read_ranges(
    spark: SparkSession,
    bootstrap_servers: str,
    client_config: dict | None,
    ranges: list[Range],
    schemas: dict[str, T.StructType | str],
    timeout: float = 30.0,
    chunk_size: int = CHUNK,
    taken: dict[tuple[str, str], int] | None = None,
    large: int | None = None,
) -> Decoded:
    """Plans consuming exactly ``ranges`` on the executors, once, and decoding each topic's
    records with its schema in ``schemas`` (topic: columns without the weight).  No Spark
    job runs here: the first job over the result reads the broker.  ``taken``: per gateway
    source ``(topic, source id)``, the end of its bytes that earlier steps took (dropped
    when sent again).

    A read of more than ``large`` (:data:`LARGE_READ`) offsets, with no client config of the user's, goes
    through Spark's Kafka source and the JVM decoder (:func:`_read_large`); any other, through
    the engine's consumers in Python tasks.  Both give the same rows.

    A job over the result fails when the broker delivers nothing new of a range for
    ``timeout`` seconds (a limit on no progress: a large range takes as long as it needs):
    see :attr:`Decoded.failed`.
    """
    fields = {topic: fields_of(schema) for topic, schema in schemas.items()}
    unknown = sorted({r.source for r in ranges} - set(fields))
    if unknown:
        raise SourceError(f"no schema for topic(s) {', '.join(map(repr, unknown))}: declare one in the schemas")
    _check_config(bootstrap_servers, client_config)
    taken = taken or {}
    if not client_config and sum(r.end - r.start for r in ranges) > (LARGE_READ if large is None else large):
        return _read_large(spark, bootstrap_servers, ranges, schemas, fields, timeout, taken)
    chunks = _chunks(ranges, chunk_size)
    # Partitions of consecutive chunk numbers, of about ``chunk_size`` offsets each.
    offsets = sum(end - start for _, _, start, end in chunks)
    partitions = max(min(len(chunks), -(-offsets // chunk_size)), 1)
    tasks = spark.range(0, len(chunks), 1, partitions)
    reader = partial(_read_tasks, bootstrap_servers, client_config, fields, timeout, chunks, taken)
    # Cached: every frame below reads the broker's records once, in the first job over them.
    raw = map_in_arrow(tasks, reader, _RAW_SCHEMA, ["id"]).persist()
    records = _first_copies(raw, partitions) if _split(chunks) else raw
    return Decoded(**_decoded(records, raw, schemas), cached=[raw])


_FETCH_BYTES = str(32 << 20)
"""The Kafka source's fetch sizes (partition and request): a large read's time at the
consumer's default of 1 MB a partition was twice its time at 32 MB (``bench/RESULTS.md``)."""

_FETCH_WAIT_MS = "50"
"""How long the broker may hold a fetch of the Kafka source that finds no new record: at
the default 500 ms a read of 1,000 records took 1.3-1.4 s, at 50 ms 0.4-0.5 s."""

_KAFKA_FAILURES = ("KAFKA_DATA_LOSS", "org.apache.kafka.common.errors", "KafkaDataConsumer", "Cannot fetch")
"""What a job failed by Spark's Kafka source says (Spark's error class, the client's exceptions)."""


def _read_large(
    spark: SparkSession,
    bootstrap_servers: str,
    ranges: list[Range],
    schemas: dict[str, T.StructType | str],
    fields: dict[str, Fields],
    timeout: float,
    taken: dict[tuple[str, str], int],
) -> Decoded:
    """:func:`read_ranges` through Spark's Kafka source (``assign``, each range's offsets,
    ``read_committed``, ``failOnDataLoss``; a Spark partition per topic partition, in offset
    order) and ``dbsp.RecordDecoder`` (``circuits/java``), which decodes a record of a
    topic of plain columns in the JVM or leaves it to the Python decoder
    (:func:`_decode_tasks`, whose rows are the engine reader's): gateway messages, keyed
    logs, records of other column types and every record it cannot vouch for.

    A topic the JVM decodes is read once by the job over its input, which counts what the
    JVM left (an observation); :attr:`Decoded.rest` reads again only the topics where it
    left any.  Nothing keeps the records between the two: a copy of every record costs
    more than a second read of the few that a step with no dead letters never makes."""
    read = [r for r in ranges if r.end > r.start]
    by_topic: dict[str, list[Range]] = {}
    for r in read:
        by_topic.setdefault(r.source, []).append(r)
    source = lambda topics: _kafka_source(spark, bootstrap_servers, {t: by_topic[t] for t in topics}, timeout)
    decoders = {
        topic: _decoder(spark, parse_schema(schemas[topic]))
        for topic in by_topic
        if fields[topic] != KEYED and any(plain(parse_type(kind)) for _, kind in fields[topic])
    }
    # A record without headers has null ones.
    framed = F.coalesce(F.exists("headers", lambda h: h["key"] == RANGE_HEADER), F.lit(False))
    jvm = lambda topic: F.when(~framed, F.call_function(decoders[topic][0], "value", F.lit(decoders[topic][1])))
    inputs, left = {}, {}
    for topic in decoders:
        left[topic] = Observation(f"dbsp_left_{uuid.uuid4().hex}")
        # The observation stands between the decoder and the filter, so the row is decoded once.
        rows = source([topic]).select(jvm(topic).alias("_row"))
        counted = rows.observe(left[topic], F.count_if(F.col("_row").isNull()).alias("records"))
        inputs[topic] = counted.where(F.col("_row").isNotNull()).select("_row.*")
    cached: list[DataFrame] = []
    failed = partial(_large_read_failed, bootstrap_servers, read, timeout)

    def rest() -> Decoded | None:
        again = [topic for topic, counted in left.items() if counted.get["records"]]
        if not again:
            return None
        decodable = F.lit(False)
        for topic in again:
            decodable = decodable | ((F.col("topic") == topic) & jvm(topic).isNotNull())
        return _python_pass(
            source(again).where(~decodable), fields, taken, {t: schemas[t] for t in again}, cached, failed
        )

    others = [topic for topic in by_topic if topic not in decoders]
    if others:
        first = _python_pass(source(others), fields, taken, {t: schemas[t] for t in others}, cached, failed)
        return replace(first, inputs=first.inputs | inputs, rest=rest)
    return Decoded(inputs, None, None, cached, failed, rest)


def _python_pass(
    records: DataFrame,
    fields: dict[str, Fields],
    taken: dict[tuple[str, str], int],
    schemas: dict[str, T.StructType | str],
    cached: list[DataFrame],
    failed: Callable[[BaseException], SourceError | None],
) -> Decoded:
    """``records`` of Spark's Kafka source decoded by :func:`_decode_tasks`, kept (in
    ``cached``) so that the frames of the result read them once.  A local checkpoint, not a
    cache: a cached plan is found again by comparing plans, and the Kafka source's relation
    equals only itself, so each frame of the result, resolved again by Spark Connect, would
    miss the cache and read the broker again."""
    stamp = F.when(F.col("timestampType") >= 0, F.unix_millis("timestamp")).alias("timestamp")
    left = records.select(*[stamp if n == "timestamp" else n for n in _LEFT_SCHEMA.names])
    decoded = map_in_arrow(left, partial(_decode_tasks, fields, taken), _RAW_SCHEMA, _LEFT_SCHEMA.names)
    try:
        # Eager, as the engine's shared frames are (see circuits.context.StepContext.share):
        # the step's planners run jobs over these rows at once.
        decoded = decoded.localCheckpoint(eager=True)
    except Exception as error:
        raise failed(error) or error from error
    cached.append(decoded)
    return Decoded(**_decoded(decoded, decoded, schemas), cached=cached, failed=failed)


def _kafka_source(
    spark: SparkSession, bootstrap_servers: str, by_topic: dict[str, list[Range]], timeout: float
) -> DataFrame:
    """Spark's Kafka source over exactly the offset ranges of ``by_topic`` (per topic, its
    ranges), read committed, failing on offsets that are gone."""
    offsets = lambda side: json.dumps(
        {t: {str(r.partition): getattr(r, side) for r in rs} for t, rs in by_topic.items()}
    )
    client = {
        "bootstrap.servers": bootstrap_servers,
        "isolation.level": "read_committed",
        # The driver asks the broker for the ranges' offsets first (an admin client, which
        # waits a minute a try by default, three tries): a broker that does not answer fails
        # the read after ``timeout``, as the engine's consumers do.
        "default.api.timeout.ms": str(int(timeout * 1000)),
        "request.timeout.ms": str(int(timeout * 1000)),
        # A fetch at a range's end finds nothing new, and the broker holds it this long
        # before answering (500 ms by default): most of a small read's time.
        "fetch.max.wait.ms": _FETCH_WAIT_MS,
        "max.partition.fetch.bytes": _FETCH_BYTES,
        "fetch.max.bytes": _FETCH_BYTES,
    }
    # Spark's executors keep a pool of consumers by group id and partition, but name a
    # group of each read's own unless told one: a step's tasks would connect anew.  The
    # pool refuses a group's consumer of other settings, so the group is named by them.
    client["group.id"] = f"dbsp-read-{hashlib.sha256(json.dumps(client, sort_keys=True).encode()).hexdigest()[:16]}"
    return (
        spark.read.format("kafka")
        .options(**{f"kafka.{k}": v for k, v in client.items()})
        .option("assign", json.dumps({t: [r.partition for r in rs] for t, rs in by_topic.items()}))
        .option("startingOffsets", offsets("start"))
        .option("endingOffsets", offsets("end"))
        .option("failOnDataLoss", "true")
        .option("includeHeaders", "true")
        .option("kafkaConsumer.pollTimeoutMs", str(int(timeout * 1000)))
        .option("fetchOffset.numRetries", "1")
        .load()
    )


_LEFT_SCHEMA = T.StructType(
    [
        T.StructField("topic", T.StringType()),
        T.StructField("partition", T.IntegerType()),
        T.StructField("offset", T.LongType()),
        T.StructField("key", T.BinaryType()),
        T.StructField("value", T.BinaryType()),
        T.StructField(
            "headers",
            T.ArrayType(T.StructType([T.StructField("key", T.StringType()), T.StructField("value", T.BinaryType())])),
        ),
        T.StructField("timestamp", T.LongType()),
    ]
)
"""The records :func:`_read_large` hands to Python, as Spark's Kafka source gives them."""


_KINDS = {
    T.LongType: "l",
    T.IntegerType: "i",
    T.ShortType: "s",
    T.ByteType: "b",
    T.DoubleType: "d",
    T.FloatType: "f",
    T.StringType: "S",
    T.BooleanType: "z",
}
"""The type codes of ``dbsp.RecordDecoder``'s schema argument; ``?``: any other type."""


def _decoder(spark: SparkSession, schema: T.StructType) -> tuple[str, str]:
    """The name of ``dbsp.RecordDecoder`` registered in ``spark`` for ``schema``'s rows,
    and the schema as its second argument (see the class)."""
    text = "".join(
        f"{_KINDS.get(type(f.dataType), '?')}{len(f.name.encode('utf-16-le')) // 2}:{f.name}" for f in schema.fields
    )
    name = f"dbsp_decode_{hashlib.sha256(schema.json().encode()).hexdigest()[:16]}"
    returns = T.StructType([*schema.fields, T.StructField(WEIGHT, T.LongType())])
    try:
        spark.udf.registerJavaFunction(name, "dbsp.RecordDecoder", returns)
    except Exception as error:
        if "ClassNotFound" not in str(error) and "CANNOT_LOAD_FUNCTION_CLASS" not in str(error):
            raise
        raise SourceError(
            "the Spark server has no dbsp.RecordDecoder class: it was started without the engine's "
            "decoder JAR (circuits.jvm.decoder_jar); restart it (`dbsp stop` for the embedded one), or add "
            "the JAR `dbsp jars --copy-to DIR` writes to a cluster's spark.jars"
        ) from error
    return name, text


def _decode_tasks(
    fields: dict[str, Fields], taken: dict[tuple[str, str], int], batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """The ``mapInArrow`` body of :func:`_read_large`'s Python decoder: the rows of each
    record, as the engine's reader gives them, then a row per gateway source it took bytes
    of (see :func:`_read_tasks`).  A task holds one topic partition, in offset order."""
    seen = dict(taken)
    for batch in batches:
        rows = []
        for r in batch.to_pylist():
            headers = [(h["key"], h["value"]) for h in r["headers"] or ()]
            records = _records(
                r["topic"], r["partition"], r["offset"], r["key"], r["value"], headers, fields[r["topic"]], seen
            )
            rows.extend(row | {"timestamp": r["timestamp"]} for row in records)
        yield pa.RecordBatch.from_pylist(rows, schema=_RAW_ARROW)
    yield _taken_rows(seen, taken)


def _taken_rows(seen: dict[tuple[str, str], int], taken: dict[tuple[str, str], int]) -> pa.RecordBatch:
    ends = [{"topic": t, "key": k, "taken": end} for (t, k), end in seen.items() if taken.get((t, k)) != end]
    return pa.RecordBatch.from_pylist(ends, schema=_RAW_ARROW)


def _large_read_failed(
    bootstrap_servers: str, ranges: list[Range], timeout: float, error: BaseException
) -> SourceError | None:
    """The error behind a job failed by Spark's Kafka source, found as the engine's reader
    finds it: by what the broker says of each range's partition now."""
    text = str(error)
    if not any(mark in text for mark in _KAFKA_FAILURES):
        return None
    settings = consumer_config(bootstrap_servers)
    for r in ranges:
        watermarks = _watermarks(settings, r.source, r.partition, timeout)
        if isinstance(watermarks, str) or watermarks[0] > r.start:
            return undelivered((r.source, r.partition, r.start, r.end), r.start, watermarks, timeout, bootstrap_servers)
        if watermarks[1] < r.end:
            # The offsets up to the broker's end were there to read: the rest are missing.
            position = max(r.start, watermarks[1])
            return undelivered(
                (r.source, r.partition, r.start, r.end), position, watermarks, timeout, bootstrap_servers
            )
    seen = next((line.strip() for line in text.splitlines() if any(m in line for m in _KAFKA_FAILURES)), text)
    return BrokerStalledError(
        f"the broker at {bootstrap_servers!r} holds every offset of the step's ranges, but Spark's Kafka source "
        f"failed to read them: {seen[:500]}; check the broker's log"
    )


def _split(chunks: list[tuple[str, int, int, int]]) -> bool:
    """Whether a partition is read by more than one task."""
    return len({(topic, partition) for topic, partition, _, _ in chunks}) < len(chunks)


def _first_copies(raw: DataFrame, partitions: int) -> DataFrame:
    """The rows without the gateway records that a task of a split partition took again:
    of the copies of a record (its source's bytes from one position), the one at the
    lowest offset; in the ``partitions`` of the read.  The copies meet in a shuffle of
    the framed rows alone, into as many partitions, not the session's shuffle partitions:
    each partition of every frame over the read is a writer task of the input log, and
    an empty writer task costs about as much as a small one (``bench/RESULTS.md``)."""
    copies = Window.partitionBy("topic", "key", "position").orderBy("offset")
    framed = raw.where(F.col("position").isNotNull()).repartition(partitions, "topic", "key")
    first = framed.withColumn("_copy", F.row_number().over(copies)).where(F.col("_copy") == 1).drop("_copy")
    return raw.where(F.col("position").isNull()).unionByName(first).coalesce(partitions)
