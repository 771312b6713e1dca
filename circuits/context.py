"""What an operator sees while it plans one step."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import reduce

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import from_arrow_schema

from .sharding import PART, VNODE, exchange, part_of, with_vnode
from .state import DEST, StateStore, pack, part_column
from .vnodes import Layout
from .zset import consolidate, empty_like, nothing


@dataclass
class Asked:
    """The keys a lookup into a large trace reads it by: a frame of them, and once collected
    (see :meth:`StepContext.collect_keys`), their values per key column.  In a
    :attr:`~StepContext.single` step, also the distinct keys with their vnodes, which the
    lookup broadcasts from this process: the frame is then computed once, by the collection,
    with no checkpoint (a round trip).  A larger step's keys may be many: their frame is
    shared, so that computing them for the collection also serves the broadcast."""

    frame: DataFrame
    keys: tuple[str, ...]
    null_safe: bool
    values: dict[str, pa.Array] | None = None
    rows: pa.Table | None = None


@dataclass
class StepContext:
    """One step's planning: its inputs, the state as of the previous step, and staged deltas."""

    spark: SparkSession
    store: StateStore
    layout: Layout
    inputs: Mapping[str, DataFrame]
    append_only: frozenset[str] = frozenset()
    """Inputs that have never had a negative weight, this step included."""
    empty_inputs: frozenset[str] = frozenset()
    """Inputs known to be empty this step (absent from the step's inputs)."""
    single: bool = False
    """Plan the step in one Spark partition (a small change): every keyed frame sits in it,
    so joins and groupings need no exchange and the step runs as one stage."""
    conformed: bool = False
    """The inputs have their declared schemas already (see :func:`circuits.zset.conform`)."""
    large: bool = False
    """A step of many input rows: it looks every trace up as a small one (see
    :data:`circuits.runner.LARGE_STEP_ROWS`)."""
    schemas: dict[int, T.StructType] = field(default_factory=dict)
    """The schema of each node's delta, by node id, where known (see
    :meth:`circuits.circuit.Circuit.check`)."""
    staged: dict[str, DataFrame] = field(default_factory=dict)
    shared: list[DataFrame] = field(default_factory=list)
    asked: dict[str, Asked] = field(default_factory=dict)
    """The keys of the step's lookups into large traces, by lookup (see :meth:`NodeContext.lookup`)."""
    waited: dict[str, list[DataFrame]] = field(default_factory=dict)
    """What each node that waited for keys had shared before it waited, by label: planned
    again, it shares the same frames first, in the same order (no lookup had waited before
    them), and reads these instead of computing them again."""
    found_nothing: list[DataFrame] = field(default_factory=list)
    """Lookup results known to hold no rows: their trace does not exist yet (a pipeline's
    first step, a load).  :meth:`share` passes them on as they are."""

    def route(self, df: DataFrame, *, scanned: bool = False) -> DataFrame:
        """``df`` (which has a :data:`VNODE` column) with its routing columns, on the worker
        owning each row's vnode; in a :attr:`single` step, in the step's one partition.
        There, a ``scanned`` frame (a large trace's matches, read by many tasks) is
        gathered by a shuffle; any other is merged without one, in the task that reads it."""
        if not self.single:
            return exchange(df, self.layout)
        routed = df.withColumn(PART, part_of(self.layout, F.col(VNODE)))
        return routed.repartition(1) if scanned else routed.coalesce(1)

    def build(self, df: DataFrame) -> DataFrame:
        """``df`` as the side a join builds its hash table from, in a :attr:`single` step:
        Spark would otherwise sort both sides for a sort-merge join (broadcast is off), and
        those sorts' interpreted comparisons took a quarter of a 100,000-row step's task.
        In a step across workers the sort-merge join stays: its sides may be too large to
        hash in memory."""
        return df.hint("shuffle_hash") if self.single else df

    def share(self, df: DataFrame, empty: bool) -> DataFrame:
        """``df`` computed once for the rest of the step: a leaf that later plans refer to
        instead of copying ``df``'s plan (whose analysis, planning and broadcasts would
        then be paid once per copy).  Its rows are computed now, by a job of their own, not
        by the first job that needs them (a lazy checkpoint): the step's planners run jobs
        over a shared frame at once, and Spark deadlocks when one job marks a frame
        checkpointed while the scheduler submits another over it
        (``RDDCheckpointData.checkpoint`` and ``DAGScheduler.getCacheLocs`` take the same
        two locks in opposite orders).  They are kept in the executors until
        :meth:`release`; losing an executor loses them and fails the step, which the
        pipeline then runs again.  In a :attr:`single` step
        the leaf is marked as the one partition it is (Spark cannot know a checkpoint's
        partitioning), so joins and groupings over it need no exchange.

        An ``empty`` ``df`` (known so from the circuit, not asked of Spark) is returned as a
        provably empty relation instead, with its schema and none of its plan: a checkpoint
        would hide the emptiness from the optimizer downstream, and chains of empty
        operators' plans would otherwise nest deeper than a Spark Connect client can send
        (about 50 relations)."""
        if empty:
            return nothing(self.spark, df.schema)
        if any(df is found for found in self.found_nothing):
            # Its plan is a false filter, which Spark prunes with every term it empties; a
            # checkpoint would hide that, and costs a round trip.
            return df
        cut = df.localCheckpoint(eager=True)
        self.shared.append(cut)
        return cut.coalesce(1) if self.single else cut

    def unstage(self, label: str) -> None:
        """Forgets what node ``label`` staged: it is planned again."""
        # A copy of the keys first: other nodes' planner threads may stage meanwhile.
        for table in [t for t in list(self.staged) if t.startswith(f"{label}.")]:
            del self.staged[table]

    def collect_keys(self) -> None:
        """Collects the values of every asked lookup's keys not collected yet with one Spark
        job: the lookups of one circuit layer (nodes whose inputs were ready together) pay
        one round trip, not one each."""
        asked = [a for a in self.asked.values() if a.values is None]
        frames = {str(i): a.frame.select(_PROBE_VNODE, *_key_columns(len(a.keys))) for i, a in enumerate(asked)}
        collected = pack(frames).toArrow()
        for i, a in enumerate(asked):
            rows = pa.Table.from_struct_array(
                collected.filter(pc.equal(collected.column(DEST), i)).column(part_column(i)).combine_chunks()
            )
            a.rows = _distinct(rows) if self.single else None
            values = {k: pc.unique(rows.column(c)) for k, c in zip(a.keys, _key_columns(len(a.keys)), strict=True)}
            a.values = values if a.null_safe else {k: v.drop_null() for k, v in values.items()}

    def release(self) -> None:
        """Drops the step's shared frames.  Over Spark Connect, the last reference to a
        checkpointed frame going away frees it on the server; in a classic session, the
        context cleaner frees its blocks after the next JVM garbage collection."""
        self.shared.clear()


