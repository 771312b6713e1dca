"""Window functions: per partition key, each row with the values of window functions
over its partition (SQL's ``f(...) OVER (PARTITION BY p ORDER BY o frame)`` as a column).

Like the top-k, a partition's output depends only on its own rows: the operator keeps the
integral of its input and re-derives only the partition keys the step's delta touches.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from ..context import NodeContext
from ..errors import CircuitDefinitionError
from ..sharding import PART
from ..zset import WEIGHT, consolidate, weight
from .base import Operator
from .partitioned import partitionwise

_COPY = "_copy"


class WindowFunctions(Operator):
    """``window(partition, functions)``: each row of the input, with a column per entry
    ``name -> (call, spec)`` of ``functions``: Spark SQL's ``call OVER (PARTITION BY
    partition spec)`` (``call`` a window function of the input's columns, ``spec`` its
    ``ORDER BY`` and frame, or empty), over the rows of the row's partition (none: the
    whole stream is one partition).  A row of weight ``w`` counts as ``w`` rows; the
    output is consolidated (equal rows with equal values are one row of their weight).
    Spark computes the functions, with Spark's semantics; which row comes first among rows
    equal under ``spec``'s order is Spark's choice, so a caller whose functions depend on
    it makes the order total (as the SQL compiler does, with every column).

    Incremental: a partition's output depends only on its own rows, so for each partition
    key the step's delta touches, ``W(I + Δ) - W(I)`` over that key's rows of the integral
    ``I`` (read from the trace, restricted to the touched keys): each row of weight ``w``
    expanded into ``w`` rows, the functions evaluated by Spark, the result consolidated.
    State: the integral, keyed by the partition columns (nulls are one partition, as in
    ``PARTITION BY``).  Without partition columns every step re-reads the whole integral.
    """

    stateful = True

    name = "window"
    consolidates = True

    def __init__(self, partition: tuple[str, ...], functions: tuple[tuple[str, str, str], ...]) -> None:
        if not functions:
            raise CircuitDefinitionError("window needs at least one function in functions=")
        self.partition = partition
        self.functions = functions

    def params(self) -> dict[str, Any]:
        return {"partition": list(self.partition), "functions": [list(f) for f in self.functions]}

    def evaluate(self, ctx: NodeContext, delta: DataFrame) -> DataFrame:
        return partitionwise(ctx, delta, self.partition, self._windowed)

    def _windowed(self, z: DataFrame, keys: list[str], columns: list[str]) -> DataFrame:
        """The rows of ``z`` (keyed, sitting on their workers) with the functions' values,
        a row of weight 1 per copy."""
        rows = consolidate(z, routed=True).where(weight() > 0)
        copies = rows.select("*", F.explode(F.array_repeat(F.lit(1), weight().cast("int"))).alias(_COPY))
        # The worker's partition first: the rows already sit there, so Spark needs no exchange.
        over = ", ".join(f"`{c}`" for c in [PART, *keys])
        values = [
            F.expr(f"{call} OVER (PARTITION BY {over} {spec})").alias(name) for name, call, spec in self.functions
        ]
        return copies.select(PART, *columns, *values, F.lit(1).cast("bigint").alias(WEIGHT))
