"""The two-version state database of the distributed DBSP design (docs/design.md), over Delta tables.

Each state table (an operator's trace, keyed by vnode) is a Delta table under
``<root>/state``.  A step's state deltas are committed to those tables as it runs; a
**checkpoint** is a row in the ``<root>/_checkpoints`` Delta table that pins the Delta
version of every state table, the step, and the metadata (fingerprint, layout,
versions).  Database version ``v`` is checkpoint ``v``; ``open(v)`` restores every table
to the versions checkpoint ``v`` pinned, which discards whatever a crashed run wrote
after it.  A crash during ``commit`` leaves either ``v`` or ``v + 1``, never a mix: the
checkpoint row is the commit point.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import os
import threading
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from circuits.runner import LAYOUT_KEY, OUTPUT, STATE
from circuits.sharding import PART, VNODE, exchange, unit_of, worker_of
from circuits.state import FILE, StateStore
from circuits.vnodes import Layout
from circuits.zset import consolidate

from . import location
from .delta import (
    REOPEN_COMMITS,
    WrittenFiles,
    add_actions,
    commit,
    is_latest,
    latest,
    paths,
    read_files,
    read_matching,
    table_identity,
    table_schema,
    write_local,
    write_tables,
)
from .errors import CorruptTableError, StaleWriterError, StateFormatError, StorageError
from .faults import failpoint
from .logs import STEP, output_uri
from .tables import dataset, ensure_table, open_table, parquet_dataset

ENGINE_VERSION = "0.2.0"
STATE_FORMAT = 2
"""The format this engine writes.  Format 1 differs in keyed-log pipelines only (KLogs, docs/klogs.md):
a message's position had no index of the copy, output or merged log it came from, so
messages could share a sink token, and a user function's fingerprint did not cover what
it closes over.  Other circuits' state of format 1 is read as it stands."""
READS = frozenset({1, STATE_FORMAT})
"""The formats a circuit without keyed-log operators can go on from."""
CHECKPOINTS = "_checkpoints"
_CHECKPOINT_SCHEMA = pa.schema(
    [
        ("version", pa.int64()),
        ("step", pa.int64()),
        ("tables", pa.string()),
        ("meta", pa.string()),
        ("engine_version", pa.string()),
        ("state_format", pa.int64()),
    ]
)


SMALL_TRACE_ROWS = 100_000
"""A trace of at most this many rows (by its files' statistics) is read whole and brought
to a step's keys: in a small step by the step's one task (about 0.3 s for 100,000 rows,
see DESIGN.md), in a larger one by a shuffle.  Either costs less than the broadcast job
that would filter it."""
COMPACT_FILES = 16
"""A trace's files merge in the next step that adds to it, in that step's own job, once
they crowd (see :func:`crowded`): a small trace's every file when it has more than this
many, since every lookup reads a small trace whole and each file costs more to open than
its rows cost to read; a large trace's files of one size class when that class has more
than this many, since each small step adds a file spanning every key, which every later
lookup would read."""
CLUSTER_ROWS = 250_000
"""A step's file of a trace holding more rows than this (a large step's, such as a load's)
is written sorted by the trace's lookup keys and cut into files of this many rows (see
:func:`storage.delta.cut`): a lookup of a few keys then reads the files whose key range
holds them, not one file per worker whose bounds span every key.  At 10M events of the
demo's state, q15's values traces (a day's bidders and auctions) are 37 MB, a step's keys
one day of about twelve: cut, the step reads that day's files.  Small enough that a day
spans a few files, large enough that a trace of 10M rows stays about 40 files.  Compaction
and a relayout cut the files they rewrite the same way, by the keys the state records
(see :data:`LOOKUP_KEYS`); a trace no step has looked up yet gets a file per unit."""


LOCAL_LOOKUP_BYTES = 64 * 2**20
"""A lookup whose trace files admitting its keys (see :func:`may_hold`) hold at most this
many bytes is read by the step's process, which sends Spark only the rows holding the keys
(see :data:`LOCAL_LOOKUP_ROWS`): the keys are collected there already, and a step's keys
spread over a trace's whole key range (bids on random old auctions) admit every file, which
Spark would read whole in the step's job to keep the few rows a broadcast of the keys
matches.  Measured at 10M events (``bench/RESULTS.md``, issue 30): a step read 15 MB of
auctions for 2,300 rows; read here, the step / recompute median went 0.355x -> 0.309x."""
LOCAL_LOOKUP_ROWS = 50_000
"""At most this many matching rows are sent from the process (an Arrow batch in the step's
plan); a lookup matching more is read by Spark, as a larger one is."""


