"""Views of the shapes of Spark's own SQL tests (``sql-tests/inputs`` in apache/spark,
run by ``bench/sql_corpus.py --spark-tests``) that the compiler got wrong: each equals
Spark batch SQL of the same text over the integrated inputs at every step of fixed
inserts and deletes, with NULLs and duplicates."""

from __future__ import annotations

import pytest

from circuits.sql import SqlError, compile_sql

from .harness import SQL_SCHEMAS as SCHEMAS
from .harness import SQL_STEPS, SQL_WORKERS, at_every_worker_count, equals_spark_batch, sql_views

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


@pytest.mark.parametrize(
    "query",
    [
        # count.sql: the count bug, through a subquery in FROM
        "SELECT k, (SELECT sum(n) FROM (SELECT count(*) AS n FROM b WHERE b.k = a.k) t) AS total FROM a",
        # scalar-subquery-predicate.sql: set operations in the correlation path
        "SELECT k FROM a WHERE v < (SELECT sum(x) FROM (SELECT x FROM b WHERE b.k = a.k UNION ALL SELECT x FROM b) t)",
    ],
)
def test_a_subquery_in_from_reading_an_enclosing_query_is_refused(spark, query):
    """A lateral join: refused at compile time, naming the column, not failed at a step."""
    with pytest.raises(SqlError, match=r"a subquery in FROM reads a\.k of an enclosing query \(a lateral join\)"):
        compile_sql(f"CREATE MATERIALIZED VIEW v AS {query};", SCHEMAS, spark)


NESTED_EXISTS = """
CREATE MATERIALIZED VIEW nested_exists AS
  SELECT k, s FROM a WHERE EXISTS (SELECT 1 FROM b WHERE b.k = a.k AND EXISTS (SELECT 1 FROM a a2 WHERE a2.v = b.x));
CREATE MATERIALIZED VIEW nested_not_exists AS
  SELECT k, v FROM a
  WHERE NOT EXISTS (SELECT x FROM b WHERE b.k = a.k AND NOT EXISTS (SELECT s FROM a a2 WHERE a2.v = b.x AND a2.s = 'a'));
"""


nested_exists = sql_views(NESTED_EXISTS, "nested_exists")


@at_every_worker_count(SQL_STEPS, max_examples=2, workers=SQL_WORKERS)
def test_an_exists_subquery_in_an_exists_subquery(spark, nested_exists, workers, steps):
    """exists-basic.sql: ``EXISTS`` in the WHERE of a correlated ``EXISTS`` subquery,
    correlated with that subquery, is a semi (anti) join inside it, as ``IN`` in ``IN``
    is (it was refused for an "unknown column" of the inner subquery)."""
    equals_spark_batch(spark, NESTED_EXISTS, nested_exists, STEPS, workers)
    equals_spark_batch(spark, NESTED_EXISTS, nested_exists, steps, workers)


USING_JOINS = """
CREATE MATERIALIZED VIEW natural_inner AS SELECT * FROM a NATURAL JOIN b;
CREATE MATERIALIZED VIEW using_left AS SELECT k, a.k AS ak, b.k AS bk, v, x FROM a LEFT JOIN b USING (k);
CREATE MATERIALIZED VIEW using_right AS SELECT * FROM a RIGHT OUTER JOIN b USING (k);
CREATE MATERIALIZED VIEW using_full AS
  SELECT k, a.k AS ak, b.k AS bk, s, d FROM a FULL OUTER JOIN b USING (k) WHERE k IS NULL OR k <> 2;
CREATE MATERIALIZED VIEW using_semi AS SELECT * FROM a LEFT SEMI JOIN b USING (k);
CREATE MATERIALIZED VIEW using_star AS SELECT b.*, v FROM a JOIN b USING (k);
CREATE MATERIALIZED VIEW natural_full_grouped AS SELECT k, count(*) AS n FROM a NATURAL FULL JOIN b GROUP BY k;
CREATE MATERIALIZED VIEW using_three AS
  SELECT k, v, p.s, x FROM a p JOIN a q USING (k, v) LEFT JOIN b USING (k);
"""


using_joins = sql_views(USING_JOINS, "using_joins")


@at_every_worker_count(SQL_STEPS, max_examples=2, workers=SQL_WORKERS)
def test_using_and_natural_joins(spark, using_joins, workers, steps):
    """natural-join.sql, using-join.sql: ``USING (k)`` and ``NATURAL`` joins (inner, left,
    right, full, semi; chained), with Spark's columns: the key once first (the non-NULL
    side's for a full join), then each side's others; ``a.k``/``b.k`` each side's own,
    NULL where it had no match; ``b.*`` all of ``b``'s."""
    equals_spark_batch(spark, USING_JOINS, using_joins, STEPS, workers)
    equals_spark_batch(spark, USING_JOINS, using_joins, steps, workers)


@pytest.mark.parametrize(
    "query, column",
    [
        (
            "SELECT k FROM a WHERE EXISTS (SELECT 1 FROM b WHERE b.k = a.k AND EXISTS (SELECT 1 FROM b c WHERE c.x = a.v))",
            "v",
        ),
        ("SELECT k FROM a WHERE k IN (SELECT b.k FROM b WHERE b.x IN (SELECT c.x FROM b c WHERE c.d > a.v))", "v"),
        (
            "SELECT k FROM a WHERE v < (SELECT count(*) FROM b WHERE b.k = a.k AND EXISTS (SELECT 1 FROM b c WHERE c.k = a.k))",
            "k",
        ),
        ("SELECT k FROM a WHERE EXISTS (SELECT 1 FROM b WHERE b.x < (SELECT max(c.x) FROM b c WHERE c.k = a.k))", "k"),
    ],
)
def test_a_subquery_reading_a_query_two_levels_out_is_refused_at_load(spark, query, column):
    """A column of the outermost query read two subqueries down: Spark's analysis, which
    the compiler asks before building anything, refuses it, so the view fails at load
    naming the view and the column, never at a step."""
    with pytest.raises(SqlError, match=rf"<sql>:1, view 'v': Spark cannot analyse the query: .*`a`\.`{column}`"):
        compile_sql(f"CREATE MATERIALIZED VIEW v AS {query};", SCHEMAS, spark)
