"""Aggregates over grouping sets compiled from SQL: ``GROUP BY ROLLUP(...)``, ``CUBE(...)``,
``GROUPING SETS (...)`` (with the empty set ``()`` and duplicate sets), the mixed
``GROUP BY x, ROLLUP(...)``, ``WITH ROLLUP``, Hive's ``GROUP BY a, b GROUPING SETS (...)``,
and ``GROUPING()``/``GROUPING_ID()`` in the select list and ``HAVING``; grouping by
expressions, ordinals and select-list aliases, ``DISTINCT`` and a top-k (``ORDER BY ...
LIMIT``) over them; a subquery in FROM compiled once for all the sets.  Each view equals Spark batch SQL of the same text over the integrated
inputs at every step (hypothesis, with NULLs, duplicates, deletes of every row: an
aggregate over grouping sets has no row over no input rows, but ``GROUPING SETS (())``
alone, a global aggregate, has one), at 1 and 2 workers."""

from __future__ import annotations

import pytest
from hypothesis import example

from circuits.sql import SqlError, parse_views

from . import harness
from .harness import SQL_SCHEMAS as SCHEMAS
from .harness import SQL_STEPS, SQL_WORKERS, at_every_worker_count, joins_of

VIEWS = """
CREATE MATERIALIZED VIEW rolled AS
  SELECT a.k, s, count(*) AS n, sum(v) AS total, avg(v) AS mean, min(s) AS low, max(v) AS high,
         grouping(s) AS gs, grouping_id() AS g
  FROM a GROUP BY ROLLUP(k, s) HAVING s IS NULL OR count(*) > 1;
CREATE MATERIALIZED VIEW mixed AS
  SELECT k, x % 2 AS odd, count(*) AS n, sum(d) AS total, grouping_id() AS g, grouping(x % 2) + 1 AS go
  FROM b GROUP BY k, GROUPING SETS ((odd), (), (odd)) HAVING odd IS NULL OR sum(d) > 0;
CREATE MATERIALIZED VIEW cubed AS
  SELECT k, x, count(*) AS n, max(d) AS top FROM b GROUP BY CUBE(1, x) HAVING grouping_id(k, x) < 3 OR count(*) > 1;
CREATE MATERIALIZED VIEW only_empty AS
  SELECT count(*) AS n, sum(x) AS total, grouping_id() AS g FROM b GROUP BY GROUPING SETS (());
CREATE MATERIALIZED VIEW empty_twice AS SELECT count(*) AS n FROM b GROUP BY GROUPING SETS ((), ());
CREATE MATERIALIZED VIEW declared AS
  SELECT x, k, grouping_id() AS g, avg(d) AS mean FROM b GROUP BY k, x GROUPING SETS ((x), ());
CREATE MATERIALIZED VIEW rolled_derived AS
  SELECT k, s, sum(total) AS total, count(*) AS n
  FROM (SELECT a.k, a.s, sum(b.d) AS total FROM a JOIN b ON a.k = b.k GROUP BY a.k, a.s) y GROUP BY ROLLUP(k, s);
CREATE MATERIALIZED VIEW busiest AS
  SELECT DISTINCT grouping(k) AS gk, count(*) AS n FROM a GROUP BY k WITH ROLLUP ORDER BY n DESC, gk LIMIT 2;
"""

circuit = harness.sql_views(VIEWS)

# Over an empty ``a`` and ``b`` (no row but ``only_empty``'s), then rows with NULLs in the
# grouping columns (a group whose key is NULL beside the rolled-up NULL), then every row deleted.
FIXED = [
    {"a": [], "b": []},
    {
        "a": [(1, 2, "a", 2), (1, None, None, 1), (None, 3, "a", 1), (2, 1, "b", 1)],
        "b": [(1, 3, 2.25, 1), (None, None, -1.5, 1), (1, 3, None, 1)],
    },
    {
        "a": [(1, 2, "a", -2), (1, None, None, -1), (None, 3, "a", -1), (2, 1, "b", -1)],
        "b": [(1, 3, 2.25, -1), (None, None, -1.5, -1), (1, 3, None, -1)],
    },
]


@pytest.mark.slow
@at_every_worker_count(SQL_STEPS, max_examples=1, workers=SQL_WORKERS)
@example(steps=FIXED)
def test_grouping_sets_equal_spark_batch_sql(spark, circuit, workers, steps):
    """Every view equals Spark batch SQL of its text at every step (the top-k's with the
    engine's tie-break appended)."""
    harness.run_and_compare(spark, circuit, steps, workers, harness.tie_broken_batch_integrals(spark, VIEWS, SCHEMAS))


def test_the_sets_of_a_rollup_over_a_subquery_read_it_compiled_once(circuit):
    # Each set's aggregate reads the query's FROM: one join between a and b, not one per set.
    assert len(joins_of(circuit, "rolled_derived")) == 1


def test_a_grouping_of_no_grouping_expression_is_refused():
    with pytest.raises(SqlError) as raised:
        parse_views("CREATE MATERIALIZED VIEW bad AS\n  SELECT k, grouping(v) AS g FROM a GROUP BY ROLLUP(k);", "v.sql")
    message = str(raised.value)
    assert message.startswith("v.sql:2, view 'bad': GROUPING(v): v is not a grouping expression")
    assert "name one of the GROUP BY's expressions" in message


def test_a_rollup_before_hive_grouping_sets_is_refused():
    """``GROUP BY a, b GROUPING SETS (...)`` (no comma) lists the grouping expressions
    before the sets: a ``ROLLUP`` there is no list of expressions."""
    with pytest.raises(SqlError) as raised:
        parse_views(
            "CREATE MATERIALIZED VIEW bad AS\n  SELECT k FROM a GROUP BY ROLLUP(k, v) GROUPING SETS (k);", "v.sql"
        )
    assert str(raised.value).startswith("v.sql:2, view 'bad': ROLLUP (k, v) before GROUPING SETS (...) without a comma")
