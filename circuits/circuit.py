"""The circuit builder: input handles, streams of Z-sets, operators, output handles.

A circuit is written once, as the query over whole relations; every operator is
the incremental version of itself, so running the circuit on each step's input
changes yields each step's output changes.  ``Circuit`` records a DAG of nodes in
the order they were declared, which is a topological order.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Executor, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

from pyspark.errors import AnalysisException
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from . import operators as ops
from .context import NodeContext, StepContext
from .errors import CircuitDefinitionError, ExpressionError
from .sharding import PART, VNODE
from .spark import is_remote
from .state import InMemoryStateStore
from .vnodes import DEFAULT_VNODES, Layout
from .zset import WEIGHT, consolidate, empty, nothing, parse_schema

PLANNERS = 4
"""Nodes planned at once: each mostly waits on the Spark server."""
_PLANNER_POOL = ThreadPoolExecutor(PLANNERS, thread_name_prefix="dbsp-plan")
"""One pool for the process's steps over Spark Connect (a planning task never waits on another)."""


class _InOrder(Executor):
    """Runs each task as it is submitted, in the caller's thread."""

    def submit(self, fn, /, *args, **kwargs) -> Future:
        done: Future = Future()
        try:
            done.set_result(fn(*args, **kwargs))
        except BaseException as e:  # handed to the caller by Future.result, as a pool does
            done.set_exception(e)
        return done


_RESERVED = (WEIGHT, VNODE, PART)
_ENGINE_DIRS = {Path(__file__).parent, Path(__file__).parent / "operators"}


def _call_site() -> str:
    """Where the user declared the operator: the first frame outside the engine."""
    for frame in inspect.stack()[2:]:
        if Path(frame.filename).parent not in _ENGINE_DIRS:
            return f"{frame.filename}:{frame.lineno}"
    return "<unknown>"


def _check_name(kind: str, name: str) -> None:
    if not name or name in _RESERVED or name.startswith("_"):
        raise CircuitDefinitionError(f"{kind} name {name!r} is not allowed: names must not start with '_'")


@dataclass(frozen=True)
class Source:
    """Where an expression of a SQL view is written: the view, its file and line, and the
    expression as written there."""

    view: str
    file: str
    line: int
    expression: str


@dataclass(frozen=True)
class Node:
    id: int
    operator: ops.Operator
    inputs: tuple[int, ...]
    site: str

    @property
    def label(self) -> str:
        """Stable within a fingerprint: names the node's state tables."""
        return f"n{self.id:03d}_{self.operator.name}"


