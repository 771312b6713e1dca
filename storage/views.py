"""Views readable as tables: each sink's current contents as a Delta table.

A sink's change log ``<root>/outputs/<sink>`` holds what each step changed (rows with
``_weight`` and ``_step``).  Next to it, ``<root>/views/<sink>`` holds the integral of
those changes, what the view contains now, as a plain table of the sink's columns that
any Delta reader (deltalake, pandas, DuckDB, Spark) reads without knowing about Z-sets:

- **Rows.**  A row whose total weight is ``n`` is stored as ``n`` identical rows, the way
  SQL returns a view with duplicates: ``count(*)``, ``sum(x)`` and a pandas
  ``groupby`` over the table give the view's answers, which a ``_count`` column would make
  every reader remember to multiply by.  A view whose rows all have weight 1 is a plain
  table of the user's columns; there are no internal columns.  A negative total is a bug
  (or a retraction of a row that was never inserted): the update is refused with
  :class:`NegativeViewError` and the view stays at its last good step.
- **Files by a hash of the row.**  ``vnode = pmod(xxhash64(all columns), VNODES)``; each
  data file holds the rows of one range of vnodes, and its name says where the range
  starts (``part-<first vnode>-<id>.parquet``; a range ends where the next file's
  starts).  A step reads and rewrites only the files whose ranges hold a vnode its
  changes touch, and commits one Delta version (the new files added, the old ones
  removed).  A range whose rows outgrow :data:`FILE_ROWS` is cut into smaller ones when
  it is rewritten.  Reader protocol 1, no deletion vectors, no partition columns.
- **Consistency.**  A step's view update runs after its output-log commit and is tagged
  with the app transaction ``("view", step)``: an update is skipped when the view has it
  already, so a replay after a crash at any point integrates each committed step of the
  log exactly once (delta-rs does not skip a repeated app-transaction version, so the
  version is checked first, as for the logs).  A view that starts late (a sink turned
  ``current`` on an existing pipeline) catches up from the whole log in one commit.
- **Time travel.**  Each commit records its step (``dbsp.step`` in the commit info), and
  each checkpoint records the view versions at its step (checkpoint meta
  :data:`VIEWS_KEY`), so :func:`read_view` finds the view as of any committed step;
  ``vacuum`` keeps the versions the retained checkpoints pin and the latest.
"""

from __future__ import annotations

import bisect
import json
import os
from collections import Counter
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from functools import reduce
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from circuits.sharding import VNODE, vnode_of
from circuits.state import FILE
from circuits.zset import WEIGHT

from . import location
from .database import CHECKPOINTS, _checkpoint_rows, _openable, latest_checkpoint
from .delta import (
    WrittenFiles,
    add_actions,
    commit,
    file_key,
    read_files,
    table_schema,
    transaction_version,
    write_local,
    write_tables,
)
from .errors import CorruptTableError, NegativeViewError, ViewError
from .location import spark_path
from .logs import STEP, files_of_steps, output_uri, step_rows
from .tables import dataset, ensure_table, groupable, open_table, parquet_dataset

VIEWS_KEY = "views"
"""Checkpoint meta: ``{sink: view table version}`` as of the checkpoint's step."""
VIEW_APP = "view"
STEP_INFO = "dbsp.step"
FIRST_STEP_INFO = "dbsp.first_step"
VNODES = 4096
"""The hash space of a view's rows: files hold ranges of it, so a file can be cut down to
about ``rows / VNODES`` rows."""
FILE_ROWS = 32_768
"""Rows a view file aims at: a range whose rows would exceed this is cut in pieces when a
step rewrites it.  Smaller files mean fewer rows rewritten per changed row, more files."""
NEGATIVE = -1
"""The file key of rows whose total is negative: written aside, never committed."""


def view_uri(root: str, sink: str) -> str:
    """Where sink ``sink`` of the pipeline at ``root`` keeps its current contents."""
    return os.path.join(root, "views", sink)


# -- which files a step rewrites -----------------------------------------------------------


