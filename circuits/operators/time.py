"""Time operators: relate a stream's values across steps ``t``.

Each keeps one trace of its input, keyed by the vnode of all its columns, and reads
all of it every step: their outputs are whole values, not changes.
"""

from __future__ import annotations

from abc import abstractmethod

from pyspark.sql import DataFrame

from ..context import NodeContext
from ..sharding import VNODE, with_vnode
from ..zset import add, consolidate, data_columns, negate
from .base import Operator


def _keyed(ctx: NodeContext, delta: DataFrame) -> DataFrame:
    return with_vnode(delta, data_columns(ctx.schema(0, delta)), ctx.layout.vnodes)


class Integrate(Operator):
    """``I(x)[t] = x[0] + ... + x[t]``.  Incremental: ``I[t] = I[t-1] + x[t]``; state: ``I[t-1]``."""

    stateful = True
    zero_preserving = False  # outputs whole values, not changes

    name = "integrate"
    consolidates = True

    def evaluate(self, ctx: NodeContext, delta: DataFrame) -> DataFrame:
        d = _keyed(ctx, delta)
        total = ctx.scan("integral", d)
        ctx.stage("integral", d)
        return consolidate(add(total, d)).drop(VNODE)


class _Previous(Operator):
    """Keeps ``x[t-1]``: each step stages ``x[t] - x[t-1]`` so the trace becomes ``x[t]``."""

    stateful = True
    zero_preserving = False

    def evaluate(self, ctx: NodeContext, delta: DataFrame) -> DataFrame:
        d = _keyed(ctx, delta)
        previous = ctx.scan("previous", d)
        change = add(d, negate(previous))
        ctx.stage("previous", change)
        return self.output(d, previous, change).drop(VNODE)

    @abstractmethod
    def output(self, current: DataFrame, previous: DataFrame, change: DataFrame) -> DataFrame:
        """The step's output from ``x[t]``, ``x[t-1]`` and their difference."""


class Delay(_Previous):
    """``z⁻¹(x)[t] = x[t-1]``, and ``0`` at ``t = 0``.  State: ``x[t-1]``."""

    name = "delay"

    def output(self, current: DataFrame, previous: DataFrame, change: DataFrame) -> DataFrame:
        return previous


class Differentiate(_Previous):
    """``D(x)[t] = x[t] - x[t-1]``, the inverse of ``integrate``.  State: ``x[t-1]``."""

    name = "differentiate"

    def output(self, current: DataFrame, previous: DataFrame, change: DataFrame) -> DataFrame:
        return change