class Circuit:
    """A DAG of incremental operators from named inputs to named outputs."""

    def __init__(self, name: str, *, vnodes: int = DEFAULT_VNODES) -> None:
        if vnodes < 1:
            raise CircuitDefinitionError(f"vnodes must be at least 1, got {vnodes}")
        self.name = name
        self.vnodes = vnodes
        self.nodes: list[Node] = []
        self.inputs: dict[str, T.StructType] = {}
        self.outputs: dict[str, int] = {}
        self.declaring: str | None = None
        """Where nodes added now are declared, when not in Python (a SQL view's file and
        line); else the caller's file and line."""
        self.sources: dict[str, Source] = {}
        """The SQL views' expressions by their Spark SQL as the operators evaluate it (over
        the circuit's own column names): Spark names the one that failed by that text.  Not
        part of the fingerprint."""
        self._checked: tuple[SparkSession, str, Checked] | None = None

    def input(self, name: str, schema: T.StructType | str) -> Stream:
        """An input handle whose deltas have ``schema`` (a StructType or DDL string) plus a weight."""
        _check_name("input", name)
        if name in self.inputs:
            raise CircuitDefinitionError(f"input {name!r} is declared twice")
        parsed = parse_schema(schema)
        for field in parsed.fields:
            _check_name(f"input {name!r} column", field.name)
        self.inputs[name] = parsed
        return self._add(ops.Input(name, parsed), ())

    def output(self, name: str, stream: Stream) -> None:
        """Publishes ``stream`` (consolidated each step) as output handle ``name``."""
        _check_name("output", name)
        if name in self.outputs:
            raise CircuitDefinitionError(f"output {name!r} is declared twice")
        self._own(stream)
        self.outputs[name] = stream.node

    def _own(self, stream: Stream) -> None:
        if stream.circuit is not self:
            raise CircuitDefinitionError(f"a stream of circuit {stream.circuit.name!r} used in {self.name!r}")

    def _add(self, operator: ops.Operator, inputs: Sequence[Stream]) -> Stream:
        for s in inputs:
            self._own(s)
        node = Node(len(self.nodes), operator, tuple(s.node for s in inputs), self.declaring or _call_site())
        self.nodes.append(node)
        return Stream(self, node.id)

    def fingerprint(self) -> str:
        """A hash of the circuit's structure: operators, parameters, wiring, outputs, vnodes."""
        shape = {
            "vnodes": self.vnodes,
            "nodes": [
                {"op": n.operator.name, "params": n.operator.params(), "inputs": list(n.inputs)} for n in self.nodes
            ],
            "outputs": self.outputs,
        }
        return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:16]

    def plan(
        self, step: StepContext, analyze: bool = False, nodes: dict[int, DataFrame] | None = None
    ) -> dict[str, DataFrame]:
        """Plans one step (no Spark job runs): the output deltas, consolidated.

        Operators stage their state deltas in ``step.staged``.  With ``analyze``, Spark
        analyses each node's delta as it is planned, so that an unresolvable expression
        is reported with its operator (over Spark Connect, plans are analysed only when
        Spark is asked about them), and ``step.schemas`` records its schema.  With the
        schemas known, planning asks Spark nothing about them, and a node that is empty
        this step is a leaf of no rows instead of its operator's plan.

        The nodes are planned layer by layer: a lookup into a large trace needs its keys
        collected first (see :meth:`NodeContext.lookup`), and the lookups of the nodes
        whose inputs are planned collect theirs together, with one Spark job.  ``nodes``,
        when given, receives every node's delta by node id."""
        flags = self._flags(step)
        consumers = Counter(i for node in self.nodes for i in node.inputs)
        once = self._planned_once()
        deltas: dict[int, DataFrame] = {}

        def planned(node: Node) -> tuple[Node, DataFrame | None]:
            inputs = [deltas[i] for i in node.inputs]
            return node, self._plan_node(step, node, inputs, flags, consumers[node.id], once[node.id], analyze)

        # A classic session's planning calls are in-process: they have no waits to overlap.
        pool = _PLANNER_POOL if is_remote(step.spark) else _InOrder()
        while True:
            self._plan_layer(pool, planned, deltas)
            if len(deltas) == len(self.nodes):
                break
            step.collect_keys()
        if nodes is not None:
            nodes.update(deltas)
        return {
            name: deltas[node] if self._consolidated(node) else consolidate(deltas[node])
            for name, node in self.outputs.items()
        }

    def _plan_layer(self, pool: Executor, planned, deltas: dict[int, DataFrame]) -> None:
        """Plans every node it can until only nodes waiting for collected keys are left,
        each as soon as its inputs are planned, several at once where ``pool`` runs tasks
        at once: a node's planning waits on the server (a shared frame's round trip plans
        it and runs its exchanges), and independent branches of the circuit overlap their
        waits."""
        readers = self._readers()

        def ready(node: Node) -> bool:
            return node.id not in deltas and all(i in deltas for i in node.inputs)

        running = {pool.submit(planned, node) for node in self.nodes if ready(node)}
        while running:
            done, running = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                node, delta = future.result()
                if delta is None:  # it waits for keys: so do its readers
                    continue
                deltas[node.id] = delta
                # A node reading this one twice (a self-join) is one task.
                now = {r.id: r for r in readers[node.id] if ready(r)}
                running |= {pool.submit(planned, r) for r in now.values()}

    def _flags(self, step: StepContext) -> tuple[dict[int, bool], dict[int, bool]]:
        """Per node, whether every input stream of it has only ever inserted rows, and
        whether its delta is known to be empty this step."""
        append_only: dict[int, bool] = {}  # of each node's own delta
        inputs_append_only: dict[int, bool] = {}
        empty: dict[int, bool] = {}
        for node in self.nodes:
            inputs_append_only[node.id] = bool(node.inputs) and all(append_only[i] for i in node.inputs)
            if isinstance(node.operator, ops.Input):
                append_only[node.id] = node.operator.handle in step.append_only
                empty[node.id] = node.operator.handle in step.empty_inputs
            else:
                append_only[node.id] = node.operator.keeps_append_only and inputs_append_only[node.id]
                empty[node.id] = node.operator.zero_preserving and all(empty[i] for i in node.inputs)
        return inputs_append_only, empty

    def _readers(self) -> dict[int, list[Node]]:
        """Per node, the nodes that read its delta, once per input they read it as."""
        readers: dict[int, list[Node]] = {node.id: [] for node in self.nodes}
        for node in self.nodes:
            for i in node.inputs:
                readers[i].append(node)
        return readers

    def _planned_once(self) -> dict[int, bool]:
        """Per node, whether its delta's plan goes into one plan only, not much deeper: the
        write of an output no operator reads, or, through one operator that
        :attr:`~circuits.operators.base.Operator.reads_once`, of such an output.  (A longer
        chain would nest plans deeper than a Spark Connect client can send.)"""
        outputs = Counter(self.outputs.values())
        readers = self._readers()

        def written_only(i: int) -> bool:
            return outputs[i] == 1 and not readers[i]

        def through_one(i: int) -> bool:
            if outputs[i] or len(readers[i]) != 1:
                return False
            return readers[i][0].operator.reads_once and written_only(readers[i][0].id)

        return {node.id: written_only(node.id) or through_one(node.id) for node in self.nodes}

    def _plan_node(
        self,
        step: StepContext,
        node: Node,
        inputs: list[DataFrame],
        flags: tuple[dict[int, bool], dict[int, bool]],
        consumers: int,
        once: bool,
        analyze: bool,
    ) -> DataFrame | None:
        """The delta of ``node`` over its inputs' deltas ``inputs``, or None: a lookup of the
        node waits for keys to be collected, and what it staged is dropped."""
        inputs_append_only, empty = flags
        known = step.schemas.get(node.id)
        if empty[node.id] and known is not None and not analyze:
            return nothing(step.spark, known)
        try:
            schemas = (
                tuple(step.schemas[i] for i in node.inputs) if all(i in step.schemas for i in node.inputs) else None
            )
            ctx = NodeContext(
                step,
                node.label,
                inputs_append_only[node.id],
                empty[node.id],
                schemas,
                tuple(empty[i] for i in node.inputs),
            )
            delta = node.operator.evaluate(ctx, *inputs)
            if ctx.deferred:
                ctx.wait()
                return None
            if analyze:
                # Any question about the plan makes Spark analyse it (not .schema alone: a
                # Connect client answers that from the parent's where it cannot change, as
                # for a filter).
                delta.isLocal()
                step.schemas[node.id] = delta.schema
            # Spark plans are trees: a delta read by several operators, or produced by a
            # stateful one (whose plan is large) and read by another that may read its input
            # in several terms, is shared so that later plans refer to it instead of copying
            # its whole subtree.  A delta planned once anyway is not: sharing it would cost a
            # round trip and plan it twice (alone, then as the leaf of its reader's plan).
            if consumers > 1 or (node.operator.stateful and consumers and not once):
                delta = ctx.share(delta)
            return delta
        except (AnalysisException, ExpressionError) as e:
            reason = str(e).strip().splitlines()[0]
            raise ExpressionError(
                f"operator '{node.operator.name}' ({node.label}) of circuit {self.name!r}, declared at "
                f"{node.site}: {reason}"
            ) from e

    def _consolidated(self, node_id: int) -> bool:
        node = self.nodes[node_id]
        if node.operator.consolidates:
            return True
        return node.operator.keeps_consolidation and self._consolidated(node.inputs[0])

    def check(self, spark: SparkSession) -> Checked:
        """Plans a step on empty inputs and no state: finds every unresolvable expression
        before any data is read.  Returns the schemas (weight included) of the outputs and
        of every node's delta.  The answer is kept for ``spark`` and the circuit as it is
        (its fingerprint): a new state of the same circuit asks Spark nothing again (a
        check of a large circuit is hundreds of round trips)."""
        if not self.outputs:
            raise CircuitDefinitionError(f"circuit {self.name!r} has no outputs")
        fingerprint = self.fingerprint()
        if self._checked is not None and self._checked[0] is spark and self._checked[1] == fingerprint:
            return self._checked[2]
        step = StepContext(
            spark,
            InMemoryStateStore(),
            Layout.balanced(self.vnodes, 1),
            {name: empty(spark, schema) for name, schema in self.inputs.items()},
            empty_inputs=frozenset(self.inputs),
        )
        try:
            outputs = {name: df.schema for name, df in self.plan(step, analyze=True).items()}
            self._checked = (spark, fingerprint, Checked(outputs, step.schemas))
            return self._checked[2]
        finally:
            step.release()


