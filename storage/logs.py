"""The input log, the division of input into steps, and the output log (docs/design.md)."""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from circuits.records import TIMESTAMPS, Culprit
from circuits.spark import aggregate_each
from circuits.zset import WEIGHT, with_weight_schema

from . import location
from .delta import (
    WrittenFiles,
    add_actions,
    arrow_schema,
    commit,
    latest,
    read_files,
    table_identity,
    table_schema,
    transaction_version,
    write_tables,
)
from .errors import (
    CancelledError,
    DivisionConflictError,
    InputTimeoutError,
    OutputMismatchError,
    StepOrderError,
)
from .faults import failpoint
from .tables import TABLE_CONFIG, dataset, open_table

STEP = "_step"
DEAD_LETTERS = "_dead_letters"


def output_uri(root: str, handle: str) -> str:
    """Where output handle ``handle`` of the pipeline at ``root`` is logged."""
    return os.path.join(root, "outputs", handle)


def output_steps(root: str, handle: str) -> int:
    """The steps the output log of ``handle`` of the pipeline at ``root`` holds (0: no log)."""
    return _next_step(output_uri(root, handle), "output")


def _next_step(uri: str, app_id: str) -> int:
    """One past the last step recorded under ``app_id`` (0 when none)."""
    last = transaction_version(uri, app_id)
    return 0 if last is None else last + 1


_RECORDED: dict[tuple, int] = {}


def _recorded(uri: str, app_id: str, step: int) -> bool:
    """Whether ``step`` is recorded under ``app_id``.  A recorded step stays recorded, so a
    yes is remembered (per table as created) and asks the table nothing the next time."""
    key = (table_identity(uri), app_id)
    if key[0] is not None and _RECORDED.get(key, 0) > step:
        return True
    next_step = _next_step(uri, app_id)
    if key[0] is not None:
        _RECORDED[key] = max(_RECORDED.get(key, 0), next_step)
    return next_step > step


def files_of_steps(table: DeltaTable | None, first: int, last: int) -> list[dict]:
    """The add actions (with ``uri``: the file's full path) of the data files of the
    step-keyed ``table`` that may hold rows of steps ``first..=last``, by their ``_step``
    statistics (a file without them may hold any step).  No table: no files."""
    if table is None:
        return []
    root = table.table_uri.rstrip("/")
    adds = add_actions(table)
    if f"min.{STEP}" in adds.column_names:
        # Chosen in Arrow: a log gains a file a step, and these are the few a run asks for.
        low, high = adds.column(f"min.{STEP}"), adds.column(f"max.{STEP}")
        admitted = pc.or_kleene(pc.is_null(low), pc.and_(pc.less_equal(low, last), pc.greater_equal(high, first)))
        adds = adds.filter(admitted)
    return [{**a, "uri": f"{root}/{a['path']}"} for a in adds.to_pylist()]


def step_rows(
    table: DeltaTable, first: int, last: int, column: str = STEP, columns: list[str] | None = None
) -> pa.Table:
    """The rows of steps ``first..=last`` (by ``column``) of the step-keyed ``table``, read
    by this process from the files whose statistics admit those steps."""
    wanted = (pc.field(column) >= first) & (pc.field(column) <= last)
    return dataset(table, [(column, ">=", first), (column, "<=", last)]).to_table(columns=columns, filter=wanted)


def _step_schema(schema: T.StructType) -> T.StructType:
    return T.StructType([*with_weight_schema(schema).fields, T.StructField(STEP, T.LongType())])


def read_steps(spark: SparkSession, uri: str, first: int, last: int) -> DataFrame:
    """Rows of steps ``first..=last`` of the step-keyed table ``uri``, with their ``_step``
    (only the files whose statistics admit those steps are read)."""
    table = open_table(uri)
    if table is None:
        raise StepOrderError(f"{uri} has no steps yet")
    files = [f["uri"] for f in files_of_steps(table, first, last)]
    return read_files(spark, uri, table_schema(table), files).where(F.col(STEP).between(first, last))


def _multiset_digests(frames: list[DataFrame]) -> list[tuple]:
    """Each frame's (rows, sum of row hashes), all with one Spark job: equal for equal
    multisets of rows (a replay's output is verified with them; the row-by-row diff runs
    only on a mismatch)."""
    hashes = [df.select(F.xxhash64(*df.columns).cast("decimal(38,0)").alias("_h")) for df in frames]
    return [found or (0, None) for found in aggregate_each(hashes, F.count(F.lit(1)), F.sum("_h"))]