@dataclass(frozen=True)
class ViewFile:
    path: str  # relative to the table
    start: int  # the first vnode of its range
    rows: int


@dataclass(frozen=True)
class Rewrite:
    """A step's plan for one view: the files it reads and replaces, and the first vnodes of
    the ranges its new files hold."""

    removed: list[str]
    starts: list[int]


def view_files(table: DeltaTable) -> list[ViewFile]:
    """The data files of a view's version, each with the vnode its range starts at."""
    adds = add_actions(table)
    files = []
    for path, rows in zip(adds.column("path").to_pylist(), adds.column("num_records").to_pylist(), strict=True):
        start = file_key(path)
        if start is None or not 0 <= start < VNODES:
            raise CorruptTableError(
                f"{table.table_uri}: data file {path} is not named by its vnode range (part-<first vnode>-<id>.parquet); "
                "a view table is written by the pipeline only: delete the table and the next step rebuilds it from the log"
            )
        files.append(ViewFile(path, start, rows or 0))
    return files


def ranges(starts: Iterable[int]) -> dict[int, tuple[int, int]]:
    """``start -> (first vnode, end)`` of each file range: a range ends where the next one
    starts; the lowest also covers the vnodes below it (whose files emptied)."""
    ordered = sorted(set(starts))
    ends = [*ordered[1:], VNODES]
    return {start: (0 if i == 0 else start, end) for i, (start, end) in enumerate(zip(ordered, ends))}


