"""Delta tables as inputs: a step of a table is a range of its versions, read from the
table's change data feed.

An input whose source is ``delta:<path>`` is divided like a Kafka partition: one
:class:`storage.logs.Range` per table, source ``delta:<path>``, partition 0, ``start`` to
``end`` (exclusive) the table's versions, so the division log, the water-filling of
:func:`sensors.division.plan` and the input log serve both (a version counts as one
record).  The sensor learns the latest version from delta-rs (no Spark); the step reads
the range's changes with delta-spark's change-feed reader on the Spark server, each row
weighted by its ``_change_type``, and the pipeline persists them to the input log like
any input, so a replay never reads the table again.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from deltalake import DeltaTable
from deltalake.exceptions import DeltaError, TableNotFoundError
from pyspark.errors import AnalysisException
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from circuits.zset import WEIGHT
from storage import location
from storage.errors import StorageError
from storage.logs import Range
from storage.pipeline import StepInput

from .errors import (
    ChangeFeedMissingError,
    ChangesVacuumedError,
    DeltaInputError,
    DeltaTableMissingError,
    InputColumnsChangedError,
    TableRewrittenError,
)

DELTA = "delta:"
"""The prefix of a Delta table input's source (Kafka topic names cannot hold ``:``)."""
TABLE = "table:"
"""The prefix of an input read from a Delta table by its name in the Spark session's catalog."""
CATALOG_RECORD = "_catalog_tables.json"
"""Beside a pipeline's tables: the location each of its ``table:<name>`` inputs was found at."""
CHANGE_FEED = "delta.enableChangeDataFeed"
CHANGE_WEIGHTS = {"insert": 1, "update_postimage": 1, "delete": -1, "update_preimage": -1}
"""The Z-set weight of each ``_change_type`` of Delta's change data feed."""


def is_table(source: str) -> bool:
    return source.startswith(DELTA)


def table_path(source: str) -> str:
    return source.removeprefix(DELTA)


def catalog_tables(
    names: dict[str, str], root: str, session: Callable[[], SparkSession], verify: bool
) -> dict[str, str]:
    """Each input's source with every ``table:<name>`` replaced by ``delta:<location>``, the
    location the Spark session's catalog gave for the name the first time (recorded in the
    pipeline's ``root``, so the sensor asks Spark once and the divisions name one table).
    ``verify``: ask the catalog again (a step run, which holds a session anyway): a name
    that now names another location is refused; a name the catalog no longer knows (an
    in-memory catalog after its server restarted) keeps its recorded location."""
    named = {h: s.removeprefix(TABLE) for h, s in names.items() if s.startswith(TABLE)}
    if not named:
        return names
    record = f"{root}/{CATALOG_RECORD}"
    found = json.loads(location.read_text(record)) if location.exists(record) else {}
    missing = sorted(set(named.values()) - set(found))
    for name in sorted(set(named.values())) if verify else missing:
        now = _catalog_location(session(), name, name in found)
        if now is not None and found.setdefault(name, now) != now:
            raise TableRewrittenError(
                f"table {name}: the catalog names {now}, but the pipeline has read it at {found[name]}; "
                f"point the input at delta:{found[name]} to go on, or start the pipeline anew on a new store root"
            )
    if missing:
        location.makedirs(root)
        location.write_text(record, json.dumps(found, indent=1, sort_keys=True))
    return {h: DELTA + found[named[h]] if h in named else s for h, s in names.items()}


def _catalog_location(spark: SparkSession, name: str, known: bool) -> str | None:
    """Where the catalog keeps Delta table ``name`` (None: not in it, but ``known`` before)."""
    try:
        detail = spark.sql(f"DESCRIBE DETAIL {name}").first()
    except AnalysisException as e:
        if "TABLE_OR_VIEW_NOT_FOUND" not in str(e):
            raise DeltaInputError(f"table {name}: the Spark catalog cannot describe it: {e}") from e
        if known:
            return None
        raise DeltaTableMissingError(
            f"table {name}: not in the Spark session's catalog; create it (CREATE TABLE {name} ... USING delta "
            f"TBLPROPERTIES ({CHANGE_FEED} = true)) or give its path as delta:/path/to/table"
        ) from None
    if (detail["format"] or "").lower() != "delta":
        raise DeltaInputError(
            f"table {name}: a {detail['format']} table, not a Delta table; an input is read from a Delta table's "
            "change data feed"
        )
    where = detail["location"]
    return location.s3_uri(where) if where.startswith(("s3a:", "s3:")) else re.sub("^file:(//)?", "", where)


