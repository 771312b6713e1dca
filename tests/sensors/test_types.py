"""Every input type through the decoder and Spark's JSON reader (hypothesis): a row of
Python values, written in any of the JSON forms its types take, comes out of the step's
read as those values exactly, NULLs and the extreme values of each type included."""

from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F

from circuits.zset import parse_schema
from sensors.decode import decode, fields_of
from sensors.values import dumps

SCHEMA = (
    "d DECIMAL(38,10), p DECIMAL(5,2), ts TIMESTAMP, n TIMESTAMP_NTZ, day DATE, "
    "a ARRAY<DECIMAL(4,1)>, s STRUCT<at: TIMESTAMP, x: BIGINT>"
)
LOW, HIGH = datetime(1, 1, 1), datetime(9999, 12, 31, 23, 59, 59, 999999)
EPOCH = datetime(1970, 1, 1)


def nullable(values):
    return st.one_of(st.none(), values)


def decimals(precision: int, scale: int):
    """Every ``DECIMAL(precision, scale)`` value, made from its digits (Decimal arithmetic,
    hypothesis's too, rounds to 28 digits)."""
    top = 10**precision - 1
    digits = st.one_of(st.sampled_from([top, -top, 0]), st.integers(-top, top))
    return digits.map(lambda i: Decimal(f"{i}E-{scale}"))


moments = st.one_of(st.sampled_from([LOW, HIGH, EPOCH]), st.datetimes(LOW, HIGH))
rows = st.tuples(
    nullable(decimals(38, 10)),
    nullable(decimals(5, 2)),
    nullable(moments),
    nullable(moments),
    nullable(st.one_of(st.sampled_from([date(1, 1, 1), date(9999, 12, 31)]), st.dates())),
    nullable(st.lists(nullable(decimals(4, 1)), max_size=3)),
    nullable(st.tuples(nullable(moments), nullable(st.integers(-(2**63), 2**63 - 1)))),
)


@st.composite
def json_number_or_string(draw, value: Decimal):
    """A decimal as a JSON number (its digits, maybe with an exponent: a ``Decimal`` is
    written as it reads) or a string of one."""
    text = draw(st.sampled_from([str(value), f"{value:E}", f"{value:f}"]))
    return draw(st.sampled_from([text, Decimal(text)]))


@st.composite
def instant(draw, moment: datetime):
    """A UTC instant as an ISO string with some offset, without one, or epoch seconds."""
    form = draw(st.integers(0, 3))
    if form == 0:
        return moment.isoformat() + "Z"
    if form == 1:
        zone = timezone(timedelta(hours=draw(st.integers(-12, 14))))
        try:
            return moment.replace(tzinfo=UTC).astimezone(zone).isoformat()
        except OverflowError:  # past year 1 or 9999 in that zone
            return moment.isoformat(sep=" ")
    if form == 2:
        return moment.isoformat(sep=" ")
    return Decimal((moment - EPOCH) // timedelta(microseconds=1)).scaleb(-6)


@st.composite
def record(draw, row: tuple) -> str:
    d, p, ts, n, day, a, s = row

    def opt(value, form):
        return None if value is None else draw(form(value))

    fields = {
        "d": opt(d, json_number_or_string),
        "p": opt(p, json_number_or_string),
        "ts": opt(ts, instant),
        "n": None if n is None else n.isoformat(),
        "day": None if day is None else day.isoformat(),
        "a": None if a is None else [opt(v, json_number_or_string) for v in a],
        "s": None if s is None else {"at": opt(s[0], instant), "x": s[1]},
    }
    return dumps(fields)


@st.composite
def records(draw):
    drawn = draw(st.lists(rows, min_size=1, max_size=12))
    return drawn, [draw(record(row)) for row in drawn]


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(examples=records())
def test_every_type_is_read_exactly_in_each_json_form(spark, examples):
    expected, texts = examples
    fields = fields_of(SCHEMA)
    decoded = [decode(text.encode(), fields) for text in texts]
    assert [reason for _, _, reason in decoded] == [None] * len(texts), texts
    frame = spark.createDataFrame([(spark_text,) for _, spark_text, _ in decoded], "value string")
    parsed = frame.select(F.from_json("value", parse_schema(SCHEMA), {"mode": "FAILFAST"}).alias("r")).select("r.*")
    got = [tuple(tuple(v) if isinstance(v, tuple) else v for v in r) for r in parsed.collect()]
    assert got == [tuple(tuple(v) if isinstance(v, tuple) else v for v in row) for row in expected]
