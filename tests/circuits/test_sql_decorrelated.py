"""Scalar subqueries in TPC-DS's shapes equal Spark batch SQL of the same text over the
integrated inputs at every step (hypothesis), at 1 and 2 workers: correlated by
non-equalities (an aggregate over the distinct correlated outer columns joined with the
subquery's rows, left-joined back NULL-safely), correlated under ``OR`` by an equality of
every branch (q41), and reads of a one-row CTE or derived table (q14, q23: ``(SELECT *
FROM cte)``) or of an aggregate grouped by columns its WHERE equates with literals (q44),
in WHERE, in a select list and in HAVING."""

from __future__ import annotations

from circuits.sql import parse_views

from .harness import equal_to_spark_batch_sql, run_and_compare, spark_batch, sql_views

VIEWS = """
CREATE MATERIALIZED VIEW below AS
  SELECT k, v, (SELECT count(*) FROM b WHERE b.x < a.v) AS n,
         (SELECT sum(x) FROM b WHERE b.k = a.k AND b.x >= a.v) AS total FROM a;
CREATE MATERIALIZED VIEW null_safe AS
  SELECT k, v, s FROM a WHERE v > (SELECT avg(x) FROM b WHERE b.k <> a.k OR a.s IS NULL);
CREATE MATERIALIZED VIEW factored_or AS
  SELECT k, s FROM a WHERE (SELECT count(*) FROM b WHERE (b.k = a.k AND b.x > 1) OR (b.k = a.k AND b.d < 0)) > 0;
CREATE MATERIALIZED VIEW one_row_cte AS
  WITH top AS (SELECT max(x) AS m FROM b), tot AS (SELECT count(*) AS n, sum(x) AS t FROM b)
  SELECT k, sum(v) AS total FROM a GROUP BY k HAVING sum(v) > (SELECT * FROM top) OR count(*) > (SELECT n FROM tot);
CREATE MATERIALIZED VIEW pinned_group AS
  SELECT k, sum(v) AS total FROM a GROUP BY k
  HAVING avg(v) > 0.5 * (SELECT avg(x) FROM b WHERE b.k = 1 AND b.d IS NULL GROUP BY b.k);
CREATE MATERIALIZED VIEW one_row_derived AS
  SELECT k, v, (SELECT m + 1 FROM (SELECT max(x) AS m FROM b) t WHERE m > 1) AS next FROM a;
"""


circuit = sql_views(VIEWS)
test_decorrelated_scalar_subqueries_equal_spark_batch_sql = equal_to_spark_batch_sql(VIEWS)


def test_decorrelated_scalar_subqueries_over_fixed_steps(spark, circuit):
    """What random data may miss: an outer row whose correlated column is NULL (its own
    domain tuple, met by ``a.s IS NULL``), duplicate outer rows (one tuple), and a tuple
    whose subquery rows are all deleted (the aggregate over no rows again)."""
    views = parse_views(VIEWS)
    steps = [
        {"a": [(1, 2, None, 1), (1, 2, None, 1), (2, 3, "a", 1)], "b": [(2, 1, 1.5, 1), (1, 0, None, 1)]},
        {"a": [(3, None, "b", 1)], "b": [(2, 1, 1.5, -1)]},
    ]

    def expected(t, deltas, integrated):
        batch = spark_batch(spark, views, integrated)
        if t == 0:
            assert batch["null_safe"][(1, 2, None)] == 2
            assert batch["below"][(2, 3, 2, None)] == 1
        return {name: ("integral", z) for name, z in batch.items()}

    run_and_compare(spark, circuit, steps, 2, expected)