@dataclass
class NodeContext:
    """A :class:`StepContext` seen from one node; state tables are named after the node."""

    step: StepContext
    label: str
    append_only: bool = False
    """Every input stream of the node has only ever inserted rows (this step included), so
    its integral is a relation and this step's delta has no negative weight."""
    empty: bool = False
    """The node's operator preserves zero and every input stream of the node comes only
    from inputs that are empty this step: every frame it plans is empty, and it changes no
    state."""
    schemas: tuple[T.StructType, ...] | None = None
    """The schemas of the node's input deltas, when known without asking Spark (see
    :meth:`circuits.circuit.Circuit.check`)."""
    empty_inputs: tuple[bool, ...] = ()
    """Which of the node's input deltas are known to be empty this step (fed only by empty
    inputs): an operator may leave out the terms they contribute nothing to, which Spark
    would otherwise analyse and optimize away on every step."""
    deferred: bool = False
    """A lookup of the node asked for keys that are not collected yet: what the node plans
    is dropped, and it is planned again once its layer's keys are collected."""
    looked_up: Counter = field(default_factory=Counter)
    """Lookups planned so far, by trace: names a lookup the same in every planning."""
    shares: list[DataFrame] = field(default_factory=list)
    """The frames shared so far in this planning (see :attr:`StepContext.waited`)."""

    def is_empty(self, i: int) -> bool:
        """Whether input ``i``'s delta is known to be empty this step."""
        return bool(self.empty_inputs) and self.empty_inputs[i]

    def schema(self, i: int, delta: DataFrame) -> T.StructType:
        """The schema of input ``i``, whose delta is ``delta``; over Spark Connect, asking
        ``delta`` is a round trip."""
        return self.schemas[i] if self.schemas is not None else delta.schema

    @property
    def layout(self) -> Layout:
        return self.step.layout

    def input(self, name: str) -> DataFrame:
        return self.step.inputs[name]

    def table(self, suffix: str) -> str:
        return f"{self.label}.{suffix}"

    def share(self, df: DataFrame) -> DataFrame:
        """See :meth:`StepContext.share`: for a frame the node reads in several terms, each
        of which would otherwise compute it again (a lookup: broadcast its keys, scan the trace).
        Once the node is :attr:`deferred`, its frames are not computed: they are dropped."""
        if self.deferred:
            return df
        earlier = self.step.waited.get(self.label, ())
        n = len(self.shares)
        self.shares.append(earlier[n] if n < len(earlier) else self.step.share(df, self.empty))
        return self.shares[-1]

    def wait(self) -> None:
        """Drops what the node staged: it is planned again once its keys are collected,
        and then reads the frames it shared so far (see :attr:`StepContext.waited`)."""
        self.step.unstage(self.label)
        self.step.waited[self.label] = self.shares

    def keyed(self, df: DataFrame, keys: Sequence[str]) -> DataFrame:
        """``df`` with the vnode of ``keys``, routed to the worker owning it."""
        return self.step.route(with_vnode(df, keys, self.layout.vnodes))

    def stage(self, suffix: str, delta: DataFrame) -> None:
        """Adds ``delta`` (which carries a vnode column) to trace ``suffix`` at the end of the step."""
        if self.empty:
            return
        delta = delta.drop(PART)
        table = self.table(suffix)
        previous = self.step.staged.get(table)
        self.step.staged[table] = delta if previous is None else previous.unionByName(delta)

    def scan(self, suffix: str, template: DataFrame) -> DataFrame:
        """The whole consolidated trace, or an empty one shaped like ``template``."""
        trace = self.step.store.scan(self.table(suffix))
        if trace is None:
            return empty_like(template)
        return consolidate(trace.coalesce(1) if self.step.single else trace)

    def lookup(
        self,
        suffix: str,
        probe: DataFrame,
        keys: Sequence[str],
        template: DataFrame,
        *,
        null_safe: bool,
        within: DataFrame | None = None,
        consolidated: bool = True,
    ) -> DataFrame:
        """The consolidated rows of trace ``suffix`` whose vnode and ``keys`` occur in ``probe``
        (which carries the routing columns: it is keyed); with ``within`` (rows of a vnode
        and ``keys``, which may come from another lookup), only those of its rows, kept
        before the trace's rows are consolidated (a filter over the consolidated rows
        would come after the grouping of them all).

        Only these rows are shuffled, unless the trace is small (see
        :meth:`~circuits.state.StateStore.is_small`) or the step :attr:`~StepContext.large`.
        ``null_safe`` makes null keys equal (grouping semantics); otherwise null keys match
        nothing (join semantics).  Without ``consolidated``, a row may come in several parts
        whose weights sum to its own (as the trace's files hold it), for a caller that
        consolidates them with other rows anyway: Spark then plans one grouping, not two.
        The result carries the routing columns and sits on the owning workers.

        A lookup into a large trace may find no rows while its keys are collected (see
        :attr:`deferred`): an operator must not compute a lookup's ``probe`` from another
        lookup's result.
        """
        table, store = self.table(suffix), self.step.store
        store.looked_up_by(table, keys)
        wanted = probe.select(
            F.col(PART).alias("_p_part"),
            F.col(VNODE).alias(_PROBE_VNODE),
            *[F.col(k).alias(c) for k, c in zip(keys, _key_columns(len(keys)), strict=True)],
        )
        if store.is_small(table) or self.step.large:
            trace = store.scan(table)
            if trace is None:
                return self.keyed_empty(template)
            # Route the whole trace: both sides then sit on the workers owning their
            # vnodes, and the semi-join runs in place, within the step's job.
            trace = self.step.route(trace)
            wanted = self.step.build(wanted)
            condition = _matching(trace, wanted, keys, null_safe) & (trace[PART] == wanted["_p_part"])
            found = in_groups(trace.join(wanted, condition, "left_semi"), within, keys)
            return consolidate(found, routed=True) if consolidated else found
        # The step's keys are the small side: broadcast them and filter the trace where it
        # is read, so only the matching rows (as many as the change touches) are shuffled
        # to their owners, never the whole trace.  Consolidating with the partition column
        # among the keys then keeps the rows where the exchange put them.
        wanted = wanted.drop("_p_part")
        trace, wanted = self._large(table, wanted, keys, null_safe)
        if trace is None:
            return self.keyed_empty(template)
        matched = trace.join(F.broadcast(wanted), _matching(trace, wanted, keys, null_safe), "left_semi")
        found = self.step.route(in_groups(matched, within, keys), scanned=True)
        return consolidate(found, routed=True) if consolidated else found

    def _large(
        self, table: str, wanted: DataFrame, keys: Sequence[str], null_safe: bool
    ) -> tuple[DataFrame | None, DataFrame]:
        """What a lookup of ``wanted``'s keys reads of large trace ``table``, and the keys
        to broadcast.  Spark cannot skip a file by a broadcast's values; the store can, by
        the files' statistics (:meth:`~circuits.state.StateStore.scan_keys`), once the keys
        are collected.  Their collection is asked for here and made by the circuit for
        every lookup of a layer at once (see :meth:`StepContext.collect_keys`): until then,
        the node is :attr:`deferred` and the lookup finds no rows, which only stands in."""
        store = self.step.store
        if not store.prunes(table):
            return store.scan(table), wanted
        lookup = f"{table}#{self.looked_up[table]}"
        self.looked_up[table] += 1
        asked = self.step.asked.get(lookup)
        if asked is None:
            frame = wanted if self.step.single else self.step.share(wanted, False)
            asked = self.step.asked[lookup] = Asked(frame, tuple(keys), null_safe)
        if asked.values is None:
            self.deferred = True
            return None, asked.frame
        if asked.rows is None:
            broadcast = asked.frame
        else:
            broadcast = self.step.spark.createDataFrame(asked.rows, from_arrow_schema(asked.rows.schema))
        return store.scan_keys(table, asked.values), broadcast

    def keyed_empty(self, template: DataFrame) -> DataFrame:
        """A lookup result with no rows, routed like any other: frames that mix it with
        keyed ones (shared ones included) stay partitioned by worker, so groupings over
        them stay in place and state files keep one worker's vnodes each.  ``template``
        is keyed (it has the routing columns)."""
        found = self.step.route(empty_like(template))
        self.step.found_nothing.append(found)
        return found


