"""Linear operators: ``Q(a + b) = Q(a) + Q(b)``, so each is its own incremental version
(``Q^Δ = Q``) and needs no state."""

from __future__ import annotations

from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ..context import NodeContext
from ..zset import WEIGHT, add, conform, weight
from .base import Operator, expr_text


class Input(Operator):
    """An input handle: the step's delta for input ``handle``, checked against its schema."""

    name = "input"
    arity = 0

    def __init__(self, handle: str, schema: T.StructType) -> None:
        self.handle = handle
        self.schema = schema

    def params(self) -> dict[str, Any]:
        return {"handle": self.handle, "schema": self.schema.simpleString()}

    def evaluate(self, ctx: NodeContext) -> DataFrame:
        delta = ctx.input(self.handle)
        return delta if ctx.step.conformed else conform(self.handle, delta, self.schema)


class Filter(Operator):
    """``σ_p(Z)``: rows where ``p`` is true (SQL: null is false), weights kept.  Incremental: ``σ_p(ΔZ)``."""

    name = "filter"
    reads_once = True
    keeps_append_only = True
    keeps_consolidation = True

    def __init__(self, condition: Column | str) -> None:
        self.condition = condition

    def params(self) -> dict[str, Any]:
        return {"condition": expr_text(self.condition)}

    def evaluate(self, ctx: NodeContext, delta: DataFrame) -> DataFrame:
        condition = F.expr(self.condition) if isinstance(self.condition, str) else self.condition
        return delta.where(condition)


class Select(Operator):
    """``π_f(Z)``: each row mapped by the column expressions, weights kept (no dedup).
    Incremental: ``π_f(ΔZ)``."""

    name = "select"
    reads_once = True
    keeps_append_only = True

    def __init__(self, columns: tuple[Column | str, ...]) -> None:
        self.columns = columns

    def params(self) -> dict[str, Any]:
        return {"columns": [expr_text(c) for c in self.columns]}

    def evaluate(self, ctx: NodeContext, delta: DataFrame) -> DataFrame:
        return delta.select(*self.columns, weight())


class FlatMap(Operator):
    """Each row becomes one row per element of ``array_expr`` (named ``alias``), next to the
    ``keep`` columns; each copy keeps the row's weight.  Incremental: applied to ``ΔZ``."""

    name = "flat_map"
    reads_once = True
    keeps_append_only = True

    def __init__(self, alias: str, array_expr: Column, keep: tuple[str, ...]) -> None:
        self.alias = alias
        self.array_expr = array_expr
        self.keep = keep

    def params(self) -> dict[str, Any]:
        return {"alias": self.alias, "array": expr_text(self.array_expr), "keep": list(self.keep)}

    def evaluate(self, ctx: NodeContext, delta: DataFrame) -> DataFrame:
        return delta.select(*self.keep, F.explode(self.array_expr).alias(self.alias), weight())


class Union(Operator):
    """``Z1 + Z2 + ...`` (bag union: weights add).  Incremental: ``ΔZ1 + ΔZ2 + ...``."""

    name = "union"
    keeps_append_only = True

    def __init__(self, arity: int) -> None:
        self.arity = arity  # type: ignore[misc]  # per instance: a union of n streams

    def params(self) -> dict[str, Any]:
        return {"arity": self.arity}

    def evaluate(self, ctx: NodeContext, *deltas: DataFrame) -> DataFrame:
        columns = ctx.schema(0, deltas[0]).names
        return add(deltas[0], *[d.select(*columns) for d in deltas[1:]])


class Negate(Operator):
    """``-Z``: weights negated.  Incremental: ``-ΔZ``."""

    name = "negate"
    reads_once = True
    keeps_consolidation = True

    def evaluate(self, ctx: NodeContext, delta: DataFrame) -> DataFrame:
        return delta.withColumn(WEIGHT, -weight())