@dataclass(frozen=True)
class Range:
    """Offsets ``start`` (inclusive) to ``end`` (exclusive) of one partition of one source."""

    source: str
    partition: int
    start: int
    end: int


def records(ranges: list[Range]) -> int:
    """The records of a division: its offsets (an offset a source skips counts too)."""
    return sum(r.end - r.start for r in ranges)


_DIVISION_SCHEMA = pa.schema(
    [
        ("step", pa.int64()),
        ("source", pa.string()),
        ("partition", pa.int64()),
        ("start", pa.int64()),
        ("end", pa.int64()),
    ]
)


class DivisionLog:
    """The durable division of input into steps: which offset ranges make up each step."""

    def __init__(self, root: str) -> None:
        self.uri = os.path.join(root, "_divisions")

    def next_step(self) -> int:
        return _next_step(self.uri, "division")

    def record(self, step: int, ranges: list[Range]) -> None:
        """Records ``step``'s ranges once.  The same ranges again are a no-op; different
        ranges, or a step that is not the next one, are errors."""
        ranges = sorted(ranges, key=lambda r: (r.source, r.partition))
        expected = self.next_step()
        if step < expected:
            recorded = self.get(step)
            if recorded != ranges:
                raise DivisionConflictError(
                    f"step {step} was divided as {recorded}; refusing to record {ranges} (a step's input never moves)"
                )
            return
        if step > expected:
            raise StepOrderError(f"cannot record the division of step {step}: step {expected} is not recorded yet")
        rows = [
            {"step": step, "source": r.source, "partition": r.partition, "start": r.start, "end": r.end} for r in ranges
        ]
        with latest(self.uri) as table:
            write_deltalake(
                self.uri if table is None else table,
                pa.Table.from_pylist(rows, schema=_DIVISION_SCHEMA),
                mode="append",
                configuration=TABLE_CONFIG,
                commit_properties=CommitProperties(app_transactions=[Transaction("division", step)]),
                storage_options=location.delta_options(self.uri),
            )

    def last_recorded_at(self) -> float | None:
        """When the latest division was recorded (seconds since the epoch), None before the first."""
        table = open_table(self.uri)
        return None if table is None or table.version() == 0 else table.history(1)[0]["timestamp"] / 1000

    def get(self, step: int) -> list[Range]:
        return self.steps(step, step).get(step, [])

    def all(self) -> dict[int, list[Range]]:
        return self.steps(0, None)

    def steps(self, first: int, last: int | None) -> dict[int, list[Range]]:
        """``step -> ranges`` of the recorded steps ``first..=last`` (``None``: the latest).
        The table gains a file per step; only the files whose statistics admit those steps
        are read, so a run's reads do not grow with the pipeline's age."""
        table = open_table(self.uri)
        if table is None:
            return {}
        out: dict[int, list[Range]] = {}
        for r in step_rows(table, first, 2**63 - 1 if last is None else last, "step").to_pylist():
            out.setdefault(r["step"], []).append(Range(r["source"], r["partition"], r["start"], r["end"]))
        return {s: sorted(rs, key=lambda r: (r.source, r.partition)) for s, rs in sorted(out.items())}


DEAD_LETTER_SCHEMA = T.StructType(
    [
        T.StructField("topic", T.StringType()),
        T.StructField("partition", T.LongType()),
        T.StructField("offset", T.LongType()),
        T.StructField("reason", T.StringType()),
        T.StructField("value", T.StringType()),
    ]
)
"""A record that could not be decoded: where it was read, why, and its value as text."""
RECORD_ERROR_FIELDS = [
    T.StructField("input", T.StringType()),
    T.StructField("view", T.StringType()),
    T.StructField("file", T.StringType()),
    T.StructField("line", T.LongType()),
    T.StructField("expression", T.StringType()),
]
"""What a dead letter adds when a decoded record made a view's expression fail (see
:mod:`circuits.records`): its input handle (its ``value`` is then the row as JSON, with its
``_weight``), and the view, file, line and expression as written; null for a record that
could not be decoded.  A dead-letter table created before these fields existed keeps its
columns: such a record's ``reason`` names them all the same."""
DEAD_LETTER_TABLE_SCHEMA = T.StructType([*DEAD_LETTER_SCHEMA.fields, *RECORD_ERROR_FIELDS])
RECORD_ERROR = "record_error"
"""The app transaction of a step's records that made an expression fail."""
LEFT_OUT = "left_out"
"""The app transaction of every commit of records left out of a step (by an expression's
failure or by hand): a table without it holds none."""