LOOKUP_KEYS = "lookup_keys"
"""The checkpoint's record of the key columns each trace is looked up by (see
:meth:`DeltaStateStore.looked_up_by`): kept with the state, so that a compaction or a
relayout run by a process that ran no step (the CLI's) cuts the files it writes by them."""


class DeltaStateStore(StateStore):
    """State tables on Delta Lake with the design's ``versions/open/commit/get_step/set_step``.

    ``materialize`` writes every destination of a step with one Spark job: state deltas
    into their tables (committed by ``apply``), outputs into ``<root>/outputs/<handle>``
    with a ``_step`` column (committed by the output log).
    """

    def __init__(self, spark: SparkSession, root: str, reads: frozenset[int] = READS) -> None:
        """``reads``: the state formats that may be opened (see :data:`STATE_FORMAT`)."""
        self.spark = spark
        self.root = root
        self.reads = reads
        self.checkpoints_uri = os.path.join(root, CHECKPOINTS)
        self._version: int | None = None
        self._opened_log = None
        self._step = 0
        self._tables: dict[str, int] = {}
        self._opened: dict[str, tuple[int, DeltaTable]] = {}
        self._identities: dict[str, tuple | None] = {}  # each restored table as created (delta.table_identity)
        self._meta: dict[str, str] = {}
        self._ordering = threading.Lock()
        self.written_outputs: dict[str, WrittenFiles] = {}
        self._pending: dict[str, WrittenFiles] = {}
        self._rewrites: dict[str, list[str]] = {}
        self._orders: dict[str, tuple[str, ...]] = {}

    # -- the design's database interface ------------------------------------------------

    def _checkpoints(self) -> list[dict]:
        return _checkpoint_rows(open_table(self.checkpoints_uri))

    def versions(self) -> range:
        """The versions that can be opened: the last checkpoint and the one before it."""
        return _openable(self._checkpoints())

    def open(self, version: int | None = None, restore: bool = True) -> None:
        """Opens at checkpoint ``version`` (default: the latest); reads and writes go to
        ``version + 1``.

        ``restore=False`` opens for reading only: tables are read at the versions the
        checkpoint pinned, nothing is restored (so a run advancing the pipeline meanwhile
        is undisturbed), and ``commit`` is refused."""
        # The checkpoint log as of opening: committing on top of this snapshot fails if
        # another writer checkpointed meanwhile (the fencing token is the version).
        log = open_table(self.checkpoints_uri)
        checkpoints = _checkpoint_rows(log)
        openable = _openable(checkpoints)
        version = openable[-1] if version is None else version
        if version not in openable:
            raise StorageError(f"state at {self.root} cannot open version {version}; it has {openable}")
        rows = {r["version"]: r for r in checkpoints}
        record = rows.get(version)
        if version > 0 and record is None:
            raise CorruptTableError(f"{self.checkpoints_uri}: checkpoint {version} is missing")
        if record is not None:
            _check_format(self.root, record, self.reads)
        pinned = json.loads(record["tables"]) if record else {}
        self._step = record["step"] if record else 0
        self._meta = json.loads(record["meta"]) if record else {}
        self._orders = {table: tuple(keys) for table, keys in json.loads(self._meta.get(LOOKUP_KEYS, "{}")).items()}
        if not restore:
            self._version, self._tables = None, pinned
            return
        # Restoring is itself a commit: from here on, a table's base is the restored version.
        restored = {name: self._restore(name, pinned.get(name, 0)) for name in self._table_names()}
        if version + 1 in rows:  # discard the later version, as the design's open() does
            self._restore_checkpoints(version)
            log = None  # the restore is the log's latest version now
        self._version = version
        self._opened_log = log or ensure_table(self.checkpoints_uri, _CHECKPOINT_SCHEMA)
        self._tables = restored

    def commit(self) -> int:
        """Writes checkpoint ``v + 1`` (the commit point) and returns it."""
        if self._version is None:
            raise StorageError("commit() before open()")
        new = self._version + 1
        failpoint("during_commit", self._step - 1)
        row = {
            "version": new,
            "step": self._step,
            "tables": json.dumps(self._tables, sort_keys=True),
            "meta": json.dumps(self._meta, sort_keys=True),
            "engine_version": ENGINE_VERSION,
            "state_format": STATE_FORMAT,
        }
        try:
            write_deltalake(
                self._opened_log,
                pa.Table.from_pylist([row], schema=_CHECKPOINT_SCHEMA),
                mode="append",
                commit_properties=CommitProperties(app_transactions=[Transaction("checkpoint", new)]),
            )
        except CommitFailedError as e:
            raise StaleWriterError(
                f"{self.root}: another writer committed checkpoint {new} first; this run's state is discarded ({e})"
            ) from e
        self._version = new
        return new

    @property
    def opened_version(self) -> int | None:
        return self._version

    def get_step(self) -> int:
        return self._step

    def set_step(self, step: int) -> None:
        self._step = step

    # -- circuits.StateStore ---------------------------------------------------------------

    def _uri(self, name: str) -> str:
        return os.path.join(self.root, "state", name)

    def _table_names(self) -> list[str]:
        return location.listdir(os.path.join(self.root, "state"))

    def _pinned(self, table: str) -> DeltaTable:
        """Trace ``table`` at the version this state pins, opened once per version (a
        version never changes, and a step asks for it in several places)."""
        version = self._tables[table]
        cached = self._opened.get(table)
        if cached is None or cached[0] != version:
            delta = open_table(self._uri(table), version)
            if delta is None:
                raise CorruptTableError(f"state table {self._uri(table)} is missing")
            cached = self._opened[table] = (version, delta)
        return cached[1]

    def _commit(self, name: str, files: WrittenFiles, app_id: str, version: int, remove: list[str] | None) -> None:
        """Commits ``files`` to state table ``name`` on the version this state pins (a table
        this step's write created is at version 0), which then pins the new version.  The
        pinned handle is committed on and so stands for the new version; it is let go at
        every Delta checkpoint, since a handle brought along over many commits grows slower
        (see :data:`storage.delta.REOPEN_COMMITS`), and an open there reads that checkpoint."""
        self._tables.setdefault(name, 0)
        base = self._pinned(name)
        new = self._tables[name] = commit(files, app_id, version, base=base, remove=remove)
        self._identities.setdefault(name, table_identity(self._uri(name)))
        if new % REOPEN_COMMITS:
            self._opened[name] = (new, base)
        else:
            self._opened.pop(name, None)

    def scan(self, table: str) -> DataFrame | None:
        if table not in self._tables:
            return None
        delta = self._pinned(table)
        files = delta.file_uris()
        if not files:
            return None
        return read_files(self.spark, self._uri(table), table_schema(delta), files, self._tables[table])

    def _rows(self, table: str) -> int | None:
        """Rows of the trace by its files' statistics (None: a file has none)."""
        rows = add_actions(self._pinned(table)).column("num_records").to_pylist()
        return None if None in rows else sum(rows)

    def size(self) -> tuple[int, int]:
        """(rows, bytes) of the state's tables at the versions it pins, by their files'
        statistics: read from the handles a step kept, not by opening the tables again."""
        rows = nbytes = 0
        for table in self._tables:
            files = add_actions(self._pinned(table))
            rows += pc.sum(files.column("num_records")).as_py() or 0
            nbytes += pc.sum(files.column("size_bytes")).as_py() or 0
        return rows, nbytes

    def is_small(self, table: str) -> bool:
        if table not in self._tables:
            return False
        rows = self._rows(table)
        return rows is not None and rows <= SMALL_TRACE_ROWS

    def prunes(self, table: str) -> bool:
        """Any trace that is not small: see :data:`SMALL_TRACE_ROWS`."""
        return table in self._tables and not self.is_small(table)

    def looked_up_by(self, table: str, keys: Sequence[str]) -> None:
        """The first keys a trace is looked up by order its large writes (see :data:`CLUSTER_ROWS`),
        and are recorded with the next checkpoint (see :data:`LOOKUP_KEYS`)."""
        with self._ordering:  # nodes are planned several at once
            if table not in self._orders:
                self._orders[table] = tuple(keys)
                self._meta[LOOKUP_KEYS] = json.dumps(self._orders, sort_keys=True)

    def scan_keys(self, table: str, keys: Mapping[str, pa.Array]) -> DataFrame | None:
        """The trace's files whose statistics admit the keys (see :func:`may_hold`); when they
        are small (see :data:`LOCAL_LOOKUP_BYTES`), only their rows holding the keys."""
        if table not in self._tables:
            return None
        delta = self._pinned(table)
        adds = add_actions(delta)
        base = delta.table_uri.rstrip("/")
        held = may_hold(adds, keys)
        files = [f"{base}/{path}" for path, hit in zip(adds.column("path").to_pylist(), held, strict=True) if hit]
        schema = table_schema(delta)
        size = sum(s for s, hit in zip(adds.column("size_bytes").to_pylist(), held, strict=True) if hit)
        if files and size <= LOCAL_LOOKUP_BYTES:
            arrow = pa.schema(delta.schema().to_arrow())
            rows = read_matching(self._uri(table), arrow, files, keys, LOCAL_LOOKUP_ROWS)
            if rows is not None:
                return self.spark.createDataFrame(rows, schema)
        return read_files(self.spark, self._uri(table), schema, files, self._tables[table])

    def materialize(self, parts: dict[str, DataFrame], rows: int | None = None) -> dict[str, DataFrame]:
        """See :meth:`circuits.state.StateStore.materialize`.  A trace's crowded files (see
        :func:`crowded`) are written again with the step's delta, consolidated, and
        :meth:`apply` replaces them.  A step of more than :data:`storage.delta.APART_ROWS`
        input rows writes each table by writer tasks of its own."""
        targets, layout, self._rewrites = {}, self.layout(), {}
        for name, df in parts.items():
            if name.startswith(OUTPUT):
                step = F.lit(self._step).cast("bigint")
                targets[name] = (output_uri(self.root, name[len(OUTPUT) :]), df.withColumn(STEP, step))
                continue
            table = name[len(STATE) :]
            merged = crowded(add_actions(self._pinned(table))) if layout is not None and table in self._tables else []
            if merged:
                self._rewrites[table] = merged
                delta = self._pinned(table)
                base = delta.table_uri.rstrip("/")
                files = read_files(
                    self.spark,
                    self._uri(table),
                    table_schema(delta),
                    [f"{base}/{p}" for p in merged],
                    self._tables[table],
                )
                whole = consolidate(files.unionByName(df.drop(FILE)))
                df = whole.withColumn(FILE, worker_of(layout, F.col(VNODE)))
            targets[name] = (self._uri(table), df)
        orders = {f"{STATE}{table}": order for table, order in self._orders.items()}
        written = write_tables(targets, orders, CLUSTER_ROWS, size=rows, workers=layout.workers)
        self.written_outputs = {n[len(OUTPUT) :]: w for n, w in written.items() if n.startswith(OUTPUT)}
        self._pending = {n[len(STATE) :]: w for n, w in written.items() if n.startswith(STATE)}
        return {
            name: read_files(self.spark, w.uri, from_arrow_schema(w.schema), w.paths).drop(STEP)
            for name, w in written.items()
        }

    def apply(self, deltas: dict[str, DataFrame]) -> None:
        for name in deltas:
            files = self._pending.pop(name)
            failpoint("during_state", self._step)
            rewritten = self._rewrites.pop(name, None)
            if files.actions or rewritten:
                self._commit(name, files, "step", self._step, rewritten)
            else:
                self._tables.setdefault(name, 0)  # version 0: created empty by write_tables

    def compact(self) -> dict[str, tuple[int, int]]:
        """Rewrites every trace consolidated (weights summed, zeros dropped) in one Spark job
        (each trace by writers of its own when they hold more than
        :data:`storage.delta.APART_ROWS` rows together), replacing its files in one Delta
        commit each.  Results do not change: a trace is a
        Z-set, and consolidation is its identity.  Returns ``table -> (files before, after)``."""
        traces = {name: self.scan(name) for name in self._tables}
        layout = self.layout()
        parts = {
            name: (self._uri(name), _by_owner(consolidate(df), layout)) for name, df in traces.items() if df is not None
        }
        before = {name: paths(self._pinned(name)) for name in parts}
        counts = [self._rows(name) for name in parts]
        rows = None if None in counts else sum(counts)
        written = write_tables(parts, self._orders, CLUSTER_ROWS, size=rows, workers=layout.workers) if parts else {}
        for name, files in written.items():
            self._commit(name, files, "compact", self._version + 1, before[name])
        return {name: (len(before[name]), len(files.actions)) for name, files in written.items()}

    def relayout(self, layout: Layout, vnodes: Collection[int], since: dict[str, int] | None = None) -> Relayout:
        """Writes, without committing, every trace file that holds one of ``vnodes`` again,
        partitioned by ``layout`` (each new file holds one worker's vnodes).  With ``since``,
        only files added after those table versions (a hot change's catch-up), every file of
        a table it gives no version of.  One Spark job,
        written as :meth:`compact` writes."""
        wanted = sorted(vnodes)
        parts, removed, rows, nbytes = {}, {}, 0, 0
        for name, version in self._tables.items():
            table = open_table(self._uri(name), version)
            before = set(paths(open_table(self._uri(name), since[name]))) if since and name in since else set()
            hit = [a for a in _vnode_ranges(table) if a["path"] not in before and _overlaps(a, wanted)]
            if not hit:
                continue
            removed[name] = [a["path"] for a in hit]
            rows += sum(a["num_records"] for a in hit)
            nbytes += sum(a["size_bytes"] for a in hit)
            files = [f"{table.table_uri.rstrip('/')}/{a['path']}" for a in hit]
            data = read_files(self.spark, self._uri(name), table_schema(table), files, version)
            parts[name] = (self._uri(name), _by_owner(data, layout))
        written = write_tables(parts, self._orders, CLUSTER_ROWS, size=rows, workers=layout.workers) if parts else {}
        return Relayout(layout, dict(self._tables), written, removed, rows, nbytes)

    def merged_since(self, change: Relayout) -> set[str]:
        """The tables of which a step has merged files that ``change`` rewrote (see
        :func:`crowded`) since it read them: its copies of those would duplicate rows."""
        return {n for n, removed in change.removed.items() if not set(removed) <= set(paths(self._pinned(n)))}

    def apply_relayout(self, *changes: Relayout) -> None:
        """Commits relayouts (a hot change's copy and catch-up together): per table, the new
        files replace the old ones in one Delta commit; then the layout is the new one."""
        for name in sorted({n for change in changes for n in change.removed}):
            mine = [change for change in changes if name in change.removed]
            actions = [a for change in mine for a in change.written[name].actions]
            files = WrittenFiles(self._uri(name), mine[0].written[name].schema, actions)
            removed = [p for change in mine for p in change.removed[name]]
            self._commit(name, files, "relayout", self._version + 1, removed)
            failpoint("during_relayout", self._step)
        self.set_meta(LAYOUT_KEY, changes[-1].layout.to_json())

    def layout(self) -> Layout | None:
        stored = self.get_meta(LAYOUT_KEY)
        return None if stored is None else Layout.from_json(stored)

    def retained_table_versions(self) -> dict[str, set[int]]:
        """The versions of each state table that the openable checkpoints pin."""
        keep: dict[str, set[int]] = {}
        checkpoints = self._checkpoints()
        for row in checkpoints:
            if row["version"] in _openable(checkpoints):
                for name, version in json.loads(row["tables"]).items():
                    keep.setdefault(name, set()).add(version)
        return keep

    def get_meta(self, key: str) -> str | None:
        return self._meta.get(key)

    def set_meta(self, key: str, value: str) -> None:
        self._meta[key] = value

    # -- restore ---------------------------------------------------------------------------

    def _restore(self, name: str, version: int) -> int:
        """Makes table ``name`` hold its contents at ``version``; returns its latest version.

        A table this store has open at ``version`` that has no later version holds those
        contents already: it is neither opened again nor restored, so a process that keeps
        the store open between runs (the step worker) reopens only what another process
        (or a failed step) wrote since."""
        cached = self._opened.get(name)
        if (
            cached is not None
            and cached[0] == version
            and is_latest(self._uri(name), version, self._identities.get(name))
        ):
            return version
        self._identities[name] = table_identity(self._uri(name))
        table = open_table(self._uri(name))
        # Compare contents, not version numbers: a table restored before holds the pinned
        # contents at a later version, and restoring again would only add versions.
        if table.version() != version and set(table.file_uris()) != set(
            open_table(self._uri(name), version).file_uris()
        ):
            _restore_table(table, version)
            table.update_incremental()
        # The step reads the table at this version: it need not be opened again.
        self._opened[name] = (table.version(), table)
        return table.version()

    def _restore_checkpoints(self, version: int) -> None:
        table = open_table(self.checkpoints_uri)
        for delta_version in range(table.version(), -1, -1):
            if (_newest(open_table(self.checkpoints_uri, delta_version)) or 0) <= version:
                _restore_table(table, delta_version)
                return


