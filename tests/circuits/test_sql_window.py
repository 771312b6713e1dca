"""Window functions as columns of SQL views (aggregates over running, moving and whole
partition frames; ``LAG``/``LEAD``, ``FIRST_VALUE``/``LAST_VALUE``/``NTH_VALUE``; ranks
without a bound) equal Spark batch SQL of the same text over the integrated inputs at
every step (hypothesis), at :data:`~tests.circuits.harness.SQL_WORKERS`, in memory.

The data has ties (few distinct values, duplicates, NULLs in the partition and order
keys).  Where a function's value depends on the order of tied rows (``ROW_NUMBER``,
``NTILE``, ``LAG``, ``LEAD``, any function over a ``ROWS`` frame), the oracle is Spark
batch SQL of the text with the engine's tie-break appended to the window's ``ORDER BY``
(:func:`circuits.sql.batch.tie_broken`).  A view's order-dependent windows share one
``ORDER BY``: over rows equal in every column, Spark pairs the values of windows of
different orders as it likes, in batch as in the engine."""

from __future__ import annotations

import pytest
from hypothesis import example

from circuits.sql import SqlError, compile_sql

from . import harness
from .harness import SQL_SCHEMAS as SCHEMAS
from .harness import SQL_WORKERS, a_rows, at_every_worker_count, b_rows, insert_delete_steps

VIEWS = """
CREATE MATERIALIZED VIEW running AS
  SELECT k, v, s,
         sum(v) OVER (PARTITION BY k ORDER BY v) AS run,
         count(*) OVER (PARTITION BY k) AS n,
         avg(v) OVER (PARTITION BY k ORDER BY v, s ROWS BETWEEN 1 PRECEDING AND 1 FOLLOWING) AS moving,
         v + 1 AS w
  FROM a;
CREATE MATERIALIZED VIEW offsets AS
  SELECT k, v, s,
         v - lag(v) OVER (PARTITION BY k ORDER BY s) AS rise,
         lead(v, 2, -1) OVER (PARTITION BY k ORDER BY s) AS after_next,
         first_value(s) OVER (PARTITION BY k ORDER BY v ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING) AS lowest,
         last_value(v) IGNORE NULLS OVER (PARTITION BY k ORDER BY s ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS seen,
         nth_value(v, 2) OVER (PARTITION BY k ORDER BY v DESC ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING) AS second
  FROM a;
CREATE MATERIALIZED VIEW ranks AS
  SELECT k, x, d,
         row_number() OVER (PARTITION BY k ORDER BY x DESC) AS rn,
         ntile(2) OVER (PARTITION BY k ORDER BY x DESC) AS half,
         rank() OVER (PARTITION BY k ORDER BY x DESC) AS r,
         dense_rank() OVER (ORDER BY d) AS dr,
         percent_rank() OVER (PARTITION BY k ORDER BY d) AS pr,
         cume_dist() OVER (PARTITION BY k ORDER BY x) AS cd,
         min(d) OVER (PARTITION BY k % 2 ORDER BY x RANGE BETWEEN 1 PRECEDING AND CURRENT ROW) AS low,
         max(x) OVER (ORDER BY d DESC NULLS FIRST ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) - x AS gap,
         sum(d) OVER () AS total
  FROM b;
CREATE MATERIALIZED VIEW joined AS
  SELECT a.k, a.v, b.x,
         sum(b.x) OVER (PARTITION BY a.k ORDER BY a.v, b.x ROWS BETWEEN 1 PRECEDING AND CURRENT ROW) AS pair,
         count(b.d) OVER (PARTITION BY a.s) AS ds
  FROM a JOIN b ON a.k = b.k;
CREATE TEMPORARY VIEW counts AS SELECT k, count(*) AS n FROM b GROUP BY k;
CREATE MATERIALIZED VIEW shares AS
  SELECT k, n, n / sum(n) OVER () AS part, rank() OVER (ORDER BY n DESC) AS place FROM counts;
"""

circuit = harness.sql_views(VIEWS)

# NULLs, duplicates and ties in every key: rows of weight 2, a partition's first rows
# deleted (every other row's neighbours shift), a whole partition emptied.
TIES = [
    {
        "a": [(1, 2, "a", 2), (1, 3, None, 1), (1, None, "b", 1), (1, 0, "b", 1), (None, 2, "a", 1), (2, 2, "b", 1)],
        "b": [(1, 3, 2.25, 2), (1, 3, None, 1), (1, 0, 0.0, 1), (None, None, 0.0, 1), (2, 1, -1.5, 1)],
    },
    {
        "a": [(1, 2, "a", -2), (1, None, "b", -1), (None, 2, "a", -1), (3, None, None, 2)],
        "b": [(1, 3, 2.25, -1), (2, 1, -1.5, -1), (3, 4, None, 2)],
    },
]


@pytest.mark.slow
@at_every_worker_count(
    insert_delete_steps({"a": a_rows, "b": b_rows}, max_steps=3, max_rows=5), max_examples=1, workers=SQL_WORKERS
)
@example(steps=TIES)
def test_window_views_equal_spark_batch_sql(spark, circuit, workers, steps):
    harness.run_and_compare(spark, circuit, steps, workers, harness.tie_broken_batch_integrals(spark, VIEWS, SCHEMAS))


def refusal(spark, text: str) -> str:
    with pytest.raises(SqlError) as raised:
        compile_sql(text, SCHEMAS, spark)
    return str(raised.value)


def test_a_window_in_a_query_with_group_by_is_refused(spark):
    message = refusal(
        spark,
        "CREATE MATERIALIZED VIEW top AS\n  SELECT k, sum(x) AS t,\n    rank() OVER (ORDER BY sum(x)) AS r FROM b GROUP BY k;",
    )
    assert "view 'top'" in message and ":3" in message and "GROUP BY or aggregates" in message
    assert "aggregate in a subquery in FROM" in message


def test_first_value_over_a_range_frame_is_refused(spark):
    message = refusal(
        spark, "CREATE MATERIALIZED VIEW f AS SELECT k, first_value(v) OVER (PARTITION BY k ORDER BY v) AS f FROM a;"
    )
    assert "RANGE frame" in message and "ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING" in message


def test_an_unmaintained_window_function_is_refused(spark):
    message = refusal(
        spark, "CREATE MATERIALIZED VIEW c AS SELECT k, collect_list(v) OVER (PARTITION BY k) AS l FROM a;"
    )
    assert "collect_list" in message.lower() and "lag, lead" in message