TAKEN_SCHEMA = T.StructType(
    [
        T.StructField("topic", T.StringType()),
        T.StructField("source", T.StringType()),
        T.StructField("end", T.LongType()),
    ]
)
"""A row of the bytes taken of a source (a gateway's): ``end``, the end of those a step read."""
TAKEN = "_taken"


@dataclass(frozen=True)
class StepInput:
    deltas: dict[str, DataFrame]
    """Each input handle's delta of the step; a handle without rows is absent."""
    retracting: set[str]
    """The handles whose delta may hold a negative weight (by the files' statistics)."""
    rows: int | None
    """Rows of every delta together, by the files' statistics (None: a file has none)."""


def _step_input(files: dict[str, list[tuple[int | None, int | None]]], frame) -> StepInput:
    """A step's input from each handle's data files, as ``(rows, least weight)`` by their
    statistics (None: not recorded), and ``frame(handle)``, the handle's delta; a handle
    without files is absent, so that the step knows it is empty."""
    deltas, retracting, rows = {}, set(), 0
    for handle, stats in files.items():
        if not stats:
            continue
        counts = [count for count, _ in stats]
        rows = None if rows is None or None in counts else rows + sum(counts)
        deltas[handle] = frame(handle)
        if any(least is None or least < 0 for _, least in stats):
            retracting.add(handle)
    return StepInput(deltas, retracting, rows)


def _file_stats(stats: str) -> tuple[int | None, int | None]:
    """A written file's ``(rows, least weight)`` from its Delta statistics (JSON)."""
    parsed = json.loads(stats)
    return parsed.get("numRecords"), parsed.get("minValues", {}).get(WEIGHT)


def _conformed(df: DataFrame, schema: T.StructType) -> DataFrame:
    """``df`` with exactly the columns and types the input log writes for ``schema``, as
    the step expects of its deltas (planned on the client: no round trip)."""
    return df.select(*(F.col(f.name).cast(f.dataType) for f in with_weight_schema(schema).fields))


def record_reason(culprit: Culprit) -> str:
    """A dead letter's reason for a record that made a view's expression fail."""
    source = culprit.source
    where = "" if source is None else f"view {source.view!r} ({source.file}:{source.line}), {source.expression}: "
    return f"{where}{culprit.message}"


def dead_letters_uri(root: str) -> str:
    """The pipeline's table of input records that could not be decoded."""
    return os.path.join(root, DEAD_LETTERS)


def input_uri(root: str, handle: str) -> str:
    """The table of input ``handle``'s Z-sets, one per step."""
    return os.path.join(root, "inputs", handle)