@dataclass
class Relayout:
    """State files rewritten for a new layout, not yet committed."""

    layout: Layout
    versions: dict[str, int]  # the table versions the files were read at
    written: dict[str, WrittenFiles]
    removed: dict[str, list[str]]  # per table, the files the new ones replace
    rows: int
    bytes: int

    def without(self, tables: Collection[str]) -> Relayout:
        """This relayout but for ``tables``: their files are written again from scratch."""
        return dataclasses.replace(
            self,
            versions={n: v for n, v in self.versions.items() if n not in tables},
            written={n: w for n, w in self.written.items() if n not in tables},
            removed={n: r for n, r in self.removed.items() if n not in tables},
        )


def may_hold(adds: pa.Table, keys: Mapping[str, pa.Array]) -> list[bool]:
    """Per file of ``adds`` (see :func:`storage.delta.add_actions`), whether its statistics
    admit a row whose every column named in ``keys`` holds one of the values listed for it:
    one lies within the file's min and max, or the file has nulls and a null is listed.
    A column without statistics (or of a type they do not order) admits every file."""
    held = [True] * adds.num_rows
    for column, values in keys.items():
        if f"min.{column}" not in adds.column_names:
            continue
        listed = sorted(values.drop_null().to_pylist())
        nulls = adds.column(f"null_count.{column}").to_pylist() if values.null_count else [0] * adds.num_rows
        bounds = zip(adds.column(f"min.{column}").to_pylist(), adds.column(f"max.{column}").to_pylist(), strict=True)
        for i, (low, high) in enumerate(bounds):
            if low is not None and held[i]:
                at = bisect.bisect_left(listed, low)
                held[i] = (at < len(listed) and listed[at] <= high) or bool(nulls[i])
    return held


