"""Top-k: per partition key, the rows ranked ``<= k`` under an order (SQL's
``ROW_NUMBER()``/``RANK()``/``DENSE_RANK() OVER (PARTITION BY p ORDER BY o) <= k`` and
``ORDER BY o LIMIT k``).

Like the other non-linear operators, it keeps the integral of its input and re-derives
only the partition keys the step's delta touches: output = ``top(state + Δ) - top(state)``
over those keys' rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from ..context import NodeContext
from ..errors import CircuitDefinitionError
from ..sharding import PART
from ..zset import WEIGHT, consolidate, weight
from .base import Operator
from .partitioned import partitionwise

RANKINGS = ("row_number", "rank", "dense_rank")
_BEFORE = "_before"
_RANK = "_rank"


@dataclass(frozen=True)
class SortKey:
    """One ``ORDER BY`` item: a column, descending or not, nulls first or not (None:
    Spark's default, first ascending and last descending)."""

    column: str
    descending: bool = False
    nulls_first: bool | None = None

    def sort(self) -> Column:
        c = F.col(self.column)
        if self.descending:
            return c.desc_nulls_first() if self._first() else c.desc_nulls_last()
        return c.asc_nulls_first() if self._first() else c.asc_nulls_last()

    def _first(self) -> bool:
        return not self.descending if self.nulls_first is None else self.nulls_first

    def describe(self) -> str:
        return f"{self.column} {'DESC' if self.descending else 'ASC'} NULLS {'FIRST' if self._first() else 'LAST'}"


class TopK(Operator):
    """``top_k(partition, order, k, ranking)``: per value of the ``partition`` columns
    (none: the whole stream is one group), the rows whose rank under ``order`` is at most
    ``k``, with their rank in the column ``rank_column`` if one is named.  A row of weight
    ``w`` counts as ``w`` rows.  ``ranking`` is SQL's:

    - ``row_number``: ranks 1, 2, 3, ... one per row; rows equal under ``order`` are ranked
      by all their columns, ascending, nulls first (so the choice among ties is
      deterministic); a row of weight ``w`` takes ``w`` consecutive ranks, and only those
      ``<= k`` are kept (with ``rank_column``, one row of weight 1 per rank);
    - ``rank``: 1 plus the number of rows before it under ``order`` (ties share a rank);
    - ``dense_rank``: 1 plus the number of distinct ``order`` values before it.

    Incremental: a partition's output depends only on its own rows, so for each partition
    key the step's delta touches, ``top(I + Δ) - top(I)`` over that key's rows of the
    integral ``I`` (read from the trace, restricted to the touched keys), evaluated by
    Spark's window functions over the consolidated rows.  State: the integral, keyed by
    the partition columns (nulls are one partition, as in ``PARTITION BY``).
    """

    stateful = True

    name = "top_k"
    consolidates = True

    def __init__(
        self,
        partition: tuple[str, ...],
        order: tuple[SortKey, ...],
        k: int,
        ranking: str = "row_number",
        rank_column: str | None = None,
    ) -> None:
        if ranking not in RANKINGS:
            raise CircuitDefinitionError(f"top_k ranking {ranking!r} is not one of {RANKINGS}")
        if not order:
            raise CircuitDefinitionError("top_k needs at least one sort key in order=")
        if k < 1:
            raise CircuitDefinitionError(f"top_k keeps k={k} rows; k must be at least 1")
        self.partition = partition
        self.order = order
        self.k = k
        self.ranking = ranking
        self.rank_column = rank_column

    def params(self) -> dict[str, Any]:
        return {
            "partition": list(self.partition),
            "order": [s.describe() for s in self.order],
            "k": self.k,
            "ranking": self.ranking,
            "rank_column": self.rank_column,
        }

    def evaluate(self, ctx: NodeContext, delta: DataFrame) -> DataFrame:
        return partitionwise(ctx, delta, self.partition, self._top)

    def _top(self, z: DataFrame, keys: list[str], columns: list[str]) -> DataFrame:
        """The rows of ``z`` (keyed, sitting on their workers) ranked ``<= k`` in their
        partition, with their weight kept there and their rank in :data:`_RANK`."""
        rows = consolidate(z, routed=True).where(weight() > 0)
        group = Window.partitionBy(PART, *keys)
        sorts = [s.sort() for s in self.order]
        ordered = group.orderBy(*sorts)
        if self.ranking == "row_number":
            ties = [SortKey(c).sort() for c in columns]
            preceding = group.orderBy(*sorts, *ties).rowsBetween(Window.unboundedPreceding, -1)
            before = F.coalesce(F.sum(WEIGHT).over(preceding), F.lit(0))
            top = rows.withColumn(_BEFORE, before).where(F.col(_BEFORE) < self.k)
            if self.rank_column:
                last = F.least(F.col(_BEFORE) + weight(), F.lit(self.k))
                first = (F.col(_BEFORE) + 1).cast("int")
                ranks = F.explode(F.sequence(first, last.cast("int"))).alias(self.rank_column)
                return top.select(PART, *columns, ranks, F.lit(1).cast("bigint").alias(WEIGHT))
            kept = F.least(weight(), F.lit(self.k) - F.col(_BEFORE)).alias(WEIGHT)
            return top.select(PART, *columns, kept)
        if self.ranking == "rank":
            # The default frame of an ordered window ends at the row's last peer.
            peers = Window.partitionBy(PART, *keys, *[s.column for s in self.order])
            rank = F.sum(WEIGHT).over(ordered) - F.sum(WEIGHT).over(peers) + 1
        else:
            rank = F.dense_rank().over(ordered)
        top = rows.withColumn(_RANK, rank.cast("int")).where(F.col(_RANK) <= self.k)
        named = [F.col(_RANK).alias(self.rank_column)] if self.rank_column else []
        return top.select(PART, *columns, *named, weight())