class InputLog:
    """Each step's input Z-sets, persisted per input handle under ``<root>/inputs``, so a
    replay never depends on the source's retention.  Records that could not be decoded
    go to the dead-letter table ``<root>/_dead_letters`` with their step, offset and reason.
    The end of the bytes each step took of each byte-ranged source (a source gateway's) goes
    to ``<root>/_taken`` (:data:`TAKEN_SCHEMA`), committed before the step's inputs: the
    read of a later step drops those bytes when a source sends them again.

    A step persisted with ``keep`` is read (once) from the frames it was written from,
    the batch its source read into the session, rather than from the log's files: the
    step's job does not read back what the ingest's job has just written.  The log is
    still committed before the step runs, so recovery replays it unchanged.
    """

    def __init__(self, spark: SparkSession, root: str, schemas: dict[str, T.StructType]) -> None:
        self.spark = spark
        self.root = root
        self.schemas = schemas
        self._kept: dict[int, StepInput] = {}

    def uri(self, handle: str) -> str:
        return input_uri(self.root, handle)

    @property
    def dead_letters_uri(self) -> str:
        return dead_letters_uri(self.root)

    @property
    def taken_uri(self) -> str:
        return os.path.join(self.root, TAKEN)

    def persisted(self, step: int) -> bool:
        return all(_recorded(self.uri(h), "input", step) for h in self.schemas)

    def taken_before(self, step: int) -> dict[tuple[str, str], int]:
        """Per ``(topic, source)``: the end of the bytes steps before ``step`` took.  Only
        earlier steps count, so a step read again (a crash before its inputs were
        committed) drops exactly what its first read dropped."""
        table = open_table(self.taken_uri)
        if table is None:
            return {}
        rows = dataset(table, [(STEP, "<", step)]).to_table(filter=pc.field(STEP) < step)
        ends = rows.group_by(["topic", "source"]).aggregate([("end", "max")]).to_pylist()
        return {(r["topic"], r["source"]): r["end_max"] for r in ends}

    def persist(
        self,
        step: int,
        inputs: dict[str, DataFrame],
        dead_letters: DataFrame | None = None,
        taken: DataFrame | None = None,
        keep: bool = False,
        records: int | None = None,
        rest: Callable[[], tuple[dict[str, DataFrame], DataFrame | None, DataFrame | None] | None] | None = None,
    ) -> None:
        """Writes ``step``'s input for every handle (absent handles: empty), its dead
        letters (``DEAD_LETTER_SCHEMA``) and the bytes it took (``TAKEN_SCHEMA``), once,
        with one Spark job (none when every input is absent; a second for ``rest``): each table by writers of its
        own when ``records``, the records of the step's division, are more than
        :data:`storage.delta.APART_ROWS` (see :func:`storage.delta.write_tables`).  The dead letters and the
        bytes taken are committed before the inputs, whose commits mark the step
        persisted; a failed job commits nothing.  ``keep``: :meth:`read` returns
        ``inputs`` themselves for the step (until :meth:`forget`), so they must stay
        readable, and give the same rows, until the step has run.  ``rest``: what a source's
        first job left out (``inputs``, ``dead_letters``, ``taken``, or None when nothing),
        asked for once that job has run and written by a second one; such a read is not
        kept (its frames would read the source again)."""
        todo = {h: s for h, s in self.schemas.items() if not _recorded(self.uri(h), "input", step)}
        if not todo:
            return
        parts, written = self._parts(step, todo, inputs, dead_letters, taken)
        if parts:
            written |= write_tables(parts, size=records)
        more = rest() if rest is not None else None
        if more is not None:  # the records the first job left: their files join the same commits
            parts, _ = self._parts(step, todo, *more)
            for name, files in write_tables(parts).items():
                if name in written:
                    written[name].actions.extend(files.actions)
                else:
                    written[name] = files
        # No empty version for a step without dead letters or byte-ranged sources: a replay
        # that finds none recorded reads the same records and writes the same nothing.
        dead = written.pop(DEAD_LETTERS, None)
        if dead is not None and dead.actions:
            commit(dead, "dead_letter", step)
        taken_files = written.pop(TAKEN, None)
        if taken_files is not None and taken_files.actions:
            commit(taken_files, "taken", step)
            failpoint("after_taken", step)
        for files in written.values():
            commit(files, "input", step)
        if keep and rest is None and len(todo) == len(self.schemas):
            self._kept[step] = _step_input(
                {h: [_file_stats(a.stats) for a in written[h].actions] for h in todo},
                lambda h: _conformed(inputs[h], self.schemas[h]),
            )

    def _parts(
        self,
        step: int,
        todo: dict[str, T.StructType],
        inputs: dict[str, DataFrame],
        dead_letters: DataFrame | None,
        taken: DataFrame | None,
    ) -> tuple[dict[str, tuple[str, DataFrame]], dict[str, WrittenFiles]]:
        """What :meth:`persist` writes of ``step``: per table its uri and rows (with the
        step), and the handles of ``todo`` without rows, as tables written empty."""
        parts, empty = {}, {}
        for handle, schema in todo.items():
            df = inputs.get(handle)
            if df is None:  # nothing to write; the commit still marks the step
                empty[handle] = WrittenFiles(self.uri(handle), arrow_schema(_step_schema(schema)), [])
            else:
                parts[handle] = (self.uri(handle), df)
        before = {
            DEAD_LETTERS: (self.dead_letters_uri, "dead_letter", dead_letters, DEAD_LETTER_SCHEMA, RECORD_ERROR_FIELDS),
            TAKEN: (self.taken_uri, "taken", taken, TAKEN_SCHEMA, []),
        }
        for name, (uri, app_id, df, schema, nulls) in before.items():
            if df is not None and not _recorded(uri, app_id, step):
                parts[name] = (
                    uri,
                    df.select(*schema.names, *[F.lit(None).cast(f.dataType).alias(f.name) for f in nulls]),
                )
        step_column = F.lit(step).cast("bigint")
        return {n: (uri, df.withColumn(STEP, step_column)) for n, (uri, df) in parts.items()}, empty

    def forget(self, step: int) -> None:
        """Drops the frames kept for ``step`` (see :meth:`persist`): read it from the log."""
        self._kept.pop(step, None)

    def dead_letters(self) -> DataFrame:
        """Every dead letter so far, with its ``_step`` (:data:`DEAD_LETTER_TABLE_SCHEMA`)."""
        table = open_table(self.dead_letters_uri)
        schema = T.StructType([*DEAD_LETTER_TABLE_SCHEMA.fields, T.StructField(STEP, T.LongType())])
        return read_files(self.spark, self.dead_letters_uri, schema, [] if table is None else table.file_uris())

    def admitted(self, handle: str, first: int, last: int) -> DataFrame:
        """Input ``handle``'s rows of steps ``first..=last`` (with their ``_step``), without
        the records left out of those steps (:meth:`record_errors`): what the views were
        computed from."""
        logged = read_steps(self.spark, self.uri(handle), first, last)
        schema = _step_schema(self.schemas[handle])
        left_out = self.dead_letters().where((F.col("input") == handle) & F.col(STEP).between(first, last))
        parsed = F.from_json("value", with_weight_schema(self.schemas[handle]), TIMESTAMPS).alias("r")
        return logged.exceptAll(left_out.select(parsed, STEP).select("r.*", STEP).select(*schema.names))

    def record_errors(self, step: int) -> list[tuple[str, str]]:
        """The records of ``step`` to leave out of it: those that made a view's expression
        fail (:meth:`add_record_errors`) and those quarantined (:meth:`quarantine`), as
        (input handle, the row as JSON) pairs."""
        with latest(self.dead_letters_uri) as table:
            # Most pipelines never leave a record out: the table's log says so, no file read.
            if table is None or table.transaction_version(LEFT_OUT) is None:
                return []
            if "input" not in pa.schema(table.schema().to_arrow()).names:
                return []  # a table from before the record fields: a replay finds its records again
            rows = dataset(table, [(STEP, "=", step)]).to_table(
                filter=(pc.field(STEP) == step) & pc.field("input").is_valid(), columns=["input", "value"]
            )
        return list(zip(rows.column("input").to_pylist(), rows.column("value").to_pylist(), strict=True))

    def add_record_errors(self, step: int, culprits: list[Culprit]) -> None:
        """Dead-letters ``culprits``, the records of ``step`` that made a view's expression
        fail (once: a step's are committed together, before its outputs)."""
        if _recorded(self.dead_letters_uri, RECORD_ERROR, step):
            return
        rows = [
            {
                "reason": record_reason(c),
                "value": c.value,
                "input": c.handle,
                **({} if c.source is None else dataclasses.asdict(c.source)),
                STEP: step,
            }
            for c in culprits
        ]
        self._append_dead_letters(rows, [Transaction(RECORD_ERROR, step), Transaction(LEFT_OUT, step)], named=False)

    def quarantine(self, step: int, handle: str, value: str) -> None:
        """Dead-letters the record ``value`` (its columns and ``_weight`` as JSON, as
        :func:`circuits.records.record_json` writes it) of input ``handle`` in ``step``, which
        is not committed yet: run or replayed, the step leaves it out."""
        reason = "quarantined by hand: the step left it out"
        row = {"reason": reason, "value": value, "input": handle, STEP: step}
        self._append_dead_letters([row], [Transaction(LEFT_OUT, step)], named=True)

    def _append_dead_letters(self, rows: list[dict], transactions: list[Transaction], named: bool) -> None:
        """Appends ``rows`` (:data:`DEAD_LETTER_TABLE_SCHEMA` and ``_step``) to the dead
        letters.  A table from before the record fields keeps its columns (a replay finds
        such records again), unless the rows must be ``named``: found by their input."""
        schema = arrow_schema(T.StructType([*DEAD_LETTER_TABLE_SCHEMA.fields, T.StructField(STEP, T.LongType())]))
        with latest(self.dead_letters_uri, schema) as table:
            if named and "input" not in pa.schema(table.schema().to_arrow()).names:
                raise StepOrderError(
                    f"{self.dead_letters_uri} was created before dead letters named their input; a record cannot be "
                    "left out of a step there: rename the table aside (its records stay readable) and run again"
                )
            write_deltalake(
                table,
                pa.Table.from_pylist(rows, schema=schema).select(pa.schema(table.schema().to_arrow()).names),
                mode="append",
                commit_properties=CommitProperties(app_transactions=transactions),
            )

    def read(self, step: int, timeout: float = 60.0, cancel: threading.Event | None = None) -> StepInput:
        """``step``'s input; blocks until it is persisted, ``timeout`` passes, or ``cancel`` is set."""
        kept = self._kept.pop(step, None)
        if kept is not None:
            return kept
        deadline = time.monotonic() + timeout
        while not self.persisted(step):
            if cancel is not None and cancel.is_set():
                raise CancelledError(f"reading the input of step {step} was cancelled")
            if time.monotonic() > deadline:
                raise InputTimeoutError(f"the input of step {step} did not arrive within {timeout:g} s")
            time.sleep(0.1)
        files = {}
        for handle in self.schemas:
            with latest(self.uri(handle)) as table:  # the kept handle: an open costs 5-10 ms
                files[handle] = files_of_steps(table, step, step)
        return _step_input(
            {h: [(f["num_records"], f[f"min.{WEIGHT}"]) for f in found] for h, found in files.items()},
            lambda h: (
                read_files(self.spark, self.uri(h), _step_schema(self.schemas[h]), [f["uri"] for f in files[h]])
                .where(F.col(STEP) == step)
                .drop(STEP)
            ),
        )