def crowded(adds: pa.Table) -> list[str]:
    """The files of a trace (its :func:`storage.delta.add_actions`) that the next step adding
    to it merges, by path: a small trace's (at most :data:`SMALL_TRACE_ROWS` rows) every
    file once it has more than :data:`COMPACT_FILES`; a large trace's files of the smallest
    size class holding more than :data:`COMPACT_FILES`, a class being the files of fewer
    than :data:`CLUSTER_ROWS` rows whose row counts have as many hexadecimal digits.
    Merging by class bounds how often a row is written again (a merge's result joins the
    next class, or is cut by its keys past :data:`CLUSTER_ROWS`) and a large trace's loose
    files to a few classes' worth.  None of a trace whose files lack row counts."""
    found = adds.column("path").to_pylist()
    rows = adds.column("num_records").to_pylist()
    if None in rows:
        return []
    if sum(rows) <= SMALL_TRACE_ROWS:
        return found if len(found) > COMPACT_FILES else []
    classes: dict[int, list[str]] = {}
    for path, count in zip(found, rows, strict=True):
        if count < CLUSTER_ROWS:
            classes.setdefault(_size_class(count), []).append(path)
    return next((classes[c] for c in sorted(classes) if len(classes[c]) > COMPACT_FILES), [])


def compaction_due(first: int, after: int) -> bool:
    """Whether a run of steps ``first`` to ``after`` (exclusive) compacts its pipeline's logs
    (see :func:`compact_log`): once every :data:`COMPACT_FILES` steps, so that looking for
    crowded files costs a small step nothing the other times."""
    return after // COMPACT_FILES > first // COMPACT_FILES


