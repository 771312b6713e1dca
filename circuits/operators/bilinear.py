"""Bilinear operators: ``(a + Δa) ⋈ (b + Δb) - a ⋈ b = Δa ⋈ b + a ⋈ Δb + Δa ⋈ Δb``.

State: the integral of each side, keyed by the join key's vnode.  A step reads only
the rows of the keys its deltas touch.
"""

from __future__ import annotations

from functools import reduce
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from ..context import NodeContext
from ..errors import CircuitDefinitionError, ExpressionError
from ..sharding import ROUTED
from ..zset import WEIGHT, add, consolidate, data_columns, weight
from .base import Operator

_RIGHT_WEIGHT = "_weight_right"


class Join(Operator):
    """Equi-join on the columns ``on`` (both sides name them alike); weights multiply.

    ``how="inner"``: rows of ``A × B`` with equal keys; null keys never match.
    Incremental: ``ΔA ⋈ (B + ΔB) + A ⋈ ΔB``, with ``A``, ``B`` the integrals before the step.

    ``how="left"``: the inner join plus each ``A`` row whose key matches no ``B`` row,
    padded with nulls.  Incremental: the inner rule, plus, for the keys the step touches,
    the unmatched ``A`` rows after the step minus those before it (a key's rows enter
    when its last match leaves and leave when its first match arrives).
    """

    stateful = True

    name = "join"
    arity = 2

    def __init__(self, on: tuple[str, ...], how: str) -> None:
        self.on = on
        self.how = how
        # Inner: products of inserted rows are inserted rows.  Left: a match arriving
        # retracts the key's null-padded rows.
        self.keeps_append_only = how == "inner"

    def params(self) -> dict[str, Any]:
        return {"on": list(self.on), "how": self.how}

    def evaluate(self, ctx: NodeContext, left: DataFrame, right: DataFrame) -> DataFrame:
        on = list(self.on)
        left_only = [c for c in data_columns(ctx.schema(0, left)) if c not in on]
        right_only = [c for c in data_columns(ctx.schema(1, right)) if c not in on]
        clash = sorted(set(left_only) & set(right_only))
        if clash:
            raise ExpressionError(
                f"columns {clash} are on both sides of the join but not in on={on}; rename one side with select() first"
            )
        d_left = ctx.keyed(left, on)
        d_right = ctx.keyed(right, on)
        if self.how == "inner" and ctx.is_empty(0) != ctx.is_empty(1):
            return self._one_sided(ctx, d_left, d_right, on, [*on, *left_only, *right_only])
        if self.how == "left":  # read by the inner terms and by the unmatched rows, for either side's keys
            touched = add(_probe(d_left, on), _probe(d_right, on))
            old_left = ctx.share(ctx.lookup("left", touched, on, d_left, null_safe=False))
            old_right = ctx.share(ctx.lookup("right", touched, on, d_right, null_safe=False))
        else:  # each trace meets only the other side's delta: only its keys are looked up
            old_left = ctx.lookup("left", _probe(d_right, on), on, d_left, null_safe=False)
            old_right = ctx.lookup("right", _probe(d_left, on), on, d_right, null_safe=False)
        ctx.stage("left", d_left)
        ctx.stage("right", d_right)

        columns = [*on, *left_only, *right_only]
        build = ctx.step.build
        result = add(
            _inner(d_left, build(add(old_right, d_right)), on, columns),
            _inner(old_left, build(d_right), on, columns),
        )
        if self.how == "left":
            pads = [F.lit(None).cast(ctx.schema(1, right)[c].dataType).alias(c) for c in right_only]
            result = add(result, _unmatched_delta(d_left, d_right, old_left, old_right, on, left_only, pads))
        return result

    def _one_sided(
        self, ctx: NodeContext, d_left: DataFrame, d_right: DataFrame, on: list[str], columns: list[str]
    ) -> DataFrame:
        """The inner rule when one side's delta is known to be empty: ``ΔA ⋈ B`` (or
        ``A ⋈ ΔB``).  Only the other side's trace is read, for the keys of the delta."""
        if ctx.is_empty(1):
            ctx.stage("left", d_left)
            old_right = ctx.lookup("right", _probe(d_left, on), on, d_right, null_safe=False)
            return _inner(d_left, ctx.step.build(old_right), on, columns)
        ctx.stage("right", d_right)
        old_left = ctx.lookup("left", _probe(d_right, on), on, d_left, null_safe=False)
        return _inner(old_left, ctx.step.build(d_right), on, columns)


def _probe(delta: DataFrame, on: list[str]) -> DataFrame:
    """The routing columns and join keys of ``delta``'s rows, null keys left out (they match nothing)."""
    return delta.select(*ROUTED, *on).dropna(subset=on)