class OutputLog:
    """Each output handle's changes per step under ``<root>/outputs/<handle>`` (with ``_step``),
    written exactly as the design's ``write`` (docs/design.md)."""

    def __init__(self, spark: SparkSession, root: str, verify: bool = True) -> None:
        self.spark = spark
        self.root = root
        self.verify = verify
        self._replayed: list[tuple[str, int, WrittenFiles]] = []

    def uri(self, handle: str) -> str:
        return output_uri(self.root, handle)

    def first(self, handle: str) -> int:
        table = open_table(self.uri(handle))
        retained = None if table is None else table.metadata().configuration.get("dbsp.first_step")
        return int(retained) if retained else 0

    def last(self, handle: str) -> int:
        return output_steps(self.root, handle)

    def write(self, step: int, outputs: dict[str, WrittenFiles]) -> None:
        """Below ``first``: discard.  In ``first..last``: discard (and, verifying, compare,
        by :meth:`verify_replayed`).  At ``last``: append.  Beyond ``last``: an error."""
        for handle, files in outputs.items():
            last = self.last(handle)
            if step > last:
                raise StepOrderError(f"output {handle!r}: cannot write step {step}, the next step to write is {last}")
            if step == last:
                self.verify_replayed()  # no new output follows a replay that differs
                commit(files, "output", step)
            elif step >= self.first(handle) and self.verify:
                self._replayed.append((handle, step, files))

    def discard_replayed(self) -> None:
        """Forgets replayed steps not verified yet: a run that failed before verifying left
        them, and its files are no concern of the next run (vacuum may delete them)."""
        self._replayed = []

    def verify_replayed(self) -> None:
        """Compares the output of every step replayed since the last call with the output
        written before, with one Spark job for all of them (call it before a checkpoint
        commit).  A mismatch raises :class:`OutputMismatchError` with the differing rows."""
        replayed, self._replayed = self._replayed, []
        if not replayed:
            return
        pairs = []
        for handle, step, files in replayed:
            stored = self.read(handle, step, step)
            pairs.append((stored, read_files(self.spark, files.uri, stored.schema, files.paths)))
        digests = _multiset_digests([df for pair in pairs for df in pair])
        for (handle, step, _), (stored, now), before, after in zip(
            replayed, pairs, digests[::2], digests[1::2], strict=True
        ):
            if before == after:
                continue
            missing = stored.exceptAll(now).limit(5).collect()
            extra = now.exceptAll(stored).limit(5).collect()
            if missing or extra:
                raise OutputMismatchError(
                    f"output {handle!r}, step {step}: the replayed output differs from the output written before; "
                    f"only before: {[tuple(r) for r in missing]}, only now: {[tuple(r) for r in extra]}"
                )

    def read(self, handle: str, first: int, last: int) -> DataFrame:
        """The changes of steps ``first..=last`` with their ``_step`` (join the division log for offsets)."""
        return read_steps(self.spark, self.uri(handle), first, last)