LOG_COMPACTION = "log_compaction"
"""The app transaction of a log's compaction commits (see :func:`compact_log`)."""


def compact_log(uri: str, column: str, below: int) -> int:
    """Merges the crowded files (see :func:`crowded`) of the step-keyed log at ``uri`` that
    hold only steps (``column``) before ``below`` into one file sorted by step, written by
    this process and committed as a rearrangement (``dataChange`` false: a reader of the
    table's changes sees none).  A log gains a file a step and every open of a Delta table
    reads the actions of all its files, so without this what a run reads of its logs, and
    what a resident process keeps of them, grows with the pipeline's age.  Readers of a
    log select a step's rows by ``column``, not by file.  Returns the files merged: none
    when none crowd, or when another writer's commit refused this one (a later run
    merges them)."""
    with latest(uri) as table:
        if table is None:
            return 0
        adds = add_actions(table)
        if f"max.{column}" not in adds.column_names:
            return 0
        done = adds.filter(pc.fill_null(pc.less(adds.column(f"max.{column}"), below), False))
        merged = crowded(done)
        if not merged:
            return 0
        schema = pa.schema(table.schema().to_arrow())
        root = table.table_uri.rstrip("/")
        rows = parquet_dataset([f"{root}/{p}" for p in merged], schema).to_table().sort_by(column)
        files = write_local(uri, schema, {None: rows})
        failpoint("during_log_compaction", below)
        try:
            commit(files, LOG_COMPACTION, below, table, merged, data_change=False)
        except StaleWriterError:
            return 0
        return len(merged)