def _distinct(rows: pa.Table) -> pa.Table:
    """The distinct rows of ``rows``; all of them where Arrow cannot group their types."""
    try:
        return rows.group_by(rows.column_names, use_threads=False).aggregate([])
    except pa.ArrowNotImplementedError:
        return rows


def in_groups(frame: DataFrame, groups: DataFrame | None, keys: Sequence[str]) -> DataFrame:
    """The rows of ``frame`` whose vnode and ``keys`` are those of a row of ``groups``
    (nulls equal; all of them when ``groups`` is None)."""
    if groups is None:
        return frame
    columns = [VNODE, *keys]
    wanted = F.broadcast(groups.select(*[F.col(c).alias(f"_g_{i}") for i, c in enumerate(columns)]))
    condition = reduce(Column.__and__, [frame[c].eqNullSafe(wanted[f"_g_{i}"]) for i, c in enumerate(columns)])
    return frame.join(wanted, condition, "left_semi")


_PROBE_VNODE = "_p_vnode"
"""The vnode column of a lookup's probe (see :meth:`NodeContext.lookup`)."""


def _key_columns(count: int) -> list[str]:
    """The key columns of a lookup's probe (see :meth:`NodeContext.lookup`)."""
    return [f"_p_{i}" for i in range(count)]


def _matching(trace: DataFrame, wanted: DataFrame, keys: Sequence[str], null_safe: bool) -> Column:
    """Whether a ``trace`` row has the vnode and ``keys`` of a ``wanted`` row."""
    condition = trace[VNODE] == wanted[_PROBE_VNODE]
    for k, c in zip(keys, _key_columns(len(keys)), strict=True):
        condition = condition & _equal(trace[k], wanted[c], null_safe)
    return condition


def _equal(a: Column, b: Column, null_safe: bool) -> Column:
    return a.eqNullSafe(b) if null_safe else a == b
