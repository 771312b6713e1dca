"""Non-linear operators: ``distinct`` and group-by aggregates.

Neither distributes over ``+``, so each keeps the integral of its input (or an
accumulator per group) and re-derives only the rows or groups the step's delta
touches: output = ``Q(state + Δ) - Q(state)`` restricted to those keys.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import reduce
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ..context import NodeContext, in_groups
from ..errors import CircuitDefinitionError
from ..sharding import PART, ROUTED, VNODE, with_vnode
from ..zset import WEIGHT, add, consolidate, data_columns, empty_like, weight
from .base import Operator


def _positive(w: Column) -> Column:
    return F.when(w > 0, 1).otherwise(0)


class Distinct(Operator):
    """``distinct(Z)``: weight 1 for every row whose weight is positive.

    Incremental: for each row in ``Δ``, with ``w`` its weight in the integral before the
    step, emit ``[w + Δw > 0] - [w > 0]`` when non-zero.  State: the integral.
    """

    stateful = True

    name = "distinct"
    consolidates = True

    def evaluate(self, ctx: NodeContext, delta: DataFrame) -> DataFrame:
        columns = data_columns(ctx.schema(0, delta))
        d = ctx.keyed(delta, columns)
        d = d.groupBy(*ROUTED, *columns).agg(F.sum(WEIGHT).alias(WEIGHT))
        old = ctx.lookup("trace", d, columns, d, null_safe=True)
        ctx.stage("trace", d)
        both = add(
            d.select(*ROUTED, *columns, weight().alias("_dw"), F.lit(0).cast("bigint").alias("_w0")),
            old.select(*ROUTED, *columns, F.lit(0).cast("bigint").alias("_dw"), weight().alias("_w0")),
        )
        changed = both.groupBy(*ROUTED, *columns).agg(F.sum("_w0").alias("_w0"), F.sum("_dw").alias("_dw"))
        change = _positive(F.col("_w0") + F.col("_dw")) - _positive(F.col("_w0"))
        return changed.select(*columns, change.cast("bigint").alias(WEIGHT)).where(weight() != 0)


@dataclass(frozen=True)
class Agg:
    """One aggregate of a group: ``kind`` over ``column`` (None for ``count(*)``); of kind
    ``recomputed``, ``call`` (Spark SQL of an aggregate over the input's columns ``reads``)."""

    kind: str
    column: str | None = None
    call: str | None = None
    reads: tuple[str, ...] = ()

    def describe(self) -> str:
        return self.call or f"{self.kind}({self.column or '*'})"


_ADDITIVE = ("count", "sum", "avg", "count_distinct")
_EXTREMES = {"min": F.min, "max": F.max}
MOMENTS = ("var_samp", "var_pop", "stddev_samp", "stddev_pop")
_DISTINCT = ("count_distinct", "sum_distinct", "avg_distinct")
_SUMMED = ("sum", "avg", "sum_distinct", "avg_distinct")  # a running sum of the column's values
_REPLACED = (*_EXTREMES, "recomputed")  # kept per group, derived again, not summed
AGG_KINDS = (*_ADDITIVE, *_EXTREMES, *MOMENTS, "sum_distinct", "avg_distinct", "recomputed")
_ROWS = "_rows"
_HELD = "_held"
_GONE = "_gone"
_ROW_TRACE = "rows"
_W0 = "_w0"
_DW = "_dw"


class Aggregate(Operator):
    """``SELECT keys, agg... GROUP BY keys`` with SQL semantics: a group exists while it has
    rows; ``count(c)``, ``sum``, ``avg``, ``min``, ``max``, the ``*_distinct`` ones and the
    moments ignore nulls; all but the counts are null over no non-null value.  The moments
    (``var_samp``, ``var_pop``, ``stddev_samp``, ``stddev_pop``) are Spark's over the values
    as doubles: ``m2 = (n·Σx² - (Σx)²) / n``, over ``n - 1`` (null while ``n < 2``) or ``n``.
    ``sum_distinct``/``avg_distinct``: ``sum``/``avg`` of the distinct values.  ``recomputed``:
    any Spark aggregate ``call``, Spark's own value over the group's rows.

    Incremental, per group the delta touches: output = ``row(after) - row(before)``.
    ``count``/``sum``/``avg`` and the moments keep running sums (``after = before + Δ``: of
    ``x``, of ``x²`` and of the non-null rows); the ``*_distinct`` ones add the values whose
    weight crosses zero (their number, their sum); ``min``/``max`` keep the extreme and
    how many rows hold it: while rows still hold it, the new extreme is it against the
    delta's, and only a group whose extreme's rows all go is derived again from the
    integral of its column; ``recomputed`` evaluates ``call``
    over the touched groups' integrated rows, each repeated by its weight.
    State: one row of accumulators per group, plus the integral of each column that a
    min/max/``*_distinct`` reads, plus the integral of the rows (keys and ``reads``) when a
    ``recomputed`` aggregate reads them.
    """

    stateful = True

    name = "aggregate"
    consolidates = True

    def __init__(self, keys: tuple[str, ...], aggs: tuple[tuple[str, Agg], ...]) -> None:
        self.keys = keys
        self.aggs = aggs

    def params(self) -> dict[str, Any]:
        # The state's columns too: a state kept with others cannot be read.
        return {
            "keys": list(self.keys),
            "aggs": {n: a.describe() for n, a in self.aggs},
            "state": self._state_columns(),
        }

    def evaluate(self, ctx: NodeContext, delta: DataFrame) -> DataFrame:
        keys = list(self.keys)
        d = ctx.keyed(delta, keys)
        schema = ctx.schema(0, delta)
        partial = d.groupBy(*ROUTED, *keys).agg(
            F.sum(WEIGHT).alias(_ROWS),
            *[p.alias(name) for i, (_, a) in enumerate(self.aggs) for name, p in _partials(i, a, schema).items()],
        )
        template = self._state_template(d, schema)
        before = ctx.share(ctx.lookup("groups", partial, keys, template, null_safe=True))
        # Each contribution is a set of per-group rows; summed (or min/max-ed) per group they
        # give the accumulators after the step.
        kept = [_ROWS, *self._additive_columns()]
        contributions = [
            _shape(before, self._state_columns(), keys, kept),
            _shape(partial, self._state_columns(), keys, [_ROWS, *self._partial_columns()]),
        ]
        for column in sorted({a.column for _, a in self.aggs if a.kind in (*_EXTREMES, *_DISTINCT)}):
            values = d.select(*ROUTED, *keys, column, weight())
            if any(a.kind in _EXTREMES and a.column == column for _, a in self.aggs):
                contributions.append(self._extremes(ctx, column, keys, values, partial, before))
            if any(a.kind in _DISTINCT and a.column == column for _, a in self.aggs):
                contributions.append(self._distinct_changes(ctx, column, keys, values, schema))
            ctx.stage(f"values.{column}", values)
        if any(a.kind == "recomputed" for _, a in self.aggs):
            contributions.append(self._recomputed(ctx, keys, d, partial))
        state_columns = self._state_columns()
        # Read twice: by the state's delta and by the output's.
        after = ctx.share(
            add(*contributions)
            .groupBy(*ROUTED, *keys)
            .agg(*[self._combine(c, schema) for c in state_columns])
            .where(F.col(_ROWS) != 0)
        )
        ctx.stage(
            "groups",
            add(
                before.select(VNODE, *keys, *state_columns, (-weight()).alias(WEIGHT)),
                after.select(VNODE, *keys, *state_columns, F.lit(1).cast("bigint").alias(WEIGHT)),
            ),
        )
        result = add(self._result(after, 1), self._result(before, -1))
        return (
            result.groupBy(PART, *self.keys, *[name for name, _ in self.aggs])
            .agg(F.sum(WEIGHT).alias(WEIGHT))
            .where(weight() != 0)
            .drop(PART)
        )

    def _state_template(self, d: DataFrame, schema: T.StructType) -> DataFrame:
        """The shape of a group's state row, as a zero-row DataFrame: each accumulator as it
        is computed, over none of the delta ``d``'s rows (``schema``: the input's)."""
        columns = {_ROWS: F.sum(WEIGHT)}
        for i, (_, a) in enumerate(self.aggs):
            columns.update(_partials(i, a, schema))
            columns.update(_kept(i, a, schema))
        grouped = empty_like(d).groupBy(*ROUTED, *self.keys).agg(*[c.alias(n) for n, c in columns.items()])
        return grouped.select("*", F.lit(1).cast("bigint").alias(WEIGHT))

    def _state_columns(self) -> list[str]:
        """A group's state row beside its keys: its row count, then the accumulators (the
        delta's partial ones, then those kept per group: extremes, distinct changes, the
        recomputed values)."""
        kept = [name for i, (_, a) in enumerate(self.aggs) for name in _kept(i, a)]
        return [_ROWS, *self._partial_columns(), *kept]

    def _partial_columns(self) -> list[str]:
        return [name for i, (_, a) in enumerate(self.aggs) for name in _partials(i, a)]

    def _additive_columns(self) -> list[str]:
        """The accumulators that a step's contributions add to (see :func:`_partials` and
        :func:`_kept`): all but those derived again from the group's values."""
        return [
            name
            for i, (_, a) in enumerate(self.aggs)
            if a.kind not in _REPLACED
            for name in (*_partials(i, a), *_kept(i, a))
        ]

    def _combine(self, column: str, schema: T.StructType) -> Column:
        aggs = {f"_a{i}": a for i, (_, a) in enumerate(self.aggs)}
        kind = aggs[column].kind if column in aggs else ""
        if kind in _EXTREMES:
            return _EXTREMES[kind](column).alias(column)
        if kind == "recomputed":  # one contribution has the group's value: the recomputed one
            return F.first(column, ignorenulls=True).alias(column)
        # A zero of the sum's own type: an int's zero widens a decimal(38, s) sum to
        # decimal(39, s), which Spark bounds to 38 digits by dropping a decimal.
        summed = _accumulator(schema[aggs[column].column].dataType) if kind in _SUMMED else None
        zero = F.lit(0) if summed is None else F.lit(0).cast(summed)
        return F.coalesce(F.sum(column), zero).alias(column)

    def _extremes(
        self, ctx: NodeContext, column: str, keys: list[str], values: DataFrame, partial: DataFrame, before: DataFrame
    ) -> DataFrame:
        """min/max of ``column`` over each touched group's rows after the step (the groups of
        ``partial``, their state ``before``), and how many rows hold it (``values``: the
        step's rows of the column, weighted).  A group's old extreme stands while rows
        still hold it: the new one is then it against the most extreme value the step adds.
        Only a group whose extreme's rows all go is derived again from its values (the
        trace of the column is read for those groups alone; not at all while the input only
        inserts, when no extreme goes)."""
        aggs = {i: a.kind for i, (_, a) in enumerate(self.aggs) if a.kind in _EXTREMES and a.column == column}
        held = {i: f"{_HELD}{i}" for i in aggs}
        changes = values.where(F.col(column).isNotNull())
        # Per value the step touches, and at each old extreme: the rows the step adds and the
        # rows that held the extreme.  A value is known present after the step where it is
        # an old extreme still held, or where the step adds rows of it (no value beyond the
        # old extreme had rows, so its rows are then the step's alone).
        at_old = [
            before.where(F.col(f"_a{i}").isNotNull()).select(
                *ROUTED,
                *keys,
                F.col(f"_a{i}").alias(column),
                F.lit(0).cast("bigint").alias(WEIGHT),
                F.col(f"_c{i}").alias(held[i]),
            )
            for i in aggs
        ]
        per_value = (
            add(*at_old, changes, allow_missing=True)
            .groupBy(*ROUTED, *keys, column)
            .agg(F.sum(WEIGHT).alias(WEIGHT), *[F.max(h).alias(h) for h in held.values()])
        )
        rows = {i: F.coalesce(F.col(h), F.lit(0)) + weight() for i, h in held.items()}
        per_group = per_value.groupBy(*ROUTED, *keys).agg(
            *[
                _EXTREMES[kind](F.when(rows[i] > 0, F.struct(column, rows[i].alias(WEIGHT)))).alias(f"_a{i}")
                for i, kind in aggs.items()
            ],
            F.max(reduce(Column.__or__, [F.col(h).isNotNull() & (rows[i] <= 0) for i, h in held.items()])).alias(_GONE),
        )
        extremes = [
            c
            for i in aggs
            for c in (
                F.col(f"_a{i}").getField(column).alias(f"_a{i}"),
                F.col(f"_a{i}").getField(WEIGHT).alias(f"_c{i}"),
            )
        ]
        parts = [per_group.where(~F.col(_GONE)).select(*ROUTED, *keys, *extremes)]
        if not ctx.append_only:
            lost = per_group.where(F.col(_GONE)).select(*ROUTED, *keys)
            old = ctx.lookup(f"values.{column}", partial, keys, values, null_safe=True, within=lost)
            present = (
                add(old, in_groups(values, lost, keys))
                .groupBy(*ROUTED, *keys, column)
                .agg(F.sum(WEIGHT).alias(WEIGHT))
                .where((weight() > 0) & F.col(column).isNotNull())
            )
            derived = present.groupBy(*ROUTED, *keys).agg(
                *[_EXTREMES[kind](F.struct(column, WEIGHT)).alias(f"_a{i}") for i, kind in aggs.items()]
            )
            parts.append(derived.select(*ROUTED, *keys, *extremes))
        names = [n for i in aggs for n in (f"_a{i}", f"_c{i}")]
        return _shape(add(*parts), self._state_columns(), keys, names)

    def _distinct_changes(
        self, ctx: NodeContext, column: str, keys: list[str], values: DataFrame, schema: T.StructType
    ) -> DataFrame:
        """Per touched group, the values that appear minus those that disappear: their
        number and, for ``sum_distinct``/``avg_distinct``, their sum."""
        pairs = values.where(F.col(column).isNotNull()).groupBy(*ROUTED, *keys, column).agg(F.sum(WEIGHT).alias(WEIGHT))
        old = ctx.lookup(f"values.{column}", pairs, [*keys, column], values, null_safe=True)
        zero = F.lit(0).cast("bigint")
        both = add(
            pairs.select(*ROUTED, *keys, column, zero.alias(_W0), weight().alias(_DW)),
            old.select(*ROUTED, *keys, column, weight().alias(_W0), zero.alias(_DW)),
        )
        # Each value's change weighs +1 where it appears, -1 where it disappears.
        crossing = _positive(F.sum(_W0) + F.sum(_DW)) - _positive(F.sum(_W0))
        per_pair = both.groupBy(*ROUTED, *keys, column).agg(crossing.cast("bigint").alias(WEIGHT))
        changes = {
            name: change
            for i, (_, a) in enumerate(self.aggs)
            if a.kind in _DISTINCT and a.column == column
            for name, change in _kept(i, a, schema).items()
        }
        per_group = per_pair.groupBy(*ROUTED, *keys).agg(*[c.alias(name) for name, c in changes.items()])
        return _shape(per_group, self._state_columns(), keys, list(changes))

    def _recomputed(self, ctx: NodeContext, keys: list[str], d: DataFrame, partial: DataFrame) -> DataFrame:
        """Each ``recomputed`` aggregate's value over the rows of the touched groups after
        the step: Spark's own aggregate, over each row repeated by its weight."""
        reads = sorted({c for _, a in self.aggs if a.kind == "recomputed" for c in a.reads} - set(keys))
        rows = d.select(*ROUTED, *keys, *reads, weight())
        old = ctx.lookup(_ROW_TRACE, partial, keys, rows, null_safe=True)
        ctx.stage(_ROW_TRACE, rows)
        present = add(old, rows).groupBy(*ROUTED, *keys, *reads).agg(F.sum(WEIGHT).alias(WEIGHT))
        repeated = present.where(weight() > 0).select(
            *ROUTED, *keys, *reads, F.explode(F.array_repeat(F.lit(0), weight().cast("int"))).alias("_copy")
        )
        calls = _kept_calls(self.aggs)
        per_group = repeated.groupBy(*ROUTED, *keys).agg(*[c.alias(name) for name, c in calls.items()])
        return _shape(per_group, self._state_columns(), keys, list(calls))

    def _result(self, state: DataFrame, sign: int) -> DataFrame:
        """The visible rows (groups with rows) of a state, with weight ``sign``."""
        values = [_value(i, a).alias(name) for i, (name, a) in enumerate(self.aggs)]
        return state.where(F.col(_ROWS) > 0).select(PART, *self.keys, *values, F.lit(sign).cast("bigint").alias(WEIGHT))


def _value(i: int, a: Agg) -> Column:
    """Aggregate ``i``'s value from its accumulators (see :func:`_partials`, :func:`_kept`)."""
    acc, n = F.col(f"_a{i}"), F.col(f"_n{i}")
    if a.kind in ("sum", "sum_distinct"):
        return F.when(n > 0, acc)
    if a.kind in ("avg", "avg_distinct"):
        return F.when(n > 0, acc.cast("double") / n)
    if a.kind in MOMENTS:
        # Exact for integers while the sums are (below 2**53): one rounding, in the division.
        count, squares = n.cast("double"), F.col(f"_q{i}")
        spread = F.greatest(count * squares - acc * acc, F.lit(0.0))
        variance = spread / (count * (count - 1) if a.kind.endswith("samp") else count * count)
        value = F.sqrt(variance) if a.kind.startswith("stddev") else variance
        return F.when(n > (1 if a.kind.endswith("samp") else 0), value)
    return acc


def _partials(i: int, a: Agg, schema: T.StructType | None = None) -> dict[str, Column]:
    """The per-group partial accumulators of one step's delta for aggregate ``i`` (over
    columns of ``schema``; without it, only their names are meant)."""
    w = weight()
    if a.kind == "count":
        counted = w if a.column is None else F.when(F.col(a.column).isNotNull(), w).otherwise(0)
        return {f"_a{i}": F.sum(counted)}
    nonnull = F.sum(F.when(F.col(a.column).isNotNull(), w).otherwise(0)) if a.column else None
    if a.kind in ("sum", "avg"):
        return {f"_a{i}": F.sum(_weighted(a.column, schema[a.column].dataType if schema else None)), f"_n{i}": nonnull}
    if a.kind in MOMENTS:
        x = F.col(a.column).cast("double")
        return {f"_a{i}": F.sum(x * w), f"_n{i}": nonnull, f"_q{i}": F.sum(x * x * w)}
    return {}


def _kept(i: int, a: Agg, schema: T.StructType | None = None) -> dict[str, Column]:
    """The accumulators of aggregate ``i`` kept per group rather than summed from the delta:
    each as computed over a group's values (the extremes), over its values' changes (the
    distinct ones: a frame of ``column`` and the change's weight) or over its rows (a
    recomputed ``call``); without ``schema``, only their names are meant."""
    if a.kind in _EXTREMES:  # the extreme and how many rows hold it
        return {f"_a{i}": _EXTREMES[a.kind](a.column), f"_c{i}": F.sum(WEIGHT)}
    if a.kind == "count_distinct":
        return {f"_a{i}": F.sum(WEIGHT)}
    if a.kind in ("sum_distinct", "avg_distinct"):
        kind = schema[a.column].dataType if schema else None
        return {f"_a{i}": F.sum(_weighted(a.column, kind)), f"_n{i}": F.sum(WEIGHT)}
    if a.kind == "recomputed":
        return {f"_a{i}": F.expr(a.call)}
    return {}


def _kept_calls(aggs: tuple[tuple[str, Agg], ...]) -> dict[str, Column]:
    return {name: c for i, (_, a) in enumerate(aggs) if a.kind == "recomputed" for name, c in _kept(i, a).items()}


def _accumulator(kind: T.DataType | None) -> T.DecimalType | None:
    """The type of a running sum of a ``decimal(p, s)``: ``decimal(38, s)`` (None for others)."""
    return T.DecimalType(38, kind.scale) if isinstance(kind, T.DecimalType) else None


def _weighted(column: str, kind: T.DataType | None) -> Column:
    """``column`` times the row's weight.  Weights are 1 or -1 but for repeated rows.  A
    ``decimal(p, s)`` times a bigint (a ``decimal(20, 0)``) has a precision over 38 once
    ``p > 17``, which Spark rounds to fewer decimals; so a decimal is multiplied as its
    unscaled integer (its digits without the point, a ``decimal(38, 0)``: the product keeps
    scale 0, exact while it fits the sum's type), put back at scale ``s`` by its text."""
    value, w, accumulator = F.col(column), weight(), _accumulator(kind)
    if accumulator is None:
        return value * w
    unscaled = F.translate(value.cast(accumulator).cast("string"), ".", "").cast(T.DecimalType(38, 0))
    product = F.concat((unscaled * w).cast("string"), F.lit(f"E-{kind.scale}")).cast(accumulator)
    return F.when(w == 1, value).when(w == -1, -value).otherwise(product).cast(accumulator)


def _shape(df: DataFrame, state: list[str], keys: list[str], provided: list[str]) -> DataFrame:
    """``df`` as per-group rows (with their routing columns) of the ``state`` columns:
    ``provided`` ones from ``df``, the rest null.  The nulls are typed by the union of
    contributions (Spark widens a null column to the others' type), so no schema is asked for."""
    nulls = [F.lit(None).alias(c) for c in state if c not in provided]
    return df.select(*ROUTED, *keys, *provided, *nulls)


_SET_WEIGHTS = {
    "except_all": lambda a, b: F.greatest(a - b, F.lit(0)),
    "except": lambda a, b: _positive(a) * (1 - _positive(b)),
    "intersect_all": lambda a, b: F.least(a, b),
    "intersect": lambda a, b: _positive(a) * _positive(b),
}
_A0, _DA, _B0, _DB = "_a0", "_da", "_b0", "_db"


class SetOperation(Operator):
    """SQL's ``A EXCEPT [ALL] B`` and ``A INTERSECT [ALL] B`` (``kind``: ``except_all``,
    ``except``, ``intersect_all``, ``intersect``), rows equal when every column is (nulls
    equal; both sides name their columns alike).  A row of weight ``a`` in ``A`` and ``b``
    in ``B`` has weight ``max(a - b, 0)``, ``[a > 0 and b = 0]``, ``min(a, b)`` or
    ``[a > 0 and b > 0]``.

    Incremental: for each row of ``ΔA`` or ``ΔB``, ``f(a + Δa, b + Δb) - f(a, b)`` with
    ``a``, ``b`` its weights in the integrals before the step.  State: both integrals.
    """

    stateful = True

    name = "set_operation"
    arity = 2
    consolidates = True

    def __init__(self, kind: str) -> None:
        if kind not in _SET_WEIGHTS:
            raise CircuitDefinitionError(f"set operation {kind!r} is not one of {tuple(_SET_WEIGHTS)}")
        self.kind = kind

    def params(self) -> dict[str, Any]:
        return {"kind": self.kind}

    def evaluate(self, ctx: NodeContext, left: DataFrame, right: DataFrame) -> DataFrame:
        columns = data_columns(ctx.schema(0, left))
        deltas = []
        for delta in (left, right):
            d = ctx.keyed(delta.select(*columns, weight()), columns)
            deltas.append(d.groupBy(*ROUTED, *columns).agg(F.sum(WEIGHT).alias(WEIGHT)))
        touched = add(*[d.select(*ROUTED, *columns) for d in deltas])
        zero = F.lit(0).cast("bigint")
        terms = []
        for side, d, (old_w, delta_w) in zip(("left", "right"), deltas, ((_A0, _DA), (_B0, _DB))):
            old = ctx.lookup(side, touched, columns, d, null_safe=True)
            ctx.stage(side, d)
            for frame, w in ((d, delta_w), (old, old_w)):
                others = [zero.alias(c) for c in (_A0, _DA, _B0, _DB) if c != w]
                terms.append(frame.select(*ROUTED, *columns, weight().alias(w), *others))
        sums = add(*terms).groupBy(*ROUTED, *columns).agg(*[F.sum(c).alias(c) for c in (_A0, _DA, _B0, _DB)])
        f = _SET_WEIGHTS[self.kind]
        a0, b0 = F.col(_A0), F.col(_B0)
        change = f(a0 + F.col(_DA), b0 + F.col(_DB)) - f(a0, b0)
        return sums.select(*columns, change.cast("bigint").alias(WEIGHT)).where(weight() != 0)


class DefaultRow(Operator):
    """``Z`` while its integral has rows, else one default row: SQL's global aggregate (one
    row even over no input) from an aggregate grouped by nothing.  The default row has 0
    in the columns ``zeros`` (counts) and null in the others.

    Incremental: the output's integral after the step minus the one before, both kept as
    state (with the input's integral, at most one row each for a global aggregate).
    """

    stateful = True
    zero_preserving = False  # the default row appears at the first step, with no input

    name = "default_row"

    def __init__(self, zeros: tuple[str, ...]) -> None:
        self.zeros = zeros

    def params(self) -> dict[str, Any]:
        return {"zeros": list(self.zeros)}

    def evaluate(self, ctx: NodeContext, delta: DataFrame) -> DataFrame:
        schema = ctx.schema(0, delta)
        columns = data_columns(schema)
        vnodes = ctx.layout.vnodes
        d = with_vnode(delta.select(*columns, weight()), columns, vnodes)
        total = consolidate(add(ctx.scan("integral", d), d))
        ctx.stage("integral", d)
        values = [(F.lit(0) if c in self.zeros else F.lit(None)).cast(schema[c].dataType).alias(c) for c in columns]
        default = ctx.step.spark.range(1).select(*values, F.lit(1).cast("bigint").alias(WEIGHT))
        after = add(total.select(*columns, weight()), default.join(total, F.lit(True), "left_anti"))
        after = with_vnode(after, columns, vnodes)
        change = add(after, ctx.scan("output", after).withColumn(WEIGHT, -weight()))
        ctx.stage("output", change)
        return change.drop(VNODE)