@dataclass(frozen=True)
class Checked:
    """What :meth:`Circuit.check` learned of a circuit's schemas."""

    outputs: dict[str, T.StructType]
    nodes: dict[int, T.StructType]
    """Each node's delta, by node id: given to later steps (``StepContext.schemas``), they
    plan with no question to Spark about schemas."""

    def to_json(self) -> str:
        return json.dumps({str(i): s.jsonValue() for i, s in self.nodes.items()})

    @staticmethod
    def nodes_from_json(text: str) -> dict[int, T.StructType]:
        return {int(i): T.StructType.fromJson(s) for i, s in json.loads(text).items()}


class Stream:
    """A stream of Z-sets: one delta per step.  Methods add operators to the circuit."""

    def __init__(self, circuit: Circuit, node: int) -> None:
        self.circuit = circuit
        self.node = node

    def _then(self, operator: ops.Operator, *others: Stream) -> Stream:
        return self.circuit._add(operator, (self, *others))

    # linear
    def filter(self, condition: Column | str) -> Stream:
        return self._then(ops.Filter(condition))

    def select(self, *columns: Column | str, **named: Column | str) -> Stream:
        """Projection: column names or expressions, and ``name=expression`` pairs."""
        for name in named:
            _check_name("column", name)
        exprs = [*columns, *[_as_column(e).alias(n) for n, e in named.items()]]
        if not exprs:
            raise CircuitDefinitionError("select() needs at least one column")
        return self._then(ops.Select(tuple(exprs)))

    map = select

    def flat_map(self, alias: str, array: Column, *keep: str) -> Stream:
        """One row per element of the array expression ``array`` (named ``alias``), beside ``keep``."""
        _check_name("column", alias)
        return self._then(ops.FlatMap(alias, array, tuple(keep)))

    def union(self, *others: Stream) -> Stream:
        return self._then(ops.Union(1 + len(others)), *others)

    def negate(self) -> Stream:
        return self._then(ops.Negate())

    def minus(self, other: Stream) -> Stream:
        """``self - other`` as Z-sets (SQL ``EXCEPT ALL`` when ``other`` is contained in ``self``)."""
        return self.union(other.negate())

    # bilinear
    def join(self, other: Stream, on: str | Sequence[str], how: str = "inner") -> Stream:
        """Equi-join on columns named ``on`` on both sides; ``how`` is ``inner`` or ``left``."""
        keys = (on,) if isinstance(on, str) else tuple(on)
        if not keys:
            raise CircuitDefinitionError("join() needs at least one key column in on=")
        if how not in ("inner", "left"):
            raise CircuitDefinitionError(f"join how={how!r} is not supported; use 'inner' or 'left'")
        return self._then(ops.Join(keys, how), other)

    def left_join(self, other: Stream, on: str | Sequence[str]) -> Stream:
        return self.join(other, on, how="left")

    def keyed_join(self, other: Stream, on: Sequence[str], how: str, condition: str | None = None) -> Stream:
        """A join of any of Spark's types (inner, left, right, full, left_semi, left_anti) on
        the columns ``on`` (both sides name them alike) and the Spark SQL ``condition``; see
        :class:`circuits.operators.KeyedJoin`."""
        if not on:
            raise CircuitDefinitionError("keyed_join() needs at least one key column in on=")
        return self._then(ops.KeyedJoin(tuple(on), how, condition), other)

    def set_operation(self, other: Stream, kind: str) -> Stream:
        """SQL's ``EXCEPT [ALL]`` and ``INTERSECT [ALL]`` (``kind``: ``except``,
        ``except_all``, ``intersect``, ``intersect_all``); both sides name their columns alike."""
        return self._then(ops.SetOperation(kind), other)

    # non-linear
    def distinct(self) -> Stream:
        return self._then(ops.Distinct())

    def default_row(self, *zeros: str) -> Stream:
        """This stream while its integral has rows, else one row of nulls (0 in ``zeros``):
        a global aggregate from an aggregate grouped by a constant."""
        return self._then(ops.DefaultRow(zeros))

    def group_by(self, *keys: str) -> GroupedStream:
        if not keys:
            raise CircuitDefinitionError("group_by() needs at least one key column")
        return GroupedStream(self, keys)

    def top_k(
        self,
        partition: Sequence[str],
        order: Sequence[ops.SortKey],
        k: int,
        ranking: str = "row_number",
        rank_column: str | None = None,
    ) -> Stream:
        """Per value of the ``partition`` columns (none: one group), the rows ranked at most
        ``k`` under ``order``; see :class:`circuits.operators.TopK`."""
        if rank_column is not None:
            _check_name("column", rank_column)
        return self._then(ops.TopK(tuple(partition), tuple(order), k, ranking, rank_column))

    def window(self, partition: Sequence[str], functions: Sequence[tuple[str, str, str]]) -> Stream:
        """Each row with the window functions ``(name, call, spec)`` over its partition (per
        value of the ``partition`` columns; none: one partition); see
        :class:`circuits.operators.WindowFunctions`."""
        for name, _, _ in functions:
            _check_name("column", name)
        return self._then(ops.WindowFunctions(tuple(partition), tuple(tuple(f) for f in functions)))

    # time
    def integrate(self) -> Stream:
        return self._then(ops.Integrate())

    def differentiate(self) -> Stream:
        return self._then(ops.Differentiate())

    def delay(self) -> Stream:
        return self._then(ops.Delay())

    def output(self, name: str) -> Stream:
        self.circuit.output(name, self)
        return self


