"""Delta Lake tables written by Spark executors and committed by delta-rs.

There are no Delta JARs here, so Spark never talks to Delta: executors write Parquet
files straight into each table's directory (``mapInArrow``, one fused job for every
table a step touches), the driver collects only the files' names and statistics, and
delta-rs commits them.  Readers get a version's file list from delta-rs and read the
Parquet files with plain Spark.  Tables keep reader protocol 1 with no reader features,
but for a table with a ``TIMESTAMP_NTZ`` column: Delta requires reader protocol 3 and
feature ``timestampNtz`` of it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Transaction
from deltalake.exceptions import CommitFailedError, DeltaError
from deltalake.transaction import AddAction, RemoveAction
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema

from circuits.runner import SMALL_STEP_ROWS
from circuits.spark import ENGINE_CONF, map_in_arrow
from circuits.state import DEST, FILE, branches, pack, packed_columns, part_column
from circuits.zset import add, empty_like

from . import location
from .errors import CorruptTableError, StaleWriterError, StorageError
from .location import ObjectStore
from .tables import TABLE_CONFIG, ensure_table, open_table, parquet_dataset

FILES_SCHEMA = T.StructType(
    [
        T.StructField("dest", T.IntegerType()),
        T.StructField("path", T.StringType()),
        T.StructField("size", T.LongType()),
        T.StructField("rows", T.LongType()),
        T.StructField("stats", T.StringType()),
    ]
)
"""What a writer task reports per file (a StructType: a DDL string is a round trip to Spark to parse)."""


def arrow_schema(schema: T.StructType) -> pa.Schema:
    """The table schema for a Spark schema: every field nullable (files may hold nulls anywhere);
    a ``TIMESTAMP`` is an instant (microseconds in UTC, the engine's session time zone), a
    ``TIMESTAMP_NTZ`` a wall-clock time without a zone."""
    fields = to_arrow_schema(schema, timezone=ENGINE_CONF["spark.sql.session.timeZone"])
    return pa.schema([f.with_nullable(True) for f in fields])


def _has_stats(kind: pa.DataType) -> bool:
    """Whether data files keep the min and max of a column of type ``kind``."""
    return pa.types.is_integer(kind) or pa.types.is_string(kind)


def _stats(table: pa.Table) -> str:
    minimum, maximum, nulls = {}, {}, {}
    for name, column in zip(table.column_names, table.columns):
        nulls[name] = column.null_count
        if _has_stats(column.type):
            if column.null_count < len(column):
                bounds = pc.min_max(column)
                minimum[name], maximum[name] = bounds["min"].as_py(), bounds["max"].as_py()
    return json.dumps({"numRecords": table.num_rows, "minValues": minimum, "maxValues": maximum, "nullCount": nulls})


@dataclass(frozen=True)
class Target:
    """Where the writer puts a destination's rows: table ``uri`` of ``schema``; with ``order``,
    a piece of more than ``rows`` rows is sorted by those columns and cut into files of
    ``rows`` rows (see :func:`cut`); ``store``: how the writer reaches ``uri`` when it is
    on an object store (an executor has no registry of :mod:`storage.location`)."""

    uri: str
    schema: pa.Schema
    order: tuple[str, ...] = ()
    rows: int = 0
    store: ObjectStore | None = None


def cut(data: pa.Table, order: tuple[str, ...], rows: int) -> list[pa.Table]:
    """``data`` as the files to write: itself, or, when ``order`` is named and ``data`` has
    more than ``rows`` rows, sorted by ``order`` and sliced into files of ``rows`` rows.
    Each file's statistics then bound a narrow range of the first column of ``order``, so
    a lookup of a few values of it skips the other files (one file spanning every value
    is admitted by any of them)."""
    # Only the columns that files keep statistics of (see _stats) order a cut.
    order = [c for c in order if _has_stats(data.schema.field(c).type)]
    if not order or data.num_rows <= rows:
        return [data]
    ordered = data.sort_by([(column, "ascending") for column in order])
    return [ordered.slice(start, rows) for start in range(0, ordered.num_rows, rows)]


def _writer(targets: dict[int, Target]) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The executor side: split a partition of packed rows (all of :func:`circuits.state.pack`'s
    columns, or one of its :func:`~circuits.state.branches`) by destination (and by
    :data:`FILE` where a destination has it), write each piece into its table directory
    as one Parquet file, or as several cut by the target's order (see :func:`cut`), and
    return the files' descriptions."""
    described_schema = to_arrow_schema(FILES_SCHEMA)

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        pieces: dict[tuple[int, object], list[pa.Table]] = {}
        for batch in batches:
            dests = batch.column(DEST)
            for dest in pc.unique(dests).to_pylist():
                rows = batch.filter(pc.equal(dests, dest)).column(part_column(dest))
                flat = pa.Table.from_arrays(rows.flatten(), names=[f.name for f in rows.type])
                files = flat.column(FILE) if FILE in flat.column_names else None
                for key in [None] if files is None else pc.unique(files).to_pylist():
                    piece = flat if files is None else flat.filter(pc.equal(files, key)).drop_columns([FILE])
                    schema = targets[dest].schema
                    pieces.setdefault((dest, key), []).append(piece.select(schema.names).cast(schema))
        described = []
        for (dest, key), tables in pieces.items():
            target = targets[dest]
            for data in cut(pa.concat_tables(tables), target.order, target.rows):
                name, size, stats = write_file(target.uri, key, data, target.store)
                described.append((dest, name, size, data.num_rows, stats))
        yield pa.RecordBatch.from_pylist([dict(zip(FILES_SCHEMA.names, d)) for d in described], schema=described_schema)

    return write


def write_file(uri: str, key: object, data: pa.Table, store: ObjectStore | None = None) -> tuple[str, int, str]:
    """Writes ``data`` as a new data file of the table at ``uri`` (named by :func:`file_name`;
    ``store``: see :class:`Target`); returns its name, size and statistics."""
    name = file_name(key)
    fs, path = location.filesystem(os.path.join(uri, name), store)
    with fs.open_output_stream(path) as out:
        pq.write_table(data, out)
        size = out.tell()
    return name, size, _stats(data)


def write_local(uri: str, schema: pa.Schema, pieces: dict[object, pa.Table]) -> WrittenFiles:
    """Writes each ``key -> rows`` of ``pieces`` that has rows as one data file of the table
    at ``uri``, in this process (no Spark), as :func:`write_tables` names and describes
    them.  Nothing is committed: see :func:`commit`."""
    now = int(time.time() * 1000)
    written = WrittenFiles(uri, schema, [])
    for key, data in pieces.items():
        if data.num_rows:
            name, size, stats = write_file(uri, key, data.select(schema.names).cast(schema))
            written.actions.append(AddAction(name, size, {}, now, True, stats))
    return written


def file_name(key: object = None) -> str:
    """A new data file's name: ``part-<key>-<uuid>.parquet`` for a file of one :data:`FILE`
    value (so the key can be read back from the Delta log, see :func:`file_key`), else
    ``part-<uuid>.parquet``."""
    return f"part-{uuid.uuid4().hex}.parquet" if key is None else f"part-{key}-{uuid.uuid4().hex}.parquet"


def file_key(path: str) -> int | None:
    """The integer :data:`FILE` value a data file was named with by :func:`file_name`, or None."""
    stem = os.path.basename(path).removeprefix("part-").removesuffix(".parquet")
    key, _, rest = stem.rpartition("-")
    try:
        return int(key) if key and len(rest) == 32 else None
    except ValueError:
        return None


@dataclass
class WrittenFiles:
    """Files one step wrote for one table, not yet committed."""

    uri: str
    schema: pa.Schema
    actions: list[AddAction]

    @property
    def paths(self) -> list[str]:
        return [os.path.join(self.uri, a.path) for a in self.actions]


APART_ROWS = SMALL_STEP_ROWS
"""A write of more rows than this (a step's input rows, a compaction's or relayout's trace
rows) sends each table's rows to writer tasks of their own (see :func:`write_tables`,
``size``); a smaller one packs them into one union, written by as many tasks as the
step's workers.  Measured (``bench/RESULTS.md``, issue 30): apart cut a 10M-event first
step's server CPU by a third, and made a 1,000-event step 1.40-1.47x slower."""


def apart(rows: int | None) -> bool:
    """Whether a write of ``rows`` rows (None: not known) sends each table to writers of its own."""
    return rows is not None and rows > APART_ROWS


def write_tables(
    parts: dict[str, tuple[str, DataFrame]],
    orders: Mapping[str, tuple[str, ...]] | None = None,
    rows: int = 0,
    *,
    size: int | None = None,
    workers: int = 1,
) -> dict[str, WrittenFiles]:
    """Writes every ``name -> (table uri, DataFrame)`` with one Spark job (tables are created
    when missing): a file per Spark partition, or per :data:`FILE` value within it where
    the DataFrame has that column; a table named in ``orders`` has such a file of more than
    ``rows`` rows sorted by its order and cut (see :func:`cut`).  Nothing is committed:
    see :func:`commit`.

    ``size`` is the write's rows in all when known (a step's input rows stand for it).  The
    job's writer tasks are sent every table's rows packed into one union (see
    :func:`circuits.state.pack`), or, when :func:`apart`, each table's rows to writer tasks
    of its own, whose descriptions are united: still one job, shared shuffles run once.
    Packed, every row carries every table's column (null but its own), which the JVM
    converts to Arrow for each row: a large write's most costly part.  Apart, each table
    adds writer tasks (a Python worker each): a small write's most costly part, so a small
    packed union goes to ``workers`` tasks rather than one per table's partition (a step
    of 29 views on 2 workers ran 91 writer tasks, 125 ms each beyond its rows)."""
    names, orders = list(parts), orders or {}
    targets = {}
    for i, name in enumerate(names):
        uri, df = parts[name]
        # An existing table's schema is the frame's (a writer's cast fails otherwise), and
        # reading it from the Delta log saves a round trip to Spark.
        schema = ensured_schema(uri, lambda df=df: arrow_schema(df.drop(FILE).schema))
        targets[i] = Target(uri, schema, orders.get(name, ()), rows, location.store_of(uri))
    frames = {name: df for name, (_, df) in parts.items()}
    writer = _writer(targets)
    if apart(size):
        # A branch's columns are known: asking Spark for them is a round trip.
        writers = [
            map_in_arrow(b, writer, FILES_SCHEMA, [DEST, part_column(i)]) for i, b in enumerate(branches(frames))
        ]
    else:
        packed = pack(frames) if size is None else pack(frames).coalesce(workers)
        writers = [map_in_arrow(packed, writer, FILES_SCHEMA, packed_columns(len(names)))]
    try:
        described = add(*writers).collect()
    except Exception as e:
        raise StorageError(f"writing tables {sorted(names)} failed: {e}") from e
    now = int(time.time() * 1000)
    written = {name: WrittenFiles(targets[i].uri, targets[i].schema, []) for i, name in enumerate(names)}
    for row in described:
        written[names[row.dest]].actions.append(AddAction(row.path, row.size, {}, now, True, row.stats))
    return written


def commit(
    files: WrittenFiles,
    app_id: str,
    version: int,
    base: DeltaTable | None = None,
    remove: Collection[str] | None = None,
    metadata: dict[str, str] | None = None,
    data_change: bool = True,
) -> int:
    """Commits ``files`` as one Delta version, tagged with app transaction ``(app_id, version)``.

    With ``base`` (a handle of the table at the version to commit on), the commit is made
    on top of that version: if another writer committed the same ``app_id`` since,
    delta-rs refuses it as a concurrent transaction (this is how a stale writer is fenced
    off); the handle is then at the new version.  A caller that holds the base version's
    handle already passes it rather than a version number: opening one costs 5-10 ms, and
    a step commits to every state table it touches.  ``remove`` names files of the base
    version (paths relative to the table) to remove in the same commit.  delta-rs does not
    skip a repeated app-transaction version, so callers check :func:`transaction_version`
    first.  ``metadata`` goes into the commit's info (``DeltaTable.history()`` shows it).
    ``data_change=False`` marks a commit that rearranges rows without changing them (a
    compaction): readers of the table's changes skip it.  Returns the table's new version.
    """
    if base is None:
        with latest(files.uri, files.schema) as table:
            return _commit_on(table, files, app_id, version, remove, metadata, data_change)
    return _commit_on(base, files, app_id, version, remove, metadata, data_change)


def _commit_on(
    table: DeltaTable,
    files: WrittenFiles,
    app_id: str,
    version: int,
    remove: Collection[str] | None,
    metadata: dict[str, str] | None,
    data_change: bool,
) -> int:
    actions: list[AddAction | RemoveAction] = [dataclasses.replace(a, data_change=data_change) for a in files.actions]
    if remove:
        now = int(time.time() * 1000)
        adds = add_actions(table)
        sizes = dict(zip(adds.column("path").to_pylist(), adds.column("size_bytes").to_pylist(), strict=True))
        gone = sorted(set(remove) - set(sizes))
        if gone:
            raise StaleWriterError(
                f"{files.uri}: files to replace are no longer in version {table.version()}: {gone[:3]}"
            )
        actions += [RemoveAction(p, data_change, now, sizes[p]) for p in remove]
    try:
        table.create_write_transaction(
            actions,
            mode="append",
            schema=table.schema(),
            commit_properties=CommitProperties(
                app_transactions=[Transaction(app_id, version)], custom_metadata=metadata
            ),
        )
    except CommitFailedError as e:
        raise StaleWriterError(f"{files.uri}: another writer committed {app_id} {version} first: {e}") from e
    except (DeltaError, OSError) as e:
        raise StorageError(f"committing to {files.uri} failed: {e}") from e
    table.update_incremental()
    return table.version()


_LATEST: OrderedDict[tuple, tuple[DeltaTable, int]] = OrderedDict()
_LATEST_LOCK = threading.RLock()
LATEST_HANDLES = 256
"""How many tables' latest-version handles a process keeps (see :func:`latest`)."""
REOPEN_COMMITS = int(TABLE_CONFIG["delta.checkpointInterval"])
"""A kept handle is opened anew once its table has had this many commits since it was
opened: a handle brought up to date keeps every commit it read in its log segment, and
delta-rs replays that segment in some operations (an append to the division log through
a handle kept over 1,000 commits took 112 ms, against 33 ms through a new one)."""


@contextmanager
def latest(uri: str, schema: pa.Schema | None = None) -> Iterator[DeltaTable | None]:
    """Table ``uri`` at its latest version, for the block: created with ``schema`` when it
    is missing and ``schema`` is given, else None when missing.

    The process keeps a handle per table (as created) and brings it up to date, which
    reads only the commits made since; opening reads the table's last Delta checkpoint
    and every commit after it, 5-10 ms for a log table against about 1 ms.  Blocks run
    one at a time: a handle is not to be brought up to date by two threads at once."""
    with _LATEST_LOCK:
        identity = table_identity(uri)
        table, opened = _LATEST.pop(identity, (None, 0)) if identity is not None else (None, 0)
        if table is not None:
            try:
                table.update_incremental()
            except (DeltaError, OSError):
                table = None  # opened anew below, which names the fault
        if table is None or table.version() - opened >= REOPEN_COMMITS:
            table = open_table(uri) if schema is None else ensure_table(uri, schema)
            opened = -1 if table is None else table.version()
            identity = table_identity(uri)  # a table created just now has one only now
        if table is not None and identity is not None:
            _LATEST[identity] = (table, opened)
            while len(_LATEST) > LATEST_HANDLES:
                _LATEST.popitem(last=False)
        yield table


def add_actions(table: DeltaTable) -> pa.Table:
    """The data files of ``table``'s version, one row each: ``path`` (relative to the
    table), ``size_bytes``, ``num_records`` and ``min.<column>``/``max.<column>`` statistics."""
    return pa.table(table.get_add_actions(flatten=True))


def paths(table: DeltaTable) -> list[str]:
    """The data files of ``table``'s version, relative to the table."""
    return add_actions(table).column("path").to_pylist()


def delta_tables(root: str) -> list[str]:
    """Every Delta table at or under ``root``."""
    fs, path = location.filesystem(root)
    found = fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
    # An object store lists no folders of its own: a table is where a _delta_log/ key begins.
    tables = {f.path.partition("/_delta_log/")[0] for f in found if "/_delta_log/" in f.path}
    tables |= {f.path.removesuffix("/_delta_log") for f in found if f.path.endswith("/_delta_log")}
    return sorted(root.rstrip("/") + t.removeprefix(path.rstrip("/")) for t in tables)


def transaction_version(uri: str, app_id: str) -> int | None:
    """The latest version recorded under ``app_id`` in table ``uri`` (None: none, or no table)."""
    with latest(uri) as table:
        return None if table is None else table.transaction_version(app_id)


_SCHEMAS: dict[tuple, pa.Schema] = {}


def ensured_schema(uri: str, schema_if_new: Callable[[], pa.Schema]) -> pa.Schema:
    """The Arrow schema of table ``uri``, created with ``schema_if_new()`` when missing.  The
    engine never changes a table's schema, so each table's is read from its log once per
    process."""
    identity = table_identity(uri)
    if identity is not None and identity in _SCHEMAS:
        return _SCHEMAS[identity]
    table = open_table(uri)
    if table is None:
        table = ensure_table(uri, schema_if_new())
        identity = table_identity(uri)  # the table's first commit file exists only now
    schema = pa.schema(table.schema().to_arrow())
    if identity is not None:  # None: a table whose first commit file is gone (an older log cleanup)
        _SCHEMAS[identity] = schema
    return schema


def table_identity(uri: str) -> tuple | None:
    """Table ``uri`` as created: a local table deleted and created again is another table
    (its first commit is another file).  None when there is no such local table."""
    path = uri.removeprefix("file://")
    if "://" in path:
        return (uri,)
    try:
        first = os.stat(os.path.join(path, "_delta_log", f"{0:020d}.json"))
    except FileNotFoundError:
        return None
    return (uri, first.st_ino, first.st_mtime_ns)


def is_latest(uri: str, version: int, identity: tuple | None) -> bool:
    """Whether local table ``uri``, created as ``identity`` (:func:`table_identity`), has
    no version after ``version``: Delta writes version ``v + 1`` as the file
    ``_delta_log/<v + 1>.json``, created atomically, so one ``stat`` answers.  False for a
    remote table (it is asked nothing)."""
    path = uri.removeprefix("file://")
    if "://" in path or identity is None or table_identity(uri) != identity:
        return False
    return not os.path.exists(os.path.join(path, "_delta_log", f"{version + 1:020d}.json"))


def table_schema(table: DeltaTable) -> T.StructType:
    """A Delta table's schema as a Spark schema."""
    return from_arrow_schema(pa.schema(table.schema().to_arrow()))


def read_files(
    spark: SparkSession, uri: str, schema: T.StructType, paths: list[str], version: int | None = None
) -> DataFrame:
    """The Parquet files ``paths`` of table ``uri`` (at ``version``, for messages) as a DataFrame."""
    if not paths:
        return empty_like(spark.createDataFrame([], schema))
    _check_present(uri, paths, version)
    return spark.read.schema(schema).parquet(*map(location.spark_path, paths))


def read_matching(
    uri: str, schema: pa.Schema, paths: list[str], keys: Mapping[str, pa.Array], limit: int
) -> pa.Table | None:
    """The rows of the Parquet files ``paths`` of table ``uri`` whose every column named in
    ``keys`` holds one of the values listed for it (a listed null matches nulls), read by
    this process; None once more than ``limit`` rows match (the rest is not read)."""
    _check_present(uri, paths, None)
    condition = None
    for column, values in keys.items():
        listed = pc.field(column).isin(values.cast(schema.field(column).type))
        condition = listed if condition is None else condition & listed
    files = parquet_dataset(paths, schema)
    batches, rows = [], 0
    for batch in files.to_batches(filter=condition):
        rows += batch.num_rows
        if rows > limit:
            return None
        batches.append(batch)
    return pa.Table.from_batches(batches, schema)


def _check_present(uri: str, paths: list[str], version: int | None) -> None:
    # A file on an object store is not asked for ahead (a request each): its read names it.
    missing = [p for p in paths if not location.remote(p) and not location.exists(p)]
    if missing:
        at = "" if version is None else f" version {version}"
        raise CorruptTableError(
            f"Delta table {uri}{at}: data file {missing[0]} is missing; restore it, or open an earlier checkpoint"
        )