def plan(files: list[ViewFile], changed: dict[int, int], target: int | None = None) -> Rewrite:
    """The files that the changes (``vnode -> changed rows``) touch, and how their ranges are
    cut again: into pieces of about ``target`` rows (default :data:`FILE_ROWS`), counting
    the old rows and the changed ones."""
    target = target or FILE_ROWS
    spans = ranges(f.start for f in files) or {0: (0, VNODES)}
    keys = sorted(spans)
    touched: Counter = Counter()
    for vnode, count in changed.items():
        touched[keys[max(bisect.bisect_right(keys, vnode) - 1, 0)]] += count
    rows = Counter()
    for f in files:
        rows[f.start] += f.rows
    starts = []
    for key, count in touched.items():
        lo, hi = spans[key]
        pieces = max(1, min(hi - lo, -(-(rows[key] + count) // target)))
        starts += [lo + i * (hi - lo) // pieces for i in range(pieces)]
    return Rewrite(sorted(f.path for f in files if f.start in touched), sorted(starts))


# -- the Spark side -------------------------------------------------------------------------


class Change(NamedTuple):
    """A view's change rows to integrate, read from its output log."""

    columns: list[str]
    """The view's row columns (the log's, without weight and step)."""
    rows: DataFrame
    bound: int | None
    """At most this many change rows (the log files' row counts), when known."""
    log: DeltaTable
    steps: tuple[int, int]
    """The first and last step of the log whose rows ``rows`` holds."""

    def fits(self, files: list[ViewFile]) -> bool:
        """Whether the view is at most one file that stays within :data:`FILE_ROWS` with this change."""
        return self.bound is not None and len(files) <= 1 and sum(f.rows for f in files) + self.bound <= FILE_ROWS


def _changed_vnodes(spark: SparkSession, changes: dict[str, Change]) -> dict[str, dict[int, int]]:
    """``sink -> {vnode: changed rows}`` for every sink's changes, with one Spark job."""
    sinks = list(changes)
    parts = [
        df.select(F.lit(i).alias("_sink"), vnode_of(columns, VNODES).alias(VNODE))
        for i, (columns, df, *_) in enumerate(changes.values())
    ]
    found: dict[str, dict[int, int]] = {sink: {} for sink in sinks}
    for row in reduce(DataFrame.unionByName, parts).groupBy("_sink", VNODE).count().collect():
        found[sinks[row["_sink"]]][row[VNODE]] = row["count"]
    return found


def integrated(old: DataFrame, columns: list[str], changes: DataFrame, starts: list[int], partitions: int) -> DataFrame:
    """The rewritten files' rows: ``old`` (the touched files, a row per copy) plus
    ``changes`` (rows of ``columns`` with a weight), summed per row, each total ``n > 0``
    as ``n`` copies, with :data:`FILE` = the first vnode of its new range
    (:data:`NEGATIVE` for a negative total, written aside).  One shuffle: rows are sent
    to their file's task, then grouped there."""
    rows = old.select(*columns, F.lit(1).cast("bigint").alias(WEIGHT)).unionByName(changes.select(*columns, WEIGHT))
    bounds = F.array(*[F.lit(s) for s in starts])
    rows = rows.withColumn(VNODE, vnode_of(columns, VNODES))
    rows = rows.withColumn(FILE, F.array_max(F.filter(bounds, lambda s: s <= F.col(VNODE))))
    totals = rows.repartition(partitions, FILE).groupBy(FILE, VNODE, *columns).agg(F.sum(WEIGHT).alias(WEIGHT))
    totals = totals.where(F.col(WEIGHT) != 0).withColumn(
        FILE, F.when(F.col(WEIGHT) < 0, F.lit(NEGATIVE)).otherwise(F.col(FILE))
    )
    copies = F.explode(F.array_repeat(F.lit(0), F.abs(WEIGHT).cast("int"))).alias("_copy")
    return totals.select(*columns, FILE, VNODE, copies).drop("_copy").sortWithinPartitions(FILE, VNODE)


def integrated_rows(old: pa.Table, columns: list[str], changes: pa.Table) -> tuple[pa.Table, pa.Table]:
    """:func:`integrated` for rows that go to one file, in this process: ``old`` (a row per
    copy) plus ``changes`` (rows of ``columns`` with a weight), summed per row.  Returns
    the rows of each positive total ``n`` as ``n`` copies, and those of each negative
    total ``-n`` as ``n`` copies (to be written aside).  Floating-point columns group as
    in Spark: -0.0 with 0.0, every NaN together."""
    schema = pa.schema([*old.select(columns).schema, pa.field(WEIGHT, pa.int64())])
    ones = pa.array(np.ones(old.num_rows, dtype=np.int64))
    rows = pa.concat_tables(
        [old.select(columns).append_column(WEIGHT, ones), changes.select(schema.names).cast(schema)]
    )
    for i, name in enumerate(columns):
        rows = rows.set_column(i, name, _spark_grouped(rows[name]))
    totals = rows.group_by(columns, use_threads=False).aggregate([(WEIGHT, "sum")])
    weights = totals[f"{WEIGHT}_sum"].to_numpy()
    values = totals.select(columns)
    return tuple(values.take(np.repeat(np.arange(len(weights)), np.maximum(sign * weights, 0))) for sign in (1, -1))


def _spark_grouped(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """``column`` with each floating-point value as Spark's grouping sees it."""
    if not pa.types.is_floating(column.type):
        return column
    zeroed = pc.add(column, pa.scalar(0.0, column.type))  # -0.0 + 0.0 is 0.0
    return pc.if_else(pc.is_nan(zeroed), pa.scalar(float("nan"), column.type), zeroed)


# -- maintaining the views --------------------------------------------------------------------


class CurrentViews:
    """The current-contents tables of a pipeline's ``sinks``, brought up to date step by step
    from the committed output log (see the module's docstring)."""

    def __init__(
        self, spark: SparkSession, root: str, sinks: Collection[str], partitions: int = 2, catalog: str | None = None
    ) -> None:
        """``catalog``: the session catalog's schema (database) in which each view is a table by
        its sink's name, registered by the first update in a process."""
        self.spark = spark
        self.root = root
        self.sinks = sorted(sinks)
        self.partitions = max(1, partitions)
        self.catalog = catalog
        self._registered = False
        self.last_rewrite: dict[str, tuple[int, int]] = {}
        """Per sink, (files added, files removed) by the latest update."""

    def uri(self, sink: str) -> str:
        return view_uri(self.root, sink)

    def next_step(self, sink: str) -> int:
        """The first step of the output log the view does not hold yet."""
        done = transaction_version(self.uri(sink), VIEW_APP)
        return 0 if done is None else done + 1

    def update(self, step: int) -> None:
        """Brings every view to the output log's ``step`` (which must be committed there),
        with at most two Spark jobs for all sinks: one finds the vnodes the changes touch
        (not needed for views of one small file, see :meth:`Change.fits`), one rewrites
        the files holding them.  Views at ``step`` already are left alone."""
        todo = {sink: first for sink in self.sinks if (first := self.next_step(sink)) <= step}
        if not todo:
            return
        tables, changes = {}, {}
        for sink, first in todo.items():
            log = open_table(output_uri(self.root, sink))
            if log is None:
                raise ViewError(
                    f"view {sink!r}: the output log {output_uri(self.root, sink)} has no steps; run the step first"
                )
            schema = table_schema(log)
            columns = [f for f in schema.fields if f.name not in (WEIGHT, STEP)]
            tables[sink] = ensure_table(
                self.uri(sink), pa.schema([pa.field(f.name, _arrow(log, f.name), True) for f in columns])
            )
            files = files_of_steps(log, first, step)
            if files:
                # The row columns, known from the log: asking the frame would be a round trip.
                rows = [f.get("num_records") for f in files]
                changes[sink] = Change(
                    [f.name for f in columns],
                    read_files(self.spark, log.table_uri, schema, [f["uri"] for f in files]).where(
                        F.col(STEP).between(first, step)
                    ),
                    None if None in rows else sum(rows),
                    log,
                    (first, step),
                )
        written, plans = self._rewrite(tables, changes)
        for sink, first in todo.items():
            files = written.get(sink) or WrittenFiles(self.uri(sink), pa.schema(tables[sink].schema().to_arrow()), [])
            _refuse_negative(sink, files, first, step)
            removed = plans[sink].removed if sink in plans else []
            info = {STEP_INFO: str(step), FIRST_STEP_INFO: str(first)}
            commit(files, VIEW_APP, step, base=tables[sink], remove=removed, metadata=info)
            self.last_rewrite[sink] = (len(files.actions), len(removed))
        if self.catalog and not self._registered:
            # Once per process: a catalog kept in the server's memory is gone after a restart.
            register_views(self.spark, self.catalog, {sink: self.uri(sink) for sink in self.sinks})
            self._registered = True

    def _rewrite(self, tables: dict[str, DeltaTable], changes: dict[str, Change]) -> tuple[dict, dict]:
        if not changes:
            return {}, {}
        files = {sink: view_files(tables[sink]) for sink in changes}
        # A view in one file that stays small is rewritten whole, as the plan would have it
        # anyway: no Spark job needs to find the vnodes its change touches, and this process
        # integrates it (a Spark job for it cost a 1,000-event demo step run a sixth of its
        # time, bench/dagster_step_parts.py).
        whole = {sink: change.bound for sink, change in changes.items() if change.fits(files[sink])}
        rest = {sink: change for sink, change in changes.items() if sink not in whole}
        changed = _changed_vnodes(self.spark, rest) if rest else {}
        changed |= {sink: {0: rows} if rows else {} for sink, rows in whole.items()}
        plans = {sink: plan(files[sink], changed[sink]) for sink in changes}
        local = {sink for sink in whole if groupable(tables[sink])}
        written = {sink: _rewrite_locally(self.uri(sink), tables[sink], changes[sink], plans[sink]) for sink in local}
        parts = {}
        for sink, (columns, df, *_) in changes.items():
            if sink in local:
                continue
            table = tables[sink]
            paths = [f"{table.table_uri.rstrip('/')}/{p}" for p in plans[sink].removed]
            old = read_files(self.spark, self.uri(sink), table_schema(table), paths, table.version())
            parts[sink] = (self.uri(sink), integrated(old, columns, df, plans[sink].starts, self.partitions))
        return written | (write_tables(parts) if parts else {}), plans

    def versions(self) -> dict[str, int]:
        """Each view's latest Delta version (what a checkpoint pins)."""
        found = {sink: open_table(self.uri(sink)) for sink in self.sinks}
        return {sink: table.version() for sink, table in found.items() if table is not None}

    def pin(self, state) -> None:
        """Records the views' versions in the checkpoint ``state`` is about to commit."""
        if self.sinks:
            state.set_meta(VIEWS_KEY, json.dumps(self.versions(), sort_keys=True))


def register_views(spark: SparkSession, schema: str, uris: dict[str, str]) -> None:
    """Makes each view (name: Delta table ``uri``) a table ``schema.name`` of the session
    catalog, for Spark SQL users of the same server (``SELECT * FROM schema.name``, with
    ``VERSION AS OF``); an existing one is left as it is."""
    spark.sql(f"CREATE SCHEMA IF NOT EXISTS {_quoted(schema)}")
    for name, uri in uris.items():
        path = spark_path(uri).replace("\\", "\\\\").replace("'", "\\'")
        spark.sql(f"CREATE TABLE IF NOT EXISTS {_quoted(schema)}.{_quoted(name)} USING delta LOCATION '{path}'")


def _quoted(identifier: str) -> str:
    return "`" + identifier.replace("`", "``") + "`"


def _rewrite_locally(uri: str, table: DeltaTable, change: Change, rewrite: Rewrite) -> WrittenFiles:
    """The new file of the view at ``uri`` (``table``) rewritten whole into one range (see
    :meth:`Change.fits`), integrated and written by this process with pyarrow (no Spark
    job): the view's rows and the change log's rows of ``change.steps``."""
    schema = pa.schema(table.schema().to_arrow())
    if not rewrite.starts:  # no change row: the view's file stays
        return write_local(uri, schema, {})
    (start,) = rewrite.starts
    rows = step_rows(change.log, *change.steps)
    kept, aside = integrated_rows(dataset(table).to_table(), change.columns, rows)
    return write_local(uri, schema, {start: kept, NEGATIVE: aside})


def _arrow(log: DeltaTable, name: str) -> pa.DataType:
    return pa.schema(log.schema().to_arrow()).field(name).type


def _refuse_negative(sink: str, files: WrittenFiles, first: int, step: int) -> None:
    """Raises :class:`NegativeViewError` with examples when the rewrite set rows aside for a
    negative total (a row of total ``-n`` was written ``n`` times)."""
    aside = [os.path.join(files.uri, a.path) for a in files.actions if file_key(a.path) == NEGATIVE]
    if not aside:
        return
    totals = Counter(tuple(r.values()) for r in parquet_dataset(aside).to_table().to_pylist())
    examples = ", ".join(f"{row} x {-n}" for row, n in totals.most_common(5))
    raise NegativeViewError(
        f"view {sink!r}, steps {first}..{step}: the change log adds up to a negative count for {len(totals)} row(s), "
        f'e.g. {examples}. The circuit, or the input\'s retractions ("_weight": -1), deleted rows that were never '
        f"there. The view is left at step {first - 1} and the change log is intact; fix the retractions, or set "
        f"`current: false` on sink {sink!r} to run on without its current view"
    )


# -- reading a view ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ViewSnapshot:
    sink: str
    step: int  # the view as of the end of this step
    version: int  # its Delta version
    rows: int  # rows in the whole view (copies counted)
    table: pa.Table  # the first rows asked for (all when no limit)


def step_versions(uri: str) -> dict[int, int]:
    """``step -> Delta version`` of the view at ``uri``, from its commits' info."""
    table = open_table(uri)
    history = [] if table is None else table.history()
    return {int(h[STEP_INFO]): h["version"] for h in history if STEP_INFO in h}


def read_view(root: str, sink: str, step: int | None = None, limit: int | None = None) -> ViewSnapshot:
    """Sink ``sink``'s view as of committed step ``step`` (default: the latest committed),
    with its first ``limit`` rows, read by delta-rs (no Spark).  Raises :class:`ViewError`
    naming what exists when there is no such view, step or retained version."""
    _, committed, meta = latest_checkpoint(root)
    uri = view_uri(root, sink)
    version = json.loads(meta.get(VIEWS_KEY, "{}")).get(sink) if step is None else None
    table = open_table(uri, version)
    if table is None:
        raise ViewError(f"sink {sink!r} has no current view at {uri} (views exist for: {sorted(list_views(root))})")
    if committed == 0:
        raise ViewError(f"view {sink!r}: no step of the pipeline at {root} is committed yet")
    if step is not None and not 0 <= step < committed:
        raise ViewError(f"view {sink!r}: step {step} is not committed; the committed steps are 0..{committed - 1}")
    at = committed - 1 if step is None else step
    if version is None:
        table = open_table(uri, _version_of_step(uri, sink, at, committed))
    if not all(map(location.exists, table.file_uris())):
        kept = sorted(
            s
            for s, v in step_versions(uri).items()
            if v in retained_view_versions(root).get(uri, set()) and s < committed
        )
        raise ViewError(
            f"view {sink!r}: step {at} was removed by vacuum, which keeps the view at the steps of the retained "
            f"checkpoints and the latest one; readable steps: {kept}"
        )
    return snapshot(sink, at, table, limit)


def snapshot(sink: str, step: int, table: DeltaTable, limit: int | None = None) -> ViewSnapshot:
    """Sink ``sink``'s view as of step ``step``, ``table`` at the version that holds it."""
    rows = sum(n or 0 for n in add_actions(table).column("num_records").to_pylist())
    data = dataset(table)
    return ViewSnapshot(sink, step, table.version(), rows, data.to_table() if limit is None else data.head(limit))


def views_at(root: str, sinks: Iterable[str], step: int) -> dict[str, DeltaTable]:
    """The current views of ``sinks`` as of committed step ``step``, each at the version the
    latest checkpoint pins, when that checkpoint is ``step``'s (none otherwise: a later
    step was committed meanwhile).  Unlike :func:`read_view` for a past step, reads no
    table's history."""
    _, committed, meta = latest_checkpoint(root)
    versions = json.loads(meta.get(VIEWS_KEY, "{}")) if committed == step + 1 else {}
    return {sink: open_table(view_uri(root, sink), versions[sink]) for sink in sinks if sink in versions}


def _version_of_step(uri: str, sink: str, step: int, committed: int) -> int:
    versions = step_versions(uri)
    if step not in versions:
        held = sorted(s for s in versions if s < committed)
        first = min(held, default=None)
        raise ViewError(
            f"view {sink!r} has no version for step {step}: it holds committed steps "
            + (
                f"{first}..{committed - 1} (it started at step {first}, when the sink became current)"
                if held
                else "none yet"
            )
        )
    return versions[step]


def list_views(root: str) -> list[str]:
    return location.listdir(os.path.join(root, "views"))


def retained_view_versions(root: str) -> dict[str, set[int]]:
    """``view uri -> versions`` that the openable checkpoints pin (vacuum keeps them)."""
    rows = _checkpoint_rows(open_table(os.path.join(root, CHECKPOINTS)))
    keep: dict[str, set[int]] = {}
    for row in rows:
        if row["version"] in _openable(rows):
            pinned = json.loads(json.loads(row["meta"]).get(VIEWS_KEY, "{}"))
            for sink, version in pinned.items():
                keep.setdefault(view_uri(root, sink), set()).add(version)
    return keep


def markdown(snapshot: ViewSnapshot) -> str:
    """The snapshot's rows as a markdown table (for Dagster's metadata)."""
    names = snapshot.table.column_names
    lines = ["| " + " | ".join(names) + " |", "|" + "---|" * len(names)]
    lines += ["| " + " | ".join(_cell(v) for v in row.values()) + " |" for row in snapshot.table.to_pylist()]
    return "\n".join(lines)


def _cell(value: object) -> str:
    return "" if value is None else str(value).replace("|", "\\|")