def _size_class(rows: int) -> int:
    """The hexadecimal digits of ``rows``, less one: a merge of about sixteen files of one
    class lands in the next."""
    return (max(rows, 1).bit_length() - 1) // 4


def _by_owner(trace: DataFrame, layout: Layout | None) -> DataFrame:
    """``trace`` partitioned by owning worker, one file per unit of the layout, sorted by vnode."""
    if layout is None:
        return trace.sortWithinPartitions(VNODE)
    return (
        exchange(trace, layout)
        .drop(PART)
        .withColumn(FILE, unit_of(layout, F.col(VNODE)))
        .sortWithinPartitions(FILE, VNODE)
    )


def _vnode_ranges(table) -> list[dict]:
    return add_actions(table).select(["path", "num_records", "size_bytes", f"min.{VNODE}", f"max.{VNODE}"]).to_pylist()


def _overlaps(action: dict, vnodes: list[int]) -> bool:
    """Whether a file's vnode range holds one of the sorted ``vnodes``."""
    i = bisect.bisect_left(vnodes, action[f"min.{VNODE}"])
    return i < len(vnodes) and vnodes[i] <= action[f"max.{VNODE}"]


def _check_format(root: str, record: dict, reads: frozenset[int]) -> None:
    """Refuses state this engine cannot read (rolling upgrade: a newer engine takes over
    between steps; state in another format needs the engine that wrote it)."""
    if record["state_format"] not in reads:
        raise StateFormatError(
            f"the state at {root} (checkpoint {record['version']}) is in state format {record['state_format']}, written "
            f"by engine {record['engine_version']}; this engine ({ENGINE_VERSION}) reads state format "
            f"{' or '.join(map(str, sorted(reads)))} only for this circuit. Run it with an engine that reads that format, "
            "or start this engine on a new store root "
            "(there is no migration between these formats)"
        )


