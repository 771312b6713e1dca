"""Scalar subqueries compiled from SQL equal Spark batch SQL of the same text over the
integrated inputs at every step (hypothesis), at 1 and 2 workers: uncorrelated ones (a
one-row global aggregate joined to every row) and ones correlated on equalities (an
aggregate grouped by the correlation key, left-joined on it), in WHERE, in the select list
and in HAVING, in the shapes of TPC-H q11, q15, q17, q20 and q22; and ones of no aggregate
(``SELECT DISTINCT x ...``), Spark's single value: NULL over no rows, an error over more."""

from __future__ import annotations

import pytest

from circuits.sql import SqlError, compile_sql, parse_views

from .harness import SQL_SCHEMAS as SCHEMAS
from .harness import batch_integrals, equal_to_spark_batch_sql, run_and_compare, spark_batch, sql_views

VIEWS = """
CREATE MATERIALIZED VIEW above_average AS SELECT k, v FROM a WHERE v > (SELECT avg(x) FROM b);
CREATE MATERIALIZED VIEW in_select_list AS
  SELECT k, v, (SELECT max(x) FROM b) AS top, (SELECT count(*) FROM b) + v AS n FROM a;
CREATE MATERIALIZED VIEW count_correlated AS
  SELECT k, v FROM a WHERE v < (SELECT count(*) FROM b WHERE b.k = a.k);
CREATE MATERIALIZED VIEW correlated_select AS
  SELECT k, s, (SELECT sum(x) FROM b WHERE b.k = a.k) AS total,
         (SELECT coalesce(max(d), 0) + count(x) FROM b WHERE b.k = a.k AND b.x > 0) AS mixed FROM a;
CREATE MATERIALIZED VIEW grouped_by_key AS
  SELECT k, (SELECT count(*) FROM b WHERE b.k = a.k GROUP BY b.k) AS n FROM a;
CREATE MATERIALIZED VIEW two_keys AS
  SELECT k, v, s FROM a WHERE v >= (SELECT max(v) FROM a a2 WHERE a2.k = a.k AND a2.s = a.s);
CREATE MATERIALIZED VIEW q11_having AS
  SELECT k, sum(v) AS total FROM a GROUP BY k HAVING sum(v) > (SELECT sum(x) * 0.3 FROM b);
CREATE MATERIALIZED VIEW q15_max_of_cte AS
  WITH per_key AS (SELECT k, sum(v) AS total FROM a GROUP BY k)
  SELECT k, total FROM per_key WHERE total = (SELECT max(total) FROM per_key);
CREATE MATERIALIZED VIEW q17_correlated_avg AS
  SELECT sum(v) AS total FROM a WHERE v < (SELECT 2 * avg(x) FROM b WHERE b.k = a.k);
CREATE MATERIALIZED VIEW q20_nested AS
  SELECT k, s FROM a WHERE k IN (SELECT b.k FROM b WHERE b.x > (SELECT count(*) FROM a a2 WHERE a2.k = b.k));
CREATE MATERIALIZED VIEW single_distinct AS
  SELECT k, v FROM a WHERE v >= (SELECT DISTINCT x FROM b WHERE x = 2);
CREATE MATERIALIZED VIEW single_correlated AS
  SELECT k, s, (SELECT DISTINCT b.k + 1 FROM b WHERE b.k = a.k AND b.x > 1) AS next FROM a;
CREATE MATERIALIZED VIEW q22_in_or AS
  SELECT k, v FROM (SELECT k, v FROM a WHERE v IS NULL OR v > (SELECT avg(v) FROM a WHERE v > 0)) t;
"""


circuit = sql_views(VIEWS)
test_scalar_subqueries_equal_spark_batch_sql = equal_to_spark_batch_sql(VIEWS)


def test_scalar_subqueries_over_no_rows(spark, circuit):
    """Fixed steps for what random data may miss: over an empty ``b`` an uncorrelated
    aggregate is one row of NULL (count 0), a correlated ``count`` is 0 and a correlated
    ``sum`` NULL; a key with rows on both sides, then its ``b`` rows deleted."""
    views = parse_views(VIEWS)
    steps = [
        {"a": [(1, 2, "a", 1), (None, 0, None, 1)], "b": []},
        {"a": [], "b": [(1, 3, 1.5, 1), (1, None, None, 1), (2, 9, 0.0, 1)]},
        {"a": [(2, 8, "b", 1)], "b": [(1, 3, 1.5, -1), (1, None, None, -1)]},
    ]

    def expected(t, deltas, integrated):
        batch = spark_batch(spark, views, integrated)
        if t == 0:
            assert batch["in_select_list"][(1, 2, None, 2)] == 1
            assert batch["count_correlated"] == {}
            assert batch["correlated_select"][(1, "a", None, 0)] == 1
        return {name: ("integral", z) for name, z in batch.items()}

    run_and_compare(spark, circuit, steps, 1, expected)


