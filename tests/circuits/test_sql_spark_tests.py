"""Views of the shapes of Spark's own SQL tests (``sql-tests/inputs`` in apache/spark,
run by ``bench/sql_corpus.py --spark-tests``) that the compiler got wrong: each equals
Spark batch SQL of the same text over the integrated inputs at every step of fixed
inserts and deletes, with NULLs and duplicates."""

from __future__ import annotations

from circuits.sql import compile_sql

from .test_sql import SCHEMAS, equals_spark_batch

STEPS = [
    {"a": [(1, 2, "a", 1), (1, 3, "a", 1), (None, 1, None, 1), (2, None, "b", 2)], "b": [(1, 1, 0.5, 1)]},
    {"a": [(1, 2, "a", -1), (3, 3, "c", 1)], "b": [(1, 2, 0.5, 1), (None, 2, None, 1)]},
    {"a": [(1, 3, "a", -1), (2, None, "b", -2)], "b": [(1, 1, 0.5, -1)]},
]


def test_group_by_without_aggregates(spark):
    """having.sql: ``SELECT k FROM hav GROUP BY k`` is one row per group, while the
    group has rows."""
    views = """
    CREATE MATERIALIZED VIEW keys AS SELECT k FROM a GROUP BY k;
    CREATE MATERIALIZED VIEW lengths AS SELECT length(s) AS n FROM a GROUP BY s, k;
    CREATE MATERIALIZED VIEW pairs AS SELECT k, d FROM b GROUP BY k, d;
    """
    equals_spark_batch(spark, views, compile_sql(views, SCHEMAS, spark), STEPS, 2)
