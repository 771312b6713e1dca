"""Window functions as columns of SQL views (aggregates over running, moving and whole
partition frames; ``LAG``/``LEAD``, ``FIRST_VALUE``/``LAST_VALUE``/``NTH_VALUE``; ranks
without a bound; ``QUALIFY``; windows over a query's groups) equal Spark batch SQL of the same text over the integrated inputs at
every step (hypothesis), at :data:`~tests.circuits.harness.SQL_WORKERS`, in memory.

The data has ties (few distinct values, duplicates, NULLs in the partition and order
keys).  Where a function's value depends on the order of tied rows (``ROW_NUMBER``,
``NTILE``, ``LAG``, ``LEAD``, any function over a ``ROWS`` frame), the oracle is Spark
batch SQL of the text with the engine's tie-break appended to the window's ``ORDER BY``
(:func:`circuits.sql.batch.tie_broken`).  A view's order-dependent windows share one
``ORDER BY``: over rows equal in every column, Spark pairs the values of windows of
different orders as it likes, in batch as in the engine."""

from __future__ import annotations

from . import harness

VIEWS = """
CREATE MATERIALIZED VIEW running AS
  SELECT k, v, s,
         sum(v) OVER by_v AS run,
         count(*) OVER (PARTITION BY k) AS n,
         avg(v) OVER (PARTITION BY k ORDER BY v, s ROWS BETWEEN 1 PRECEDING AND 1 FOLLOWING) AS moving,
         v + 1 AS w
  FROM a
  WINDOW by_v AS (PARTITION BY k ORDER BY v);
CREATE MATERIALIZED VIEW offsets AS
  SELECT k, v, s,
         v - lag(v) OVER by_s AS rise,
         lead(v, 2, -1) OVER (by_s) AS after_next,
         first_value(s) OVER (PARTITION BY k ORDER BY v ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING) AS lowest,
         last_value(v) IGNORE NULLS OVER (PARTITION BY k ORDER BY s ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS seen,
         nth_value(v, 2) OVER (PARTITION BY k ORDER BY v DESC ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING) AS second
  FROM a
  WINDOW by_s AS (PARTITION BY k ORDER BY s), unused AS ();
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
  FROM a JOIN b ON a.k = b.k
  QUALIFY pair IS NULL OR pair > 2 OR row_number() OVER (PARTITION BY a.k ORDER BY a.v, b.x) = 1;
CREATE MATERIALIZED VIEW over_groups AS
  SELECT k, count(*) AS n, sum(v) AS total,
         rank() OVER (ORDER BY count(*) DESC) AS place,
         sum(sum(v)) OVER (PARTITION BY a.k % 2) AS half_total,
         row_number() OVER (ORDER BY count(*)) AS nth,
         sum(count(*)) OVER (ORDER BY max(s) ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS seen
  FROM a GROUP BY k
  HAVING count(*) > 0
  QUALIFY place <= 3 OR total IS NULL;
CREATE MATERIALIZED VIEW rolled_up AS
  SELECT k, s, total, depth FROM (
    SELECT k, s, sum(v) AS total, grouping(k) + grouping(s) AS depth,
           rank() OVER (PARTITION BY grouping(k) + grouping(s), CASE WHEN grouping(s) = 0 THEN k END
                        ORDER BY sum(v) DESC) AS within
    FROM a GROUP BY ROLLUP(k, s))
  WHERE within <= 2;
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


test_window_views_equal_spark_batch_sql = harness.tie_broken_equal_to_spark_batch_sql(
    VIEWS,
    "Every window view equals Spark batch SQL of its text, ties broken as the engine breaks them, at every step.",
    TIES,
    max_examples=1,
)
