"""Top-k views compiled from SQL (``ROW_NUMBER()``/``RANK()``/``DENSE_RANK() OVER (...)``
bounded in the enclosing query, and a view's own ``ORDER BY ... LIMIT``, ordered by its
columns, an aggregate or what it does not select; a ``LIMIT`` over one row, also of one-row
tables side by side, an ``ORDER BY`` alone) equal Spark
batch SQL of the same text over the integrated inputs at every step (hypothesis), at 1,
2 and 4 workers, in memory and durably across a restart.

The data has ties (few distinct values, duplicates, NULLs in the partition and order
keys), where Spark's ``ROW_NUMBER`` and ``LIMIT`` may pick any of the tied rows: the oracle
is Spark batch SQL of the text with the engine's tie-break appended to the ``ORDER BY``
(:func:`circuits.sql.batch.tie_broken`), the one of Spark's allowed answers the engine
maintains."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import example

from circuits.sql import compile_sql
from circuits.sql.batch import tie_broken

from . import harness
from .harness import SQL_SCHEMAS as SCHEMAS
from .harness import Restart, a_rows, at_every_worker_count, b_rows, insert_delete_steps

VIEWS = """
CREATE MATERIALIZED VIEW top_two AS
  SELECT k, v, s, rn FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY k ORDER BY v DESC) AS rn FROM a) WHERE rn <= 2;
CREATE MATERIALIZED VIEW ranked AS
  SELECT t.k, t.v, t.r FROM (
    SELECT k, v, RANK() OVER (PARTITION BY k ORDER BY v) AS r FROM a WHERE s IS NOT NULL
  ) t WHERE t.r < 3 AND t.v IS NOT NULL;
CREATE MATERIALIZED VIEW densest AS
  SELECT k, x FROM (SELECT k, x, DENSE_RANK() OVER (PARTITION BY k % 2 ORDER BY x DESC NULLS FIRST) AS d FROM b)
  WHERE d = 1;
CREATE MATERIALIZED VIEW best_match AS
  SELECT ak, v, x FROM (
    SELECT a.k AS ak, a.v, b.x,
           ROW_NUMBER() OVER (PARTITION BY a.k ORDER BY b.x ASC NULLS LAST, a.s DESC) AS rownum
    FROM a, b WHERE a.k = b.k
  ) WHERE rownum <= 1;
CREATE MATERIALIZED VIEW first_three AS
  SELECT * FROM (SELECT *, ROW_NUMBER() OVER (ORDER BY s) AS n FROM a) WHERE 3 >= n;
CREATE MATERIALIZED VIEW limited AS SELECT k, v + 1 AS w, s FROM a ORDER BY w DESC, a.s LIMIT 3;
CREATE MATERIALIZED VIEW busiest AS
  SELECT k, count(*) AS n, sum(x) AS total FROM b GROUP BY k ORDER BY n DESC, 3 LIMIT 2;
CREATE MATERIALIZED VIEW by_aggregate AS
  SELECT k, count(*) AS n FROM b GROUP BY k ORDER BY sum(x) DESC NULLS LAST, count(*) LIMIT 2;
CREATE MATERIALIZED VIEW by_unselected AS SELECT k, s FROM a ORDER BY v % 3, substr(s, 1, 1) DESC LIMIT 3;
CREATE MATERIALIZED VIEW by_original_name AS SELECT k AS key, v + 1 AS w FROM a ORDER BY a.k DESC, w LIMIT 2;
CREATE MATERIALIZED VIEW one_row AS SELECT count(*) AS n, max(v) AS top FROM a LIMIT 1;
CREATE MATERIALIZED VIEW side_by_side AS
  SELECT * FROM (SELECT count(*) AS n, max(v) AS top FROM a) x,
                (SELECT count(DISTINCT x) AS xs, avg(x) AS mean FROM b WHERE k > 0) y LIMIT 5;
CREATE MATERIALIZED VIEW unordered AS SELECT k, v FROM a WHERE v > 1 ORDER BY v;
CREATE TEMPORARY VIEW leaders AS
  SELECT k, v FROM (SELECT k, v, ROW_NUMBER() OVER (PARTITION BY k ORDER BY v) AS rn FROM a) WHERE rn = 1;