def open_table(source: str, version: int | None = None) -> DeltaTable:
    """delta-rs's handle of the table of ``source`` (``delta:<path>``) at ``version`` (default: the latest)."""
    path = table_path(source)
    try:
        return DeltaTable(path, version=version, storage_options=location.delta_options(path))
    except TableNotFoundError:
        raise DeltaTableMissingError(
            f"table {path}: no Delta table is there; create it with the change data feed on "
            f"(CREATE TABLE ... TBLPROPERTIES ({CHANGE_FEED} = true)) or correct the input's path"
        ) from None
    except (DeltaError, OSError) as e:
        if version is None:
            raise DeltaInputError(f"table {path}: delta-rs cannot open it: {e}") from e
        raise _vacuumed(path, version, version) from e  # the log's retention removed the version


def _vacuumed(path: str, first: int, last: int) -> ChangesVacuumedError:
    return ChangesVacuumedError(
        f"table {path}: the change data of versions {first}..{last} is gone (removed by VACUUM, or by the log's "
        "retention) and cannot be read; keep a table's files and log longer than the pipeline's lag: raise "
        "delta.deletedFileRetentionDuration and delta.logRetentionDuration (ALTER TABLE ... SET TBLPROPERTIES) and "
        "VACUUM with a longer RETAIN. To go on without those changes, start the pipeline anew on a new store root"
    )


def went_back(source: str, start: int, end: int) -> TableRewrittenError:
    """The error for a table whose next version, ``end``, is below ``start``, where the
    division log says the next step starts: the table was deleted and created again."""
    return TableRewrittenError(
        f"table {table_path(source)}: its latest version is {end - 1}, but steps have read it up to version "
        f"{start - 1}; it was deleted and created again. Point the input at the table it was, or start the "
        "pipeline anew on a new store root"
    )


def _rewrite(commit: dict) -> str | None:
    """What a commit did that does not continue the versions before it (None: nothing)."""
    operation = commit.get("operation", "")
    mode = (commit.get("operationParameters") or {}).get("mode")
    if operation == "RESTORE":
        return f"was restored to version {(commit.get('operationParameters') or {}).get('version')}"
    if "REPLACE" in operation:
        return f"was replaced ({operation})"
    if mode == "Overwrite":
        return f"was overwritten ({operation} in mode Overwrite)"
    return None


@dataclass(frozen=True)
class DeltaTables:
    """A pipeline's Delta table inputs: per input handle its source, ``delta:<path>``.
    Its :meth:`read` serves :data:`storage.pipeline.StepReader` for those handles."""

    tables: dict[str, str]

    @property
    def sources(self) -> list[str]:
        return sorted(set(self.tables.values()))

    def positions(self) -> dict[tuple[str, int], tuple[int, int]]:
        """Per table ``(source, 0)``: ``(0, latest version + 1)``, the versions a step may take."""
        return {(s, 0): (0, open_table(s).version() + 1) for s in self.sources}

    def check(self, ranges: list[Range]) -> None:
        """Refuses, naming the table, a range of versions a step cannot take whole: one
        without the change data feed, or one in which the table was overwritten, replaced
        or restored."""
        for r in ranges:
            if is_table(r.source) and r.end > r.start:
                for version in (r.start, r.end - 1):
                    _check_change_feed(r.source, version, r)
                _check_continued(r.source, r)

    @contextmanager
    def read(
        self,
        spark: SparkSession,
        ranges: list[Range],
        schemas: dict[str, T.StructType],
        taken: dict[tuple[str, str], int],
    ) -> Iterator[StepInput]:
        """Each handle's changes over its table's range, weighted (planned: the input log's
        job reads them); a table without a range in the step is an empty input."""
        try:
            yield ranged_input(self.tables, ranges, lambda h, s, r: changes(spark, s, r, h, schemas[h]))
        except StorageError as e:
            raise read_failed(e, [r for r in ranges if r.end > r.start]) or e from e


def ranged_input(
    sources: dict[str, str], ranges: list[Range], changes: Callable[[str, str, Range], DataFrame]
) -> StepInput:
    """A step's input from versioned sources (``sources``: per input handle its source):
    ``changes(handle, source, range)`` for each handle whose source has a range of some
    versions in the step; the others are empty inputs."""
    by_source = {r.source: r for r in ranges if r.end > r.start}
    return StepInput({h: changes(h, s, by_source[s]) for h, s in sources.items() if s in by_source})


