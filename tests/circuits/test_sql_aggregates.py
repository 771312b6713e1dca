"""Spark aggregates that are another aggregate by Spark's own definition, compiled from SQL:
``bool_and``/``every`` (``min`` over booleans), ``bool_or``/``some``/``any`` (``max``),
``count_if(p)`` (``count(NULLIF(p, false))``), ``count`` of several values
(``count(a, b)``, ``count(t.*, ...)``: the rows where none is NULL), ``count(DISTINCT a, b)``
and ``count(DISTINCT (a, b))`` (a struct: its NULL fields count), and any of them with
``FILTER (WHERE p)`` (the rows where ``p`` is not true skipped).
Each view equals Spark batch SQL of the same text over the integrated inputs at every
step (hypothesis, with NULLs, duplicates and deletes), at 1 and 2 workers, and durably
across a restart; over no rows they give Spark's values (NULL, 0)."""

from __future__ import annotations

from circuits.sql import parse_views

from . import harness

VIEWS = """
CREATE MATERIALIZED VIEW booleans AS
  SELECT k, bool_and(v > 1) AS all_big, bool_or(s = 'a') AS any_a, every(v IS NOT NULL) AS all_set,
         some(v = 0) AS some_zero, any(s > 'a') AS any_after, count_if(v > 1) AS n_big
  FROM a GROUP BY k HAVING bool_or(v > 0) OR count_if(s IS NULL) > 0;
CREATE MATERIALIZED VIEW global_booleans AS
  SELECT bool_and(x > 0) AS all_positive, bool_or(d < 0) AS any_negative, count_if(d > 0) AS n FROM b;
CREATE MATERIALIZED VIEW counts AS
  SELECT k, count(v, s) AS both_set, count(a.*, a.*) AS all_set, count(DISTINCT v) + count(k, 1) AS mixed
  FROM a GROUP BY k;
CREATE MATERIALIZED VIEW global_counts AS SELECT count(x, d) AS n, count(b.*, k) AS all_set FROM b;
CREATE MATERIALIZED VIEW correlated AS
  SELECT k, v, (SELECT count_if(x > 1) FROM b WHERE b.k = a.k) AS n,
         (SELECT bool_or(x > 1) FROM b WHERE b.k = a.k) AS any_big,
         (SELECT count(*) FILTER (WHERE x > 1) + 1 FROM b WHERE b.k = a.k) AS n_filtered FROM a;
CREATE MATERIALIZED VIEW filtered AS
  SELECT k, count(*) FILTER (WHERE v > 1) AS n_big, count(v) FILTER (WHERE s = 'a') AS nv,
         count(DISTINCT s) FILTER (WHERE v IS NOT NULL) AS ns, sum(v) FILTER (WHERE s IS NULL) AS total,
         avg(v) FILTER (WHERE v < 4) AS mean, min(s) FILTER (WHERE v > 0) AS low, max(v) FILTER (WHERE s <> 'b') AS high,
         bool_and(v > 1) FILTER (WHERE s IS NOT NULL) AS all_big, count_if(v > 0) FILTER (WHERE s = 'a') AS n_pos,
         count(v, s) FILTER (WHERE k > 0) AS both_set, count(*) AS n
  FROM a GROUP BY k HAVING count(*) FILTER (WHERE v IS NULL) > 0 OR sum(v) FILTER (WHERE v > 1) > 2;
CREATE MATERIALIZED VIEW distinct_tuples AS
  SELECT k, count(DISTINCT v, s) AS pairs, count(DISTINCT (v, s)) AS structs, count(DISTINCT a.*, 1) AS rows_,
         count(DISTINCT (v, s)) FILTER (WHERE v > 0) AS positive FROM a GROUP BY k;
CREATE MATERIALIZED VIEW global_distinct_tuples AS SELECT count(DISTINCT k, d) AS n, count(DISTINCT (x, d)) AS m FROM b;
CREATE MATERIALIZED VIEW global_filtered AS
  SELECT count(*) FILTER (WHERE x > 2) AS n, sum(x) FILTER (WHERE d > 0) AS total, avg(d) FILTER (WHERE x > 1) AS mean,
         max(d) FILTER (WHERE k IS NULL) AS top, count(DISTINCT k) FILTER (WHERE d < 0) AS keys FROM b;
"""


circuit = harness.sql_views(VIEWS)
test_aggregates_equal_spark_batch_sql = harness.equal_to_spark_batch_sql(VIEWS)
test_aggregates_equal_spark_batch_sql_durably_across_a_restart = harness.durably_equal_to_spark_batch_sql(
    VIEWS,
    """Their state (the integrals ``min``/``max`` and distinct counts read) on Delta,
    recovered after the pipeline dies at a random step.""",
    (
        [
            {"a": [(1, 2, "a", 2), (1, None, None, 1), (2, 0, "b", 1)], "b": [(1, 3, 2.25, 1), (None, 1, None, 1)]},
            {"a": [(1, 2, "a", -1), (2, 3, "a", 1)], "b": [(1, 3, 2.25, -1), (1, 0, -1.5, 1)]},
            {"a": [(1, 2, "a", -1), (2, 0, "b", -1)], "b": [(None, 1, None, -1)]},
        ],
        harness.Restart(1, "after_output"),
    ),
    max_examples=1,
)


def test_aggregates_over_nulls_and_no_rows(spark, circuit):
    """Fixed steps: a group whose values are all NULL (``bool_and`` NULL, ``count_if`` 0,
    ``count(v, s)`` 0), the global aggregates over an empty ``b`` (NULL, NULL, 0), then
    every row of a group deleted; each aggregate's ``FILTER`` passing no row of a group
    (``count`` 0, the others NULL); distinct tuples and structs with NULLs and ``-0.0``."""
    views = parse_views(VIEWS)
    steps = [
        {"a": [(1, None, None, 1), (1, None, "a", 1), (2, 3, "a", 1)], "b": []},
        {"a": [(2, 0, "b", 1), (2, None, None, 2)], "b": [(1, 3, 2.25, 1), (1, None, -1.5, 1), (2, 1, -0.0, 1)]},
        {"a": [(2, 3, "a", -1), (2, 0, "b", -1)], "b": [(1, 3, 2.25, -1), (1, None, -1.5, -1), (2, 1, 0.0, 1)]},
    ]

    def expected(t, deltas, integrated):
        batch = harness.spark_batch(spark, views, integrated)
        if t == 0:
            assert batch["global_booleans"] == {(None, None, 0): 1}
            assert batch["booleans"][(1, None, True, False, None, False, 0)] == 1
            assert batch["counts"][(1, 0, 0, 2)] == 1
            assert batch["global_filtered"] == {(0, None, None, None, 0): 1}
            assert batch["filtered"] == {
                (1, 0, 0, 0, None, None, None, None, None, 0, 0, 2): 1,
                (2, 1, 1, 1, None, 3.0, "a", 3, True, 1, 1, 1): 1,
            }
            assert batch["correlated"][(2, 3, 0, None, 1)] == 1
            assert batch["distinct_tuples"][(1, 0, 2, 0, 0)] == 1
        if t == 1:
            assert batch["distinct_tuples"][(2, 2, 3, 2, 1)] == 1
        if t == 2:  # (NULL, NULL) is a struct to count; -0.0 and 0.0 one value
            assert batch["distinct_tuples"] == {(1, 0, 2, 0, 0): 1, (2, 0, 1, 0, 0): 1}
            assert batch["global_distinct_tuples"] == {(1, 1): 1}
        return {name: ("integral", z) for name, z in batch.items()}

    harness.run_and_compare(spark, circuit, steps, 1, expected)
