"""Read-only facts about a pipeline's tables, for reports and checks.

Row counts come from the Delta log's file statistics (no Spark job); the checks are
queries for the bad rows of an output log (the set check: among the rows a step touched),
all counted by one Spark job with :func:`count_each`.
"""

from __future__ import annotations

from functools import reduce
from typing import TypeVar

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from circuits.spark import aggregate_each
from circuits.zset import WEIGHT

from .delta import add_actions, delta_tables, open_table
from .logs import STEP, files_of_steps

K = TypeVar("K")


def rows_of_steps(uri: str, first: int, last: int) -> int:
    """Rows that steps ``first..=last`` wrote to the step-keyed table ``uri`` (0 if none)."""
    return sum(f["num_records"] or 0 for f in files_of_steps(open_table(uri), first, last))


def size(uri: str) -> tuple[int, int]:
    """(rows, bytes) of the latest version of every Delta table under ``uri``."""
    rows = nbytes = 0
    for table in delta_tables(uri):
        files = add_actions(open_table(table))
        rows += sum(files.column("num_records").to_pylist())
        nbytes += sum(files.column("size_bytes").to_pylist())
    return rows, nbytes


def count_each(queries: dict[K, DataFrame]) -> dict[K, int]:
    """The number of rows of each query, with one Spark job for all of them."""
    counts = aggregate_each([df.select() for df in queries.values()], F.count(F.lit(1)))
    return {key: found[0] if found else 0 for key, found in zip(queries, counts, strict=True)}


def unconsolidated(changes: DataFrame) -> DataFrame:
    """Rows of a step-keyed change log that break consolidation: a zero weight, or the
    same row twice in one step."""
    columns = [c for c in changes.columns if c != WEIGHT]
    grouped = changes.groupBy(*columns).agg(F.count(F.lit(1)).alias("n"), F.min(F.abs(WEIGHT)).alias("w"))
    return grouped.where((F.col("n") > 1) | (F.col("w") == 0))


def not_a_set(history: DataFrame, changes: DataFrame) -> DataFrame:
    """Rows of ``changes`` whose integrated weight over ``history`` (every step so far)
    is not 0 or 1: duplicates or negative rows in a view that must be a set.

    Only the rows that ``changes`` touch are integrated: every other row kept the weight
    an earlier check saw, so the check costs what the change does, not the whole log."""
    columns = [c for c in changes.columns if c not in (WEIGHT, STEP)]
    touched = changes.select(*columns).distinct()
    same = reduce(lambda a, b: a & b, [history[c].eqNullSafe(touched[c]) for c in columns])
    integral = history.join(F.broadcast(touched), same, "left_semi").groupBy(*columns).agg(F.sum(WEIGHT).alias("w"))
    return integral.where(~F.col("w").isin(0, 1))
