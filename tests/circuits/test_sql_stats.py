"""Statistical and recomputed aggregates compiled from SQL: the moments (``stddev``/``std``,
``stddev_samp``, ``stddev_pop``, ``variance``, ``var_samp``, ``var_pop``: running sums),
``sum(DISTINCT x)`` and ``avg(DISTINCT x)`` (the distinct values' changes), and Spark's own
``max_by``, ``min_by``, ``collect_list``/``array_agg``, ``collect_set``, ``percentile``,
``percentile_approx``/``approx_percentile`` and ``median``, recomputed per touched group;
grouped, global, with ``FILTER``, in ``HAVING``, read by another view and in a correlated
scalar subquery.
Each view equals Spark batch SQL of the same text at every step (hypothesis, with NULLs,
duplicates, ties and groups deleted whole and inserted again), at 1 and 2 workers, and
durably across a restart, with the engine's choice among Spark's answers made explicit
(``max_by`` ties by the value, collections sorted: :mod:`circuits.sql.aggregates`).

The moments over ``d`` (multiples of 0.75) are compared, as every double, to 9 decimals
(:func:`tests.oracle.normalize`): Spark's updates and the engine's sums round differently
in the last bits, which a value with 9 decimals or fewer never shows."""

from __future__ import annotations

import pytest

from . import harness

VIEWS = """
CREATE MATERIALIZED VIEW grouped AS
  SELECT k, stddev(v) AS sd, stddev_pop(v) AS sdp, var_samp(v) AS vs, var_pop(v) AS vp, std(v) AS sd2,
         sum(DISTINCT v) AS sv, avg(DISTINCT v) AS av, sum(DISTINCT v) FILTER (WHERE s = 'a') AS sa,
         max_by(s, v) AS top_s, min_by(s, v) AS low_s, max_by(v, s) AS top_v, min_by(s, v) FILTER (WHERE v > 0) AS low_pos,
         collect_list(v) AS vs_, collect_set(s) AS ss, array_agg(s) FILTER (WHERE v > 1) AS big, size(collect_list(s)) AS n,
         percentile(v, 0.5) AS p50, percentile(v, array(0.25, 0.75)) AS quartiles, percentile_approx(v, 0.5) AS a50,
         approx_percentile(v, array(0.1, 0.9), 100) AS tails, median(v) AS mid
  FROM a GROUP BY k;
CREATE MATERIALIZED VIEW doubles AS
  SELECT k, stddev_samp(d) AS sds, variance(d) AS var, stddev_pop(d) FILTER (WHERE x > 0) AS sdp, var_pop(x + d) AS vxd,
         avg(DISTINCT d) AS ad, max_by(d, x) AS top_d, collect_list(d) AS ds
  FROM b GROUP BY k HAVING var_samp(d) IS NULL OR var_samp(d) > 0.5;
CREATE MATERIALIZED VIEW global AS
  SELECT var_pop(x) AS vp, stddev(d) AS sd, sum(DISTINCT d) AS sd_, avg(DISTINCT x) AS ax, collect_list(d) AS ds,
         collect_set(x) AS xs, median(x) AS mid
  FROM b;
CREATE MATERIALIZED VIEW of_grouped AS SELECT k, ss, size(vs_) AS n FROM grouped WHERE top_s IS NOT NULL;
CREATE MATERIALIZED VIEW correlated AS
  SELECT k, v, (SELECT collect_set(x) FROM b WHERE b.k = a.k) AS xs FROM a;
"""

circuit = harness.sql_views(VIEWS)

FIXED = [
    {"a": [(1, 2, "a", 2), (1, 2, "b", 1), (1, None, "c", 1), (2, None, None, 1)], "b": [(1, 3, 2.25, 1)]},
    {"a": [(1, 2, "a", -2), (1, 2, "b", -1), (1, None, "c", -1), (3, 4, "a", 1)], "b": [(1, 3, -1.5, 1)]},
    {"a": [(1, 0, "b", 1), (1, 0, "a", 1), (2, None, None, -1)], "b": [(1, 3, 2.25, -1), (1, 3, -1.5, -1)]},
]
"""Ties on ``v`` (``max_by``'s and ``min_by``'s), a group of only NULLs, groups deleted whole
(``k = 1`` of ``a`` and of ``b``) and inserted again, and ``b`` empty at the end (the global
aggregates' row over no rows: NULL, and ``[]`` for the collections)."""


@pytest.mark.slow
@harness.at_every_worker_count(harness.SQL_STEPS, max_examples=2, workers=harness.SQL_WORKERS)
def test_stats_equal_spark_batch_sql(spark, circuit, workers, steps):
    """Every view equals Spark batch SQL of its text, with the engine's choice among ties
    and orders, at every step, at 1 and 2 workers."""
    oracle = harness.tie_broken_batch_integrals(spark, VIEWS, harness.SQL_SCHEMAS)
    harness.run_and_compare(spark, circuit, steps, workers, oracle)


@pytest.mark.slow
def test_ties_orders_and_no_rows_durably_across_a_restart(spark, circuit, tmp_path_factory):
    """The fixed steps over a real pipeline on Delta at 2 workers (its state: the groups'
    arrays and running sums, the rows the recomputed aggregates read, the distinct values),
    which dies after writing step 1's outputs and recovers from its last checkpoint; each
    view equals Spark batch SQL with the engine's tie-break, whose answers are, by name:
    ``max_by``/``min_by`` over rows tied on ``v`` take the greatest/least ``s``; collections
    are sorted; a group of NULLs has ``[]`` and NULL moments; a global aggregate over no
    rows has NULL moments and ``[]`` collections."""
    oracle = harness.tie_broken_batch_integrals(spark, VIEWS, harness.SQL_SCHEMAS)

    def expected(t, deltas, integrated):
        views = oracle(t, deltas, integrated)
        grouped = views["grouped"][1]
        if t == 0:  # k; top_s, low_s, top_v, low_pos; vs_, ss, big, n; then k; sd, sdp, vs, vp
            assert _columns(grouped, (1, 10, 11, 12, 13, 14, 15, 16, 17)) == {
                (1, "b", "a", None, "a", (2, 2, 2), ("a", "b", "c"), ("a", "a", "b"), 4): 1,
                (2, None, None, None, None, (), (), (), 0): 1,
            }
            assert _columns(grouped, (1, 2, 3, 4, 5)) == {(1, 0.0, 0.0, 0.0, 0.0): 1, (2, None, None, None, None): 1}
        if t == 2:
            assert views["global"][1] == {(None, None, None, None, (), (), None): 1}
            assert _columns(grouped, (1, 10, 11, 12, 13)) == {(1, "b", "a", 0, None): 1, (3, "a", "a", 4, "a"): 1}
        return views

    root, restart = str(tmp_path_factory.mktemp("stats")), harness.Restart(1, "after_output")
    harness.run_and_compare_durably(spark, circuit, FIXED, harness.DURABLE_WORKERS[0], expected, root, restart)


def _columns(z, positions: tuple[int, ...]) -> dict:
    """``z``'s rows cut to the columns at ``positions`` (from 1)."""
    out: dict = {}
    for row, w in z.items():
        cut = tuple(row[p - 1] for p in positions)
        out[cut] = out.get(cut, 0) + w
    return out