def test_a_scalar_subquery_of_no_aggregate_is_its_one_row_and_fails_the_step_that_gives_it_two(spark):
    """TPC-DS q58's shape: ``(SELECT x FROM b WHERE ...)`` is the value of its one row, NULL
    over none, as in Spark; the step that leaves it two rows fails naming it, as Spark's
    batch query over those rows does."""
    text = """CREATE MATERIALIZED VIEW priced AS
      SELECT k, v, (SELECT x FROM b WHERE d = 2.25) AS x FROM a WHERE v <= (SELECT x FROM b WHERE d = 2.25);
    CREATE MATERIALIZED VIEW labelled AS SELECT k, (SELECT x FROM b WHERE d = 2.25) AS x FROM a;"""
    views = parse_views(text)
    circuit = compile_sql(text, SCHEMAS, spark)
    steps = [
        {"a": [(1, 2, "a", 1), (2, 5, "b", 1)], "b": [(1, 3, 2.25, 1), (2, 9, 0.0, 1)]},
        {"a": [(3, 3, None, 1)], "b": [(1, 3, 2.25, -1)]},
        {"a": [], "b": [(4, 4, 2.25, 1)]},
        {"a": [], "b": [(5, 1, 2.25, 1)]},
    ]
    assert spark_batch(spark, views, {"a": {(1, 2, "a"): 1}, "b": {(4, 4, 2.25): 1}})["labelled"] == {(1, 4): 1}
    oracle, compared = batch_integrals(spark, text), []

    def expected(t, deltas, integrated):
        compared.append(t)
        return oracle(t, deltas, integrated)

    with pytest.raises(Exception) as raised:
        run_and_compare(spark, circuit, steps, 1, expected)
    assert "(SELECT x FROM b WHERE d = 2.25) gave more than one row" in str(raised.value), raised.value
    assert compared == [0, 1, 2]  # equal to Spark's batch query until the fourth step fails
    with pytest.raises(Exception) as spark_too:
        spark_batch(spark, views, {"a": {(1, 2, "a"): 1}, "b": {(4, 4, 2.25): 1, (5, 1, 2.25): 1}})
    assert "SCALAR_SUBQUERY_TOO_MANY_ROWS" in str(spark_too.value)


@pytest.mark.parametrize(
    "query, cause",
    [
        (
            "SELECT k, v FROM a WHERE v > (SELECT m FROM (SELECT x AS m FROM b) t)",
            "a scalar subquery that is not an aggregate",
        ),
        (
            "SELECT k, v FROM a WHERE v > (SELECT max(x) FROM b WHERE b.k = a.k GROUP BY b.x)",
            "grouped by other columns than it correlates on",
        ),
        (
            "SELECT k FROM a GROUP BY k HAVING count(*) > (SELECT count(*) FROM b WHERE b.k = a.k)",
            "in HAVING or beside aggregates",
        ),
        (
            "SELECT k FROM a WHERE v > (SELECT max(x) FROM b WHERE b.x > a.v GROUP BY b.k)",
            "correlated by b.x > a.v with GROUP BY",
        ),
        (
            "SELECT k FROM a GROUP BY k HAVING count(*) > (SELECT count(*) FROM b WHERE b.x > a.k)",
            "in HAVING or beside aggregates",
        ),
        (
            "SELECT k FROM a WHERE v > (SELECT m FROM (SELECT max(x) AS m FROM b WHERE b.k = a.k) t)",
            "a scalar subquery of a one-row table reads a.k of an enclosing query",
        ),
    ],
)
def test_scalar_subqueries_that_may_give_several_rows_or_are_not_decorrelated_are_refused(spark, query, cause):
    text = f"CREATE MATERIALIZED VIEW fine AS SELECT k FROM a;\n\nCREATE MATERIALIZED VIEW bad AS\n  {query};"
    with pytest.raises(SqlError) as raised:
        compile_sql(text, SCHEMAS, spark, file="views.sql")
    message = str(raised.value)
    assert message.startswith("views.sql:4, view 'bad': ") and cause in message, message


@pytest.mark.parametrize(
    "query, rewritten",
    [
        ("SELECT k FROM a WHERE v = (SELECT x FROM b WHERE d = 1)", True),
        ("SELECT k, (SELECT DISTINCT b.x AS y FROM b WHERE b.k = a.k) AS y FROM a", True),
        ("SELECT k FROM a WHERE v = (SELECT max(x) FROM b)", False),
        ("SELECT k FROM a WHERE v IN (SELECT x FROM b)", False),
        ("SELECT k FROM a WHERE v = ANY (SELECT x FROM b)", False),
        ("SELECT k FROM a WHERE v > ALL (SELECT x FROM b)", False),
        ("SELECT k FROM (SELECT k FROM a) t", False),
        ("SELECT k FROM a WHERE v = (SELECT m FROM (SELECT max(x) AS m FROM b) t)", False),
        ("SELECT k FROM a WHERE v = (SELECT x FROM b GROUP BY x)", False),
        ("SELECT k FROM a WHERE v = (SELECT a.v FROM b WHERE b.k = a.k)", False),
    ],
)
def test_only_a_plain_scalar_subquery_of_no_aggregate_becomes_its_single_value(query, rewritten):
    text = parse_views(f"CREATE MATERIALIZED VIEW q AS {query};")[0].query.sql("spark")
    assert ("RAISE_ERROR" in text) == rewritten, text