class GroupedStream:
    def __init__(self, stream: Stream, keys: tuple[str, ...]) -> None:
        self.stream = stream
        self.keys = keys

    def agg(self, **aggs: ops.Agg) -> Stream:
        """``name=agg.sum("column")`` pairs; see :mod:`circuits.agg`."""
        if not aggs:
            raise CircuitDefinitionError("agg() needs at least one aggregate")
        for name, a in aggs.items():
            _check_name("aggregate", name)
            if not isinstance(a, ops.Agg) or a.kind not in ops.AGG_KINDS:
                raise CircuitDefinitionError(f"aggregate {name!r}: expected one of circuits.agg.{ops.AGG_KINDS}")
            if a.kind == "recomputed" and not (a.call and a.reads):
                raise CircuitDefinitionError(f"aggregate {name!r}: recomputed needs a call and the columns it reads")
            if a.column is None and a.kind not in ("count", "recomputed"):
                raise CircuitDefinitionError(f"aggregate {name!r}: {a.kind} needs a column")
        return self.stream._then(ops.Aggregate(self.keys, tuple(aggs.items())))


def _as_column(e: Column | str) -> Column:
    return F.col(e) if isinstance(e, str) else e


__all__ = ["Circuit", "GroupedStream", "Node", "Stream"]
