"""Runtime errors of a view's expressions, traced to the input records that cause them.

Under ANSI mode Spark fails a whole job when one value makes an expression fail: a cast
of a malformed string, a division by zero, an overflow, a date that does not parse (a
*data exception*: SQLSTATE class ``22``).  Such an error belongs to the record, not to
the pipeline: :func:`culprits` finds the input records that make some expression fail
and :func:`without` removes them from a step's input deltas, so that the step runs on
the rest (the caller dead-letters them).

A record is a culprit when the *row-wise* part of the circuit fails on it alone: the
operators that map each input row on its own (filter, select, flat map, negate) from its
input up to the first operator that combines rows (a join, an aggregate, a union).  Run on
the step's rows of one input, that part fails exactly where one of those rows does; the
rows are bisected, a Spark job per half, until each failing row stands alone.  An error
raised beyond that part (an expression over a join's two sides, or over an aggregate's
value) depends on more than one record: no culprit is found, and the step fails with a
:class:`RecordError` naming the view's expression that failed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from . import operators as ops
from .circuit import Circuit, Node, Source
from .errors import RecordError, chain
from .spark import aggregate_each
from .zset import add, with_weight_schema

if TYPE_CHECKING:
    from .runner import StepRunner

ROW_WISE = (ops.Filter, ops.Select, ops.FlatMap, ops.Negate)
"""The operators that map each row on its own: a failure under them is one row's."""
_ID = "_record"
TIMESTAMPS = {
    "timestampFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX",
    "timestampNTZFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSS",
}
"""A record's JSON keeps its timestamps' microseconds (Spark's default keeps milliseconds),
so that the record parsed back equals the row."""


@dataclass(frozen=True)
class Culprit:
    """An input record that makes an expression fail: its input handle, the record as
    JSON (its columns and its ``_weight``), the expression (None: not one of a SQL view's)
    and Spark's message."""

    handle: str
    value: str
    source: Source | None
    message: str


def data_error(error: BaseException) -> PySparkException | None:
    """The Spark data exception (SQLSTATE class 22: a cast, a division, an overflow, a
    datetime) in ``error``'s chain of causes, or None."""
    # Raised where Spark waits on another thread (a broadcast), the exception comes as an
    # unknown one, its SQLSTATE only in its text.
    found = (
        e
        for e in chain(error)
        if isinstance(e, PySparkException) and _DATA_EXCEPTION.search(f"SQLSTATE: {e.getSqlState()} {e}")
    )
    return next(found, None)


_DATA_EXCEPTION = re.compile(r"SQLSTATE: 22\w{3}")
_MESSAGE = re.compile(r"\[[A-Z_.]+\].*?SQLSTATE: \w{5}", re.DOTALL)


def message_of(error: PySparkException) -> str:
    """Spark's message: its error class, text and SQLSTATE, without the query context
    (which names the engine's columns) or the stack."""
    found = _MESSAGE.search(str(error))
    return found.group(0) if found else str(error).split("\n")[0]


def source_of(circuit: Circuit, error: PySparkException) -> Source | None:
    """The view's expression whose Spark SQL is the fragment ``error`` failed in, if any."""
    for context in error.getQueryContext() or []:
        found = circuit.sources.get(context.fragment())
        if found is not None:
            return found
    return None


def record_error(runner: StepRunner, deltas: Mapping[str, DataFrame], error: PySparkException) -> RecordError:
    """The error for a data exception ``error`` of a step on ``deltas`` that no single
    input record was found to cause, naming the view's expression that fails (see
    :func:`failing_source`)."""
    found = source_of(runner.circuit, error) or failing_source(runner, deltas)
    if isinstance(found, Source):
        where = f"view {found.view!r} ({found.file}:{found.line}), expression {found.expression}"
    else:
        where = f"the operator declared at {found}" if found else f"circuit {runner.circuit.name!r}"
    return RecordError(
        f"{where} failed on the step's rows: {message_of(error)}. No single input record causes it (the expression "
        "reads a join's two sides or an aggregate's value), so the step cannot go on without one: make the expression "
        "tolerate the value (try_cast, try_divide, try_to_date, ...) in a new pipeline, or quarantine the record that "
        "brings the value (dbsp quarantine, docs/operating.md) and run the step again"
    )


def failing_source(runner: StepRunner, deltas: Mapping[str, DataFrame]) -> Source | str | None:
    """Where a step on ``deltas`` fails: its nodes are run one by one, in order, and of
    the first that fails, the view's shortest expression that fails over the node's input
    (a Spark job each: this is for a step that failed already).  A node of no such
    expression is named by where it was declared; None when the plan itself fails."""
    circuit = runner.circuit
    try:
        ctx, nodes = runner.planned(deltas)
    except Exception as e:
        if data_error(e) is None:
            raise
        return None
    try:
        for node in circuit.nodes:
            if node.inputs and _failure(nodes[node.id].select(F.xxhash64(F.struct("*")).alias("_h"))):
                return _failing_expression(circuit, node, nodes[node.inputs[0]]) or node.site
        return None
    finally:
        ctx.release()


def _failing_expression(circuit: Circuit, node: Node, input: DataFrame) -> Source | None:
    """The view's shortest expression of ``node`` that fails over its ``input``, if any."""
    params = json.dumps(node.operator.params())
    for text in sorted((t for t in circuit.sources if t in params), key=len):
        if _failure(input.select(F.xxhash64(F.expr(text)).alias("_h"))):
            return circuit.sources[text]
    return None


