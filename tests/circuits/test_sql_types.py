"""Views over columns of every type JSON input carries (DATE, TIMESTAMP, TIMESTAMP_NTZ,
DECIMAL, arrays and structs), with NULLs and the extreme values of each, maintained on
Delta (state, outputs) at 1 and 2 workers equal to Spark batch SQL of the same text at
every step (hypothesis), across a restart."""

from __future__ import annotations

from datetime import date, datetime
from decimal import Decimal

import pytest
from hypothesis import example
from hypothesis import strategies as st

from circuits.sql import compile_sql

from . import harness
from .harness import Restart, at_every_worker_count, insert_delete_steps, with_restart

SCHEMAS = {
    "e": "k INT, d DATE, ts TIMESTAMP, n TIMESTAMP_NTZ, p DECIMAL(12,2), tags ARRAY<DECIMAL(4,1)>, "
    "s STRUCT<at: TIMESTAMP, q: DECIMAL(38,10)>"
}

VIEWS = """
CREATE MATERIALIZED VIEW kept AS SELECT * FROM e;
CREATE MATERIALIZED VIEW per_day AS
  SELECT to_date(ts) AS day, count(*) AS n, sum(p) AS total, max(ts) AS last, max(s) AS greatest FROM e
  GROUP BY to_date(ts);
CREATE MATERIALIZED VIEW hourly AS
  SELECT date_trunc('HOUR', ts) AS hour, avg(p) AS mean, max(n) AS latest FROM e GROUP BY date_trunc('HOUR', ts);
CREATE MATERIALIZED VIEW same_day AS
  SELECT a.k, a.d, b.n, b.tags FROM e a JOIN e b ON a.d = b.d WHERE a.p <= b.p;
"""

# PySpark's client cannot convert a timestamp of 0001-01-01 to send it (its arithmetic
# passes through year 0); the decoder's tests take that day (tests/sensors/test_types.py).
LOW, HIGH = datetime(1, 1, 2), datetime(9999, 12, 31, 23, 59, 59, 999999)
_moments = st.one_of(
    st.sampled_from([LOW, HIGH, datetime(1970, 1, 1), datetime(2024, 2, 29, 23, 59, 59, 999999)]),
    st.datetimes(LOW, HIGH),
    st.none(),
)
_days = st.one_of(st.sampled_from([date(1, 1, 1), date(9999, 12, 31), date(2024, 2, 29)]), st.dates(), st.none())
_cents = st.one_of(
    st.sampled_from([Decimal("9999999999.99"), Decimal("-9999999999.99"), Decimal("0.01")]),
    st.decimals("-9999999999.99", "9999999999.99", places=2),
    st.none(),
)
# Arrays as tuples while steps are drawn (their Z-sets key rows by value), as lists for Spark.
_tags = st.one_of(
    st.lists(st.one_of(st.decimals("-999.9", "999.9", places=1), st.none()), max_size=3).map(tuple), st.none()
)
_structs = st.one_of(
    st.tuples(
        _moments, st.one_of(st.decimals("-1e27", "1e27", places=10), st.just(Decimal("-" + "9" * 28 + ".9999999999")))
    ),
    st.none(),
)
rows = st.tuples(st.one_of(st.integers(0, 2), st.none()), _days, _moments, _moments, _cents, _tags, _structs)

# The day of the first and last instants (a date_trunc and to_date at each end), NULLs
# everywhere, a row deleted and one inserted twice.
EXTREMES = [
    {
        "e": [
            (
                1,
                date(1, 1, 1),
                LOW,
                HIGH,
                Decimal("-9999999999.99"),
                (Decimal("-999.9"), None),
                (LOW, Decimal("0E-10")),
                1,
            ),
            (2, date(9999, 12, 31), HIGH, LOW, Decimal("9999999999.99"), (), (HIGH, None), 2),
            (None, None, None, None, None, None, None, 1),
            (0, date(9999, 12, 31), HIGH, None, Decimal("0.01"), None, (None, None), 1),
        ]
    },
    {"e": [(0, date(9999, 12, 31), HIGH, None, Decimal("0.01"), None, (None, None), -1)]},
]


def listed(row: tuple) -> tuple:
    """``row`` with its array a list, as Spark Connect takes it."""
    return (*row[:5], None if row[5] is None else list(row[5]), *row[6:])


def listed_steps(steps: list[dict]) -> list[dict]:
    return [{name: [listed(r) for r in rows] for name, rows in step.items()} for step in steps]


@pytest.fixture(scope="module")
def circuit(spark):
    return compile_sql(VIEWS, SCHEMAS, spark)


@pytest.mark.slow
@at_every_worker_count(
    with_restart(insert_delete_steps({"e": rows}, max_steps=3, max_rows=4).map(listed_steps)),
    max_examples=1,
    workers=(1, 2),
)
@example(steps=(listed_steps(EXTREMES), Restart(1, "after_output")))
def test_typed_views_equal_spark_batch_sql_durably(spark, circuit, tmp_path_factory, workers, steps):
    steps, restart = steps
    root = str(tmp_path_factory.mktemp("types"))
    harness.run_and_compare_durably(
        spark, circuit, steps, workers, harness.tie_broken_batch_integrals(spark, VIEWS, SCHEMAS, listed), root, restart
    )