def _check_change_feed(source: str, version: int, r: Range) -> None:
    configuration = open_table(source, version).metadata().configuration
    if configuration.get(CHANGE_FEED, "false").lower() != "true":
        path = table_path(source)
        raise ChangeFeedMissingError(
            f"table {path}: version {version} has no change data feed ({CHANGE_FEED} is not true there), and the next "
            f"step reads the changes of versions {r.start}..{r.end - 1}. Turn it on: ALTER TABLE delta.`{path}` SET "
            f"TBLPROPERTIES ({CHANGE_FEED} = true); changes made before are not recorded, so a table that already "
            f"holds rows is copied into one with the feed on (CREATE TABLE ... TBLPROPERTIES ({CHANGE_FEED} = true) "
            "AS SELECT * FROM ...) and the input pointed at the copy"
        )


def _check_continued(source: str, r: Range) -> None:
    table = open_table(source)
    for commit in table.history(table.version() - r.start + 1):
        version = commit.get("version")
        done = _rewrite(commit)
        if version is not None and r.start <= version < r.end and version > 0 and done:
            raise TableRewrittenError(
                f"table {table_path(source)}: version {version} {done}; its changes do not continue what the "
                "pipeline read before, and the pipeline takes no rewritten history. Write the changes as INSERT, "
                "UPDATE, DELETE or MERGE, or start the pipeline anew on a new store root"
            )


def table_columns(source: str, version: int) -> T.StructType:
    """The table's columns at ``version``, from its Delta log (Delta's schema is Spark's JSON)."""
    return T.StructType.fromJson(json.loads(open_table(source, version).schema().to_json()))


def check_columns(source: str, version: int, handle: str, schema: T.StructType) -> None:
    """Refuses a table whose columns at ``version`` lack one that input ``handle`` reads
    (``schema``), or hold it with another type."""
    have = {f.name.lower(): f.dataType for f in table_columns(source, version).fields}
    for f in schema.fields:
        found = have.get(f.name.lower())
        if found is None or found.simpleString() != f.dataType.simpleString():
            there = "is not in the table" if found is None else f"is {found.simpleString()} there"
            raise InputColumnsChangedError(
                f"table {table_path(source)}, version {version}: column {f.name!r}, which input {handle!r} reads as "
                f"{f.dataType.simpleString()}, {there} (dropped or retyped upstream). Restore the column upstream, "
                "or start the pipeline anew on a new store root with a schema that matches the table"
            )


def _weight(change: Column) -> Column:
    weighted = F
    for kind, weight in CHANGE_WEIGHTS.items():
        weighted = weighted.when(change == kind, F.lit(weight))
    return weighted.otherwise(F.raise_error(F.concat(F.lit("an unknown _change_type: "), change)))


def changes(spark: SparkSession, source: str, r: Range, handle: str, schema: T.StructType) -> DataFrame:
    """The Z-set of input ``handle``'s changes, its table ``source``'s of versions
    ``r.start..r.end - 1``: the columns of ``schema`` and their weights (the table's
    columns checked against ``schema`` first)."""
    check_columns(source, r.end - 1, handle, schema)
    feed = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", r.start)
        .option("endingVersion", r.end - 1)
    )
    location.reach_spark(spark, table_path(source))
    try:
        frame = feed.load(location.spark_path(table_path(source)))
    except Exception as e:  # a classic session analyzes at once
        raise read_failed(e, [r]) or e from e
    return frame.select(
        *(F.col(f.name).cast(f.dataType) for f in schema.fields),
        _weight(F.col("_change_type")).cast("bigint").alias(WEIGHT),
    )


_GONE = ("FileNotFound", "FILE_NOT_FOUND", "FILE_NOT_EXIST", "DELTA_VERSIONS_NOT_CONTIGUOUS")
"""What a change-feed read that met a removed file or log entry says (exception names and
Spark's or Delta's error classes)."""


def read_failed(error: BaseException, ranges: list[Range]) -> DeltaInputError | None:
    """The error of a change-feed read that failed (Delta's, passed on as text by the
    Spark error that failed the job), naming the table; None for another failure."""
    text = str(error)
    for r in ranges:
        if table_path(r.source) not in text and len(ranges) > 1:
            continue
        if "DELTA_MISSING_CHANGE_DATA" in text:
            return ChangeFeedMissingError(
                f"table {table_path(r.source)}: versions {r.start}..{r.end - 1} have no change data recorded; "
                f"turn it on with ALTER TABLE delta.`{table_path(r.source)}` SET TBLPROPERTIES ({CHANGE_FEED} = true)"
            )
        if any(sign in text for sign in _GONE):
            return _vacuumed(table_path(r.source), r.start, r.end - 1)
    return None
