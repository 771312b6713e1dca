"""The incremental rule shared by the operators whose output for a partition key depends
only on that key's rows (top-k, window functions): for each key the step's delta
touches, ``f(I + Δ) - f(I)`` over that key's rows of the integral ``I``."""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from ..context import NodeContext
from ..sharding import PART
from ..zset import add, consolidate, data_columns, negate, weight

GROUP = "_group"
"""The one partition key of an operator without one (the whole stream is one partition)."""

Evaluation = Callable[[DataFrame, list[str], list[str]], DataFrame]
"""``f(z, keys, columns)``: the output of the rows of ``z`` (keyed by ``keys``, sitting on
their workers, with :data:`~circuits.sharding.PART`) as a Z-set that keeps ``PART``;
``columns`` are the input's data columns."""


def partitionwise(ctx: NodeContext, delta: DataFrame, partition: tuple[str, ...], f: Evaluation) -> DataFrame:
    """The step's output delta of ``f`` applied per value of the ``partition`` columns:
    ``f(I + Δ) - f(I)`` over the touched keys' rows of ``I``, read from the trace
    ``trace`` (keyed by the partition, nulls one key as in ``PARTITION BY``), to which
    ``Δ`` is staged."""
    columns = data_columns(ctx.schema(0, delta))
    keys = list(partition) or [GROUP]
    d = delta.select(*columns, weight()) if partition else delta.select(*columns, F.lit(0).alias(GROUP), weight())
    d = ctx.keyed(d, keys)
    old = ctx.share(ctx.lookup("trace", d, keys, d, null_safe=True))
    ctx.stage("trace", d)
    before = negate(f(old, keys, columns))
    after = f(add(old, d), keys, columns)
    return consolidate(add(after, before), routed=True).drop(PART)
