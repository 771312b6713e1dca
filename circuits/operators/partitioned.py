"""The incremental rule shared by the operators whose output for a partition key depends
only on that key's rows (top-k, window functions): for each key the step's delta
touches, ``f(I + Δ) - f(I)`` over that key's rows of the integral ``I``.  Both terms are one
evaluation of ``f``: the rows of ``I`` once as they were and once with ``Δ``, told apart by a
partition column of their own, so Spark plans ``f`` and reads the trace once a step."""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from ..context import NodeContext
from ..sharding import PART
from ..zset import WEIGHT, add, consolidate, data_columns, weight

AFTER = "_after"
"""1 on the rows of ``I + Δ``, 0 on those of ``I``: a partition column of the evaluation."""

GROUP = "_group"
"""The one partition key of an operator without one (the whole stream is one partition)."""

Evaluation = Callable[[DataFrame, list[str], list[str]], DataFrame]
"""``f(z, keys, columns)``: the output of the rows of ``z`` (keyed by ``keys``, sitting on
their workers, with :data:`~circuits.sharding.PART`; not consolidated) as a Z-set that
keeps ``PART`` (consolidated by the caller); ``columns`` are the input's data columns."""


def partitionwise(ctx: NodeContext, delta: DataFrame, partition: tuple[str, ...], f: Evaluation) -> DataFrame:
    """The step's output delta of ``f`` applied per value of the ``partition`` columns:
    ``f(I + Δ) - f(I)`` over the touched keys' rows of ``I``, read from the trace
    ``trace`` (keyed by the partition, nulls one key as in ``PARTITION BY``), to which
    ``Δ`` is staged."""
    columns = data_columns(ctx.schema(0, delta))
    keys = list(partition) or [GROUP]
    d = delta.select(*columns, weight()) if partition else delta.select(*columns, F.lit(0).alias(GROUP), weight())
    d = ctx.keyed(d, keys)
    old = ctx.lookup("trace", d, keys, d, null_safe=True, consolidated=False)  # f consolidates its input
    ctx.stage("trace", d)
    both = add(old.withColumn(AFTER, F.explode(F.array(F.lit(0), F.lit(1)))), d.withColumn(AFTER, F.lit(1)))
    out = f(both, [*keys, AFTER], [*columns, AFTER])
    signed = out.withColumn(WEIGHT, F.when(F.col(AFTER) == 1, weight()).otherwise(-weight())).drop(AFTER)
    return consolidate(signed, routed=True).drop(PART)
