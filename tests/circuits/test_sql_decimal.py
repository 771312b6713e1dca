"""Decimal ``sum`` and ``avg`` (also ``DISTINCT``) compiled from SQL give Spark's digits and
types: ``sum`` of a ``decimal(p, s)`` is a ``decimal(p + 10, s)``, ``avg`` the exact quotient
of that sum by the count rounded to ``decimal(p + 4, s + 4)``, equal to Spark batch SQL of the same text
at every step (not a double's quotient cast back, which loses the last digits of values
with 16 or more significant digits)."""

from __future__ import annotations

from collections import Counter
from decimal import Decimal

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from circuits.sql import compile_sql, parse_views

from ..oracle import zset
from .harness import SQL_WORKERS, at_every_worker_count, insert_delete_steps, run_and_compare

SCHEMAS = {"t": "k int, p decimal(12,2), q decimal(20,8)"}

VIEWS = """
CREATE MATERIALIZED VIEW per_key AS
  SELECT k, sum(p) AS total, avg(p) AS mean, avg(q) AS mean_q, sum(q) / 3 AS third, sum(DISTINCT p) AS distinct_total,
         avg(DISTINCT p) AS distinct_mean, avg(DISTINCT q) AS distinct_mean_q
  FROM t GROUP BY k;
CREATE MATERIALIZED VIEW overall AS SELECT avg(p) AS mean, sum(p) AS total, avg(p) * 2 AS twice FROM t;
"""

LARGE = [Decimal("9999999999.99"), Decimal("9999999999.98"), Decimal("0.02"), Decimal("-3333333333.33")]
rows = st.tuples(
    st.one_of(st.integers(0, 2), st.none()),
    st.one_of(st.sampled_from(LARGE), st.decimals("-9999999999.99", "9999999999.99", places=2), st.none()),
    st.one_of(st.decimals("-999999999999.99999999", "999999999999.99999999", places=8), st.none()),
)


def batch(spark, integrated) -> dict[str, Counter]:
    spark.createDataFrame(list(integrated["t"].elements()), SCHEMAS["t"]).createOrReplaceTempView("t")
    return {v.name: zset((*r, 1) for r in spark.sql(v.text).collect()) for v in parse_views(VIEWS)}


@pytest.fixture(scope="module")
def circuit(spark):
    return compile_sql(VIEWS, SCHEMAS, spark)


def test_decimal_average_has_sparks_last_digits(spark, circuit):
    """Three values whose mean has 23 significant digits, more than a double holds."""
    values = [Decimal("123456789012.12345678"), Decimal("0.00000001"), Decimal("0.00000001")]
    steps = [{"t": [(1, None, q, 1) for q in values]}, {"t": [(1, Decimal("0.01"), None, 1)]}]

    def expected(t, deltas, integrated):
        want = batch(spark, integrated)
        (row,) = want["per_key"]
        assert row[3] == Decimal("41152263004.041152266667")
        return {name: ("integral", z) for name, z in want.items()}

    run_and_compare(spark, circuit, steps, 1, expected)


@pytest.mark.slow
@at_every_worker_count(insert_delete_steps({"t": rows}, max_steps=3, max_rows=5), max_examples=2, workers=SQL_WORKERS)
def test_decimal_sum_and_avg_equal_spark_batch_sql(spark, circuit, workers, steps):
    def expected(t, deltas, integrated):
        return {name: ("integral", z) for name, z in batch(spark, integrated).items()}

    run_and_compare(spark, circuit, steps, workers, expected)


@st.composite
def decimal_steps(draw):
    """A ``decimal(p, s)`` (any ``1 <= p <= 38``, ``s <= p``) and steps of its values with
    weights other than 1: rows inserted several times, inserted and deleted in one step,
    deleted as many times as they are present.  Values keep every sum's running total
    inside the sum's type and the mean inside avg's (Spark fails an overflow), so digits are
    what differ."""
    p = draw(st.integers(1, 38))
    s = draw(st.integers(0, p))
    # Digits a value may use: 1000 of them sum in the sum's type, and their mean fits avg's.
    room = min(p, min(38, p + 10) - 3, s + min(38, p + 4) - min(38, s + 4))
    # From text and copy_negate: exact, where arithmetic rounds to the context's 28 digits
    # (-largest of 34 nines is -10^34, a value outside the room).
    largest = Decimal(f"{'9' * room}E-{s}")
    least = largest.copy_negate()
    values = st.one_of(
        st.decimals(least, largest, places=s, allow_nan=False, allow_infinity=False),
        st.sampled_from([largest, least]),
        st.none(),
    )
    row = st.tuples(st.one_of(st.integers(0, 1), st.none()), values)
    present: Counter = Counter()
    steps = []
    for _ in range(draw(st.integers(1, 3))):
        step = []
        for r in draw(st.lists(row, max_size=4)):
            times = draw(st.integers(1, 4))
            step.append((*r, times))
            present[r] += times
        for r in sorted(present, key=repr):
            if draw(st.booleans()):
                times = draw(st.integers(1, present[r]))
                step.append((*r, -times))
                present[r] -= times
        present = +present
        steps.append({"t": step})
    return f"k int, v decimal({p},{s})", steps


DECIMAL_VIEWS = """
CREATE MATERIALIZED VIEW by_key AS
  SELECT k, sum(v) AS total, avg(v) AS mean, min(v) AS low, max(v) AS high, count(v) AS n FROM t GROUP BY k;
CREATE MATERIALIZED VIEW overall AS
  SELECT sum(v) AS total, avg(v) AS mean, min(v) AS low, max(v) AS high, count(v) AS n FROM t;
"""


@pytest.mark.slow
@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(drawn=decimal_steps())
@example(  # a value at the least digit of a scale-29 type, where a sum's type keeps 29 decimals
    drawn=("k int, v decimal(29,29)", [{"t": [(None, Decimal("1E-29"), 1)]}])
)
@example(  # sum(a / b) of a decimal(28, 2) and an int is a decimal(38, 12) sum
    drawn=("k int, v decimal(38,12)", [{"t": [(1, Decimal("1234567890123.123456789012"), 3), (1, Decimal("0.01"), 2)]}])
)
@example(  # a mean whose 39th significant digit decides the rounding: SQL's `/` keeps 12 decimals
    drawn=(
        "k int, v decimal(30,10)",
        [{"t": [(1, Decimal("12345678901234567890.1234567891"), 2), (1, Decimal("1E-10"), 1)]}],
    )
)
@example(  # a mean of 38 digits, the most avg's decimal(38, 4) holds, at the least value
    drawn=("k int, v decimal(34,0)", [{"t": [(1, Decimal("-" + "9" * 34), 2), (None, Decimal("9" * 34), 1)]}])
)
def test_every_aggregate_over_every_decimal_type_equals_spark_batch_sql(spark, drawn):
    """``sum``, ``avg``, ``min``, ``max`` and ``count`` over any ``decimal(p, s)`` equal
    Spark batch SQL to the last digit at every step, whatever the rows' weights."""
    schema, steps = drawn
    circuit = compile_sql(DECIMAL_VIEWS, {"t": schema}, spark)

    def expected(t, deltas, integrated):
        spark.createDataFrame(list(integrated["t"].elements()), schema).createOrReplaceTempView("t")
        views = parse_views(DECIMAL_VIEWS)
        return {v.name: ("integral", zset((*r, 1) for r in spark.sql(v.text).collect())) for v in views}

    run_and_compare(spark, circuit, steps, 1, expected)
