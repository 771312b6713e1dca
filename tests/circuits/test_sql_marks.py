"""``IN`` and ``EXISTS`` subqueries that are not a conjunct of their own (under ``OR``,
``NOT`` or ``CASE``, as in TPC-DS q10 and q35), also in a select list, compiled from SQL equal Spark batch SQL of
the same text over the integrated inputs at every step (hypothesis), at 1 and 2 workers.
Each such predicate is a mark beside every row, as Spark's existence joins: TRUE where the
semi join (for ``NOT IN``: the null-aware anti join) keeps it, FALSE elsewhere."""

from __future__ import annotations

from circuits.sql import parse_views

from .harness import equal_to_spark_batch_sql, run_and_compare, spark_batch, sql_views

VIEWS = """
CREATE MATERIALIZED VIEW in_or AS SELECT k, v FROM a WHERE k = 1 OR v IN (SELECT x FROM b);
CREATE MATERIALIZED VIEW exists_or AS
  SELECT k, s FROM a WHERE v > 2 OR EXISTS (SELECT 1 FROM b WHERE b.k = a.k AND b.x > 1);
CREATE MATERIALIZED VIEW two_exists_or AS
  SELECT k, v FROM a
  WHERE EXISTS (SELECT 1 FROM b WHERE b.k = a.k)
    AND (EXISTS (SELECT 1 FROM b WHERE b.k = a.k AND b.d > 0) OR EXISTS (SELECT 1 FROM a a2 WHERE a2.k = a.k AND a2.s = 'b'));
CREATE MATERIALIZED VIEW not_in_or AS SELECT k, v FROM a WHERE s = 'a' OR NOT (v IN (SELECT x FROM b));
CREATE MATERIALIZED VIEW not_of_or AS SELECT k, v FROM a WHERE NOT (s = 'a' OR v IN (SELECT x FROM b WHERE b.k = a.k));
CREATE MATERIALIZED VIEW not_exists_or AS
  SELECT k, v FROM a WHERE v IS NULL OR NOT EXISTS (SELECT 1 FROM b WHERE b.k = a.k AND b.x = a.v);
CREATE MATERIALIZED VIEW in_case AS
  SELECT k, v FROM a WHERE CASE WHEN s = 'a' THEN k IN (SELECT b.k FROM b) ELSE v > 1 END;
CREATE MATERIALIZED VIEW in_or_scalar AS
  SELECT k, v FROM a WHERE v IN (SELECT x FROM b WHERE b.d > 0) OR v > (SELECT avg(x) FROM b);
CREATE MATERIALIZED VIEW in_select_list AS
  SELECT k, v IN (SELECT x FROM b) AS found, EXISTS (SELECT 1 FROM b WHERE b.k = a.k) AS seen FROM a;
CREATE MATERIALIZED VIEW case_of_not_exists AS
  SELECT k, CASE WHEN NOT EXISTS (SELECT 1 FROM b WHERE b.k = a.k) THEN 'none' ELSE s END AS label FROM a;
CREATE MATERIALIZED VIEW residual_or AS
  SELECT k, v FROM a WHERE s = 'b' OR EXISTS (SELECT 1 FROM b WHERE b.k = a.k AND b.x > a.v);
"""

circuit = sql_views(VIEWS)
test_marked_subqueries_equal_spark_batch_sql = equal_to_spark_batch_sql(VIEWS)


def test_marks_are_true_or_false_as_in_spark(spark, circuit):
    """Fixed steps for a NULL among ``q``'s values: Spark makes ``v IN (q)`` and ``NOT (v
    IN (q))`` outside a conjunct of their own an existence join each, TRUE or FALSE: for a
    ``v`` that no value equals both are FALSE (SQL's three values would say unknown for
    each), so ``NOT (v IN (q))`` drops the row; deleting the NULL makes it TRUE."""
    views = parse_views(VIEWS)
    steps = [
        {"a": [(1, 2, "b", 1), (2, 3, "c", 1), (3, None, "c", 1)], "b": [(1, 2, 0.0, 1), (5, None, 1.0, 1)]},
        {"a": [], "b": [(5, None, 1.0, -1)]},
        {"a": [], "b": [(1, 2, 0.0, -1)]},
    ]

    def expected(t, deltas, integrated):
        batch = spark_batch(spark, views, integrated)
        kept = set(batch["not_in_or"])
        assert kept == [set(), {(2, 3)}, {(1, 2), (2, 3), (3, None)}][t], (t, kept)
        if t == 0:
            assert (2, False, False) in batch["in_select_list"], batch["in_select_list"]
        return {name: ("integral", z) for name, z in batch.items()}

    run_and_compare(spark, circuit, steps, 2, expected)