CREATE MATERIALIZED VIEW leaders_joined AS
  SELECT l.k, l.v, b.d FROM leaders l JOIN b ON l.k = b.k;
"""


@pytest.fixture(scope="module")
def circuit(spark):
    """Compiled once: every example runs it on a new state."""
    return compile_sql(VIEWS, SCHEMAS, spark)


# NULLs, duplicates and ties in every key; the last step deletes rows ranked inside the
# top k (and so promotes others), a row of weight 2 straddles the bound.
TIES = [
    {
        "a": [(1, 2, "a", 2), (1, 3, None, 1), (1, None, "b", 1), (None, 2, "a", 1), (2, 2, "b", 1)],
        "b": [(1, 3, 2.25, 1), (1, 3, None, 1), (None, None, 0.0, 1), (2, 1, -1.5, 1)],
    },
    {"a": [(1, 3, "c", 1), (1, 2, "a", -1), (3, None, None, 2)], "b": [(1, None, 0.0, 1), (3, 4, None, 1)]},
    {"a": [(1, 3, None, -1), (1, 3, "c", -1), (None, 2, "a", -1)], "b": [(1, 3, 2.25, -1), (None, None, 0.0, -1)]},
]


test_top_k_views_equal_spark_batch_sql = harness.tie_broken_equal_to_spark_batch_sql(
    VIEWS,
    "Every top-k view equals Spark batch SQL of its text, ties broken as the engine breaks them, at every step.",
    TIES,
    max_examples=2,
)


@pytest.mark.slow
@at_every_worker_count(
    harness.with_restart(insert_delete_steps({"a": a_rows, "b": b_rows}, max_steps=3, max_rows=4)),
    max_examples=1,
    workers=harness.DURABLE_WORKERS,
)
@example(steps=(TIES, Restart(1, "after_output")))
def test_top_k_views_equal_spark_batch_sql_durably_across_a_restart(spark, circuit, tmp_path_factory, workers, steps):
    """The same property over a real pipeline on Delta (its traces in Delta tables),
    dying at a random step and recovering from the last checkpoint."""
    steps, restart = steps
    root = str(tmp_path_factory.mktemp("topk"))
    harness.run_and_compare_durably(
        spark, circuit, steps, workers, harness.tie_broken_batch_integrals(spark, VIEWS, SCHEMAS), root, restart
    )


def test_the_oracle_breaks_ties_as_the_engine_does(spark):
    """``ROW_NUMBER``'s and ``LIMIT``'s choice among tied rows: the rows' columns decide,
    ascending, nulls first; and the tie-break is appended only where Spark may choose."""
    assert tie_broken("SELECT k FROM a", 1) == "SELECT k FROM a"
    assert tie_broken("SELECT k, v FROM a ORDER BY v DESC LIMIT 1", 2).endswith("ORDER BY v DESC, 1, 2 LIMIT 1")
    spark.createDataFrame([(1, 5, "b"), (1, 5, None), (1, 5, "a")], SCHEMAS["a"]).createOrReplaceTempView("a")
    text = "SELECT s FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY k ORDER BY v) AS rn FROM a) WHERE rn <= 2"
    assert Counter(r.s for r in spark.sql(tie_broken(text, 1)).collect()) == Counter([None, "a"])


def test_a_limit_over_rows_all_alike_keeps_that_many_of_them(spark):
    """Spark's TPC-DS q32 as Spark runs it: ``SELECT 1 ... LIMIT 100`` has no ORDER BY, but
    its rows are all the same row, so ``LIMIT k`` keeps ``min(k, n)`` of them, whichever."""
    text = "CREATE MATERIALIZED VIEW ones AS SELECT 1 AS one, 'x' AS x FROM a JOIN b ON a.k = b.k LIMIT 3;"
    circuit = compile_sql(text, SCHEMAS, spark)
    steps = [
        {"a": [(1, 2, "a", 2), (2, 5, "b", 1)], "b": [(1, 3, 1.5, 1), (2, 9, 0.0, 1)]},
        {"a": [(1, 7, None, 1)], "b": [(1, 4, None, 1)]},
        {"a": [(1, 2, "a", -2), (1, 7, None, -1)], "b": []},
    ]
    harness.run_and_compare(spark, circuit, steps, 2, harness.batch_integrals(spark, text))