def _unmatched_delta(d_left, d_right, old_left, old_right, on, left_only, pads) -> DataFrame:
    """The change in left rows that have no match, padded with the null columns ``pads``."""
    keys = [*ROUTED, *on]
    left_columns = [*on, *left_only]
    null_key = reduce(lambda a, b: a | b, [F.col(k).isNull() for k in on])
    after = add(old_left, d_left.where(~null_key)).join(_matched_keys(add(old_right, d_right), on), keys, "left_anti")
    before = old_left.join(_matched_keys(old_right, on), keys, "left_anti")
    unmatched = add(
        after.select(*left_columns, weight()),
        before.select(*left_columns, (-weight()).alias(WEIGHT)),
        # Null keys match nothing, ever: such rows pass straight through.
        d_left.where(null_key).select(*left_columns, weight()),
    )
    return unmatched.select(*left_columns, *pads, weight())


def _matched_keys(right: DataFrame, on: list[str]) -> DataFrame:
    """Keys with a positive total weight on the right: the keys that have a match."""
    return right.groupBy(*ROUTED, *on).agg(F.sum(WEIGHT).alias(WEIGHT)).where(weight() > 0).select(*ROUTED, *on)


def _inner(left: DataFrame, right: DataFrame, on: list[str], columns: list[str]) -> DataFrame:
    right = right.withColumnRenamed(WEIGHT, _RIGHT_WEIGHT)
    joined = left.join(right, [*ROUTED, *on], "inner")
    return joined.select(*columns, (weight() * F.col(_RIGHT_WEIGHT)).alias(WEIGHT))


_JOIN_TYPES = ("inner", "left", "right", "full", "left_semi", "left_anti")
_R = "_r"
"""Suffix of the right side's routing, key and weight columns inside :class:`KeyedJoin`."""


class KeyedJoin(Operator):
    """``A ⋈_θ B`` for any of Spark's join types ``how`` (inner, left, right, full,
    left_semi, left_anti) whose condition is ``A.on = B.on AND θ`` (``on`` names key
    columns both sides have; ``condition``, Spark SQL over the two sides' other columns,
    which must differ).  Matched rows' weights multiply; a row padded with nulls, and a
    semi or anti join's row, keeps its side's weight.  Null keys match nothing.  The output
    has ``A``'s columns, then ``B``'s but its keys (none for semi and anti joins).

    Incremental: a key's output rows depend only on both sides' rows of that key, so for
    the keys the step's deltas touch, ``J(A + ΔA, B + ΔB) - J(A, B)`` over those keys'
    rows, ``J`` evaluated by Spark over the consolidated rows (the integrals are
    relations: a row's copies are matched or padded alike); a delta row with a null key
    matches nothing, before or after.  State: the integral of each side, keyed by ``on``.
    """

    stateful = True

    name = "keyed_join"
    arity = 2

    def __init__(self, on: tuple[str, ...], how: str, condition: str | None) -> None:
        if how not in _JOIN_TYPES:
            raise CircuitDefinitionError(f"join type {how!r} is not one of {_JOIN_TYPES}")
        self.on = on
        self.how = how
        self.condition = condition

    def params(self) -> dict[str, Any]:
        return {"on": list(self.on), "how": self.how, "condition": self.condition}

    def evaluate(self, ctx: NodeContext, left: DataFrame, right: DataFrame) -> DataFrame:
        on = list(self.on)
        d_left, d_right = ctx.keyed(left, on), ctx.keyed(right, on)
        touched = add(_probe(d_left, on), _probe(d_right, on))
        old_left = ctx.share(ctx.lookup("left", touched, on, d_left, null_safe=False))
        old_right = ctx.share(ctx.lookup("right", touched, on, d_right, null_safe=False))
        ctx.stage("left", d_left)
        ctx.stage("right", d_right)
        columns = (data_columns(ctx.schema(0, left)), data_columns(ctx.schema(1, right)))
        before = self._join(old_left, old_right, columns)
        after = self._join(add(old_left, d_left), add(old_right, d_right), columns)
        return add(after, before.withColumn(WEIGHT, -weight()))

    def _join(self, left: DataFrame, right: DataFrame, columns: tuple[list[str], list[str]]) -> DataFrame:
        left_columns, right_columns = columns
        keys = [*ROUTED, *self.on]
        kept = [c for c in right_columns if c not in self.on]
        right = consolidate(right, routed=True).select(
            *[F.col(c).alias(c + _R) for c in keys], *kept, weight().alias(WEIGHT + _R)
        )
        left = consolidate(left, routed=True)
        condition = reduce(lambda a, b: a & b, [left[c] == right[c + _R] for c in keys])
        if self.condition is not None:
            condition = condition & F.expr(self.condition)
        joined = left.join(right, condition, self.how)
        if self.how in ("left_semi", "left_anti"):
            return joined.select(*left_columns, weight())
        product = F.coalesce(weight(), F.lit(1)) * F.coalesce(F.col(WEIGHT + _R), F.lit(1))
        return joined.select(*left_columns, *kept, product.alias(WEIGHT))