def _failure(hashes: DataFrame) -> PySparkException | None:
    """The data exception computing ``hashes`` (a ``_h`` column) raises, or None."""
    try:
        aggregate_each([hashes], F.bit_xor("_h"))
    except Exception as e:
        error = data_error(e)
        if error is None:
            raise
        return error
    return None


def culprits(spark: SparkSession, circuit: Circuit, deltas: Mapping[str, DataFrame]) -> list[Culprit]:
    """The records of ``deltas`` (each input handle's delta of a step) on which the
    row-wise part of ``circuit`` fails, each with the expression and Spark's message."""
    found = []
    for handle, delta in deltas.items():
        frontier = _row_wise_frontier(circuit, handle)
        if frontier:
            found += _Bisection(circuit, handle, delta, frontier).run()
    return found


def without(spark: SparkSession, circuit: Circuit, deltas: Mapping[str, DataFrame], values: list[tuple[str, str]]):
    """``deltas`` without the records ``values`` ((handle, the record's JSON) pairs), each
    removed once: a delta holding a record twice keeps one copy when it is listed once."""
    out = dict(deltas)
    by_handle: dict[str, list[str]] = {}
    for handle, value in values:
        by_handle.setdefault(handle, []).append(value)
    for handle, listed in by_handle.items():
        if handle in out:
            out[handle] = out[handle].exceptAll(parsed(spark, circuit, handle, listed))
    return out


def parsed(spark: SparkSession, circuit: Circuit, handle: str, values: list[str]) -> DataFrame:
    """The records ``values`` (JSON, see :func:`record_json`) of input ``handle`` as rows."""
    schema = with_weight_schema(circuit.inputs[handle])
    rows = spark.createDataFrame([(v,) for v in values], "value string")
    return rows.select(F.from_json("value", schema, TIMESTAMPS).alias("r")).select("r.*")


def record_json(df: DataFrame) -> DataFrame:
    """Each row of ``df`` (a Z-set) as the JSON :func:`without` reads back."""
    return df.select(F.to_json(F.struct("*"), TIMESTAMPS).alias("value"))


def _row_wise_frontier(circuit: Circuit, handle: str) -> list[list[int]]:
    """The chains of row-wise nodes from input ``handle`` (node ids, input first) that end
    where a non-row-wise operator, an output or nothing reads the chain's last node."""
    start = next(n.id for n in circuit.nodes if isinstance(n.operator, ops.Input) and n.operator.handle == handle)
    readers: dict[int, list[int]] = {}
    for node in circuit.nodes:
        for i in node.inputs:
            readers.setdefault(i, []).append(node.id)
    chains, todo = [], [[start]]
    while todo:
        chain = todo.pop()
        nexts = [r for r in readers.get(chain[-1], []) if isinstance(circuit.nodes[r].operator, ROW_WISE)]
        todo += [[*chain, r] for r in nexts]
        ends = len(nexts) < len(readers.get(chain[-1], [])) or chain[-1] in circuit.outputs.values()
        if len(chain) > 1 and (ends or not nexts):
            chains.append(chain)
    return chains


class _Bisection:
    """One input's step rows, numbered, and the row-wise chains from it: halves of the
    rows are run through the chains until each failing row stands alone."""

    def __init__(self, circuit: Circuit, handle: str, delta: DataFrame, chains: list[list[int]]) -> None:
        self.circuit = circuit
        self.handle = handle
        self.chains = chains
        # Numbered once and kept: every half is cut from the same rows in the same order.
        self.rows = delta.withColumn(_ID, F.monotonically_increasing_id()).localCheckpoint()
        self.ids = [r[0] for r in self.rows.select(_ID).orderBy(_ID).collect()]

    def run(self) -> list[Culprit]:
        return list(self._failing(0, len(self.ids))) if self.ids else []

    def _failing(self, lo: int, hi: int) -> Iterator[Culprit]:
        """The culprits among rows ``lo..hi`` (indices into the numbered rows)."""
        error = self._error(self._between(lo, hi).drop(_ID))
        if error is None:
            return
        if hi - lo == 1:
            ((value,),) = record_json(self._between(lo, hi).drop(_ID)).collect()
            # Run on the record alone, as a literal relation, Spark names the expression
            # that failed (over the numbered rows, its query context may come empty).
            alone = parsed(self.rows.sparkSession, self.circuit, self.handle, [value])
            error = self._error(alone) or error
            yield Culprit(self.handle, value, source_of(self.circuit, error), message_of(error))
            return
        middle = (lo + hi) // 2
        yield from self._failing(lo, middle)
        yield from self._failing(middle, hi)

    def _between(self, lo: int, hi: int) -> DataFrame:
        return self.rows.where(F.col(_ID).between(self.ids[lo], self.ids[hi - 1]))

    def _error(self, rows: DataFrame) -> PySparkException | None:
        """The data exception the chains raise over ``rows``, or None."""
        return _failure(add(*[_through(self.circuit, chain, rows) for chain in self.chains]))


def _through(circuit: Circuit, chain: list[int], rows: DataFrame) -> DataFrame:
    """``rows`` mapped by the row-wise operators of ``chain`` (after its input), as one
    hash per row of every column the chain's end gives (each is computed)."""
    df = rows
    for node in chain[1:]:
        df = circuit.nodes[node].operator.evaluate(None, df)
    return df.select(F.xxhash64(F.struct("*")).alias("_h"))