def _checkpoint_rows(table: DeltaTable | None) -> list[dict]:
    """The rows of the openable checkpoints (see :func:`_openable`) in the checkpoint
    ``table``, oldest first: all that opening, recovery and vacuum need.  The table gains a
    file per checkpoint; only the files whose statistics admit those versions are read
    (reading every file made each run's open cost more the older the pipeline: 85 ms per
    run at 40 checkpoints)."""
    newest = None if table is None else _newest(table)
    if newest is None:
        return []
    # A file without statistics is read too.
    rows = sorted(dataset(table, [("version", ">=", newest - 1)]).to_table().to_pylist(), key=lambda r: r["version"])
    return [r for r in rows if r["version"] in _openable(rows)]


def _newest(table: DeltaTable) -> int | None:
    """The newest checkpoint in ``table`` (a version of the checkpoint table), by its files'
    statistics; files without them are read.  None: no checkpoint."""
    actions = add_actions(table)
    stats = actions.column("max.version") if "max.version" in actions.column_names else None
    if actions.num_rows and (stats is None or stats.null_count):
        return max(dataset(table).to_table(columns=["version"]).column("version").to_pylist())
    return None if stats is None else pc.max(stats).as_py()


def latest_checkpoint(root: str) -> tuple[int, int, dict]:
    """The latest checkpoint's (version, step, meta) of the state at ``root``, read without
    opening (or restoring) anything: safe while a run is writing."""
    checkpoints = _checkpoint_rows(open_table(os.path.join(root, CHECKPOINTS)))
    if not checkpoints:
        return 0, 0, {}
    record = checkpoints[-1]
    return record["version"], record["step"], json.loads(record["meta"])


def _openable(checkpoints: list[dict]) -> range:
    if not checkpoints:
        return range(0, 1)
    latest = checkpoints[-1]["version"]
    return range(max(latest - 1, 0), latest + 1)


def _restore_table(table, version: int) -> None:
    try:
        table.restore(version)
    except Exception as e:
        raise CorruptTableError(f"Delta table {table.table_uri}: cannot restore version {version}: {e}") from e
