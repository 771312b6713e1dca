"""The record validator alone: no JVM, no broker."""

from decimal import Decimal

import pytest
from pyspark.sql import types as T

from sensors.decode import decode, fields_of, validate
from sensors.errors import UnsupportedSchemaError
from sensors.values import dumps

BIDS = (("auction", "bigint"), ("price", "bigint"), ("channel", "string"))


def test_a_valid_record_inserts_once_by_default_and_ignores_extra_keys():
    assert validate(b'{"auction": 1, "price": 10, "channel": "web", "extra": [1]}', BIDS) == (1, None)


def test_weight_and_nulls():
    assert validate(b'{"auction": 1, "price": null, "channel": null, "_weight": -1}', BIDS) == (-1, None)


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (b"not json", "undecodable value: not UTF-8 JSON (Expecting value: line 1 column 1 (char 0))"),
        (
            b"\xff\xfe{}",
            "undecodable value: not UTF-8 JSON ('utf-8' codec can't decode byte 0xff in position 0: invalid start byte)",
        ),
        (b"[1, 2]", "undecodable value: a JSON list, not an object"),
        (b'{"auction": NaN, "price": 1, "channel": "a"}', "undecodable value: not UTF-8 JSON (NaN is not JSON)"),
        (None, "undecodable value: null (a tombstone carries no row)"),
        (b'{"auction": 1, "channel": "a"}', "wrong schema: missing field 'price'"),
        (b'{"auction": 1, "price": "12", "channel": "a"}', "wrong schema: field 'price' expected bigint, got str"),
        (b'{"auction": 1.5, "price": 1, "channel": "a"}', "wrong schema: field 'auction' expected bigint, got float"),
        (b'{"auction": true, "price": 1, "channel": "a"}', "wrong schema: field 'auction' expected bigint, got bool"),
        (b'{"auction": 1, "price": 1, "channel": 7}', "wrong schema: field 'channel' expected string, got int"),
        (
            b'{"auction": 9223372036854775808, "price": 1, "channel": "a"}',
            "wrong schema: field 'auction' expected bigint, got 9223372036854775808 (out of bigint range)",
        ),
        (
            b'{"auction": 1, "price": 1, "channel": "a", "_weight": 0}',
            "wrong weight: '_weight' must be a nonzero bigint, got 0",
        ),
        (
            b'{"auction": 1, "price": 1, "channel": "a", "_weight": "1"}',
            "wrong weight: '_weight' must be a nonzero bigint, got '1'",
        ),
    ],
)
def test_invalid_records_say_why(value, reason):
    assert validate(value, BIDS) == (None, reason)


def test_numeric_types():
    fields = (("t", "tinyint"), ("i", "int"), ("d", "double"), ("f", "float"), ("b", "boolean"))
    assert validate(b'{"t": -128, "i": 2147483647, "d": 1, "f": 2.5, "b": false}', fields) == (1, None)
    assert validate(b'{"t": 128, "i": 1, "d": 1, "f": 1, "b": true}', fields)[1] == (
        "wrong schema: field 't' expected tinyint, got 128 (out of tinyint range)"
    )
    assert (
        validate(b'{"t": 1, "i": 1, "d": 1, "f": 1, "b": 1}', fields)[1]
        == "wrong schema: field 'b' expected boolean, got int"
    )


def test_fields_of_refuses_types_json_input_cannot_check():
    schema = T.StructType([T.StructField("id", T.LongType()), T.StructField("at", T.BinaryType())])
    with pytest.raises(UnsupportedSchemaError, match="column 'at' has type binary.*one of tinyint, smallint"):
        fields_of(schema)
    with pytest.raises(UnsupportedSchemaError, match="column 'm' has type map<string,bigint>.*neither with a map"):
        fields_of("id bigint, m map<string, bigint>")
    with pytest.raises(UnsupportedSchemaError, match="'_weight' is reserved"):
        fields_of(T.StructType([T.StructField("_weight", T.LongType())]))
    assert fields_of(T.StructType([T.StructField("id", T.LongType())])) == (("id", "bigint"),)


TYPED = (
    ("p", "decimal(5,2)"),
    ("ts", "timestamp"),
    ("n", "timestamp_ntz"),
    ("day", "date"),
    ("tags", "array<decimal(3,1)>"),
    ("s", "struct<at:timestamp,x:bigint>"),
)
NULLS = {name: None for name, _ in TYPED}


def typed(**values) -> bytes:
    """A record of ``TYPED`` (a ``Decimal`` written as the number it reads as)."""
    return dumps(NULLS | values).encode()


@pytest.mark.parametrize(
    ("values", "spark"),
    [
        ({"p": 1}, {"p": "1.00"}),
        ({"p": "-999.99"}, {"p": "-999.99"}),
        ({"p": "1.5e2"}, {"p": "150.00"}),
        ({"ts": "2024-03-01T12:30:00Z"}, {"ts": '"2024-03-01T12:30:00.000000Z"'}),
        ({"ts": "2024-03-01 12:30:00.5+01:00"}, {"ts": '"2024-03-01T11:30:00.500000Z"'}),
        ({"ts": "2024-03-01T12:30"}, {"ts": '"2024-03-01T12:30:00.000000Z"'}),  # no offset: UTC
        ({"ts": "2024-03-01"}, {"ts": '"2024-03-01T00:00:00.000000Z"'}),
        ({"ts": 0}, {"ts": '"1970-01-01T00:00:00.000000Z"'}),
        ({"ts": -62135596800}, {"ts": '"0001-01-01T00:00:00.000000Z"'}),
        ({"n": "9999-12-31 23:59:59.999999"}, {"n": '"9999-12-31T23:59:59.999999"'}),
        ({"day": "2024-02-29"}, {"day": '"2024-02-29"'}),
        ({"tags": [1, None, "-99.9"]}, {"tags": "[1.0,null,-99.9]"}),
        ({"s": {"at": 1.5, "x": 1, "other": 2}}, {"s": '{"at":"1970-01-01T00:00:01.500000Z","x":1}'}),
    ],
)
def test_typed_values_are_handed_to_spark_in_its_form(values, spark):
    weight, text, reason = decode(typed(**values), TYPED)
    assert (weight, reason) == (1, None)
    for name, form in spark.items():
        assert f'"{name}":{form}' in text


def test_decimals_keep_every_digit():
    """A JSON number is not read as a float, nor rounded to Python's 28 digits: all 38 stay."""
    fields = (("d", "decimal(38,18)"),)
    _, text, _ = decode(b'{"d": 12345678901234567890.123456789012345678}', fields)
    assert text == '{"d":12345678901234567890.123456789012345678}'
    top = "99999999999999999999.999999999999999999"
    assert decode(f'{{"d": "-{top}"}}'.encode(), fields)[1] == f'{{"d":-{top}}}'
    for past in ("1" + "0" * 20, "1E+20", "1e400", "99999999999999999999.9999999999999999995"):
        assert decode(f'{{"d": {past}}}'.encode(), fields)[0] is None, past


@pytest.mark.parametrize(
    ("values", "reason"),
    [
        ({"p": 1.005}, "field 'p' expected decimal(5,2), got 1.005 (more than 2 digits after the point)"),
        ({"p": 1000}, "field 'p' expected decimal(5,2), got 1000 (more than 3 digits before the point)"),
        ({"p": "ten"}, "field 'p' expected decimal(5,2), got 'ten' (not a number)"),
        ({"p": "Infinity"}, "field 'p' expected decimal(5,2), got 'Infinity' (not a finite number)"),
        ({"p": True}, "field 'p' expected decimal(5,2), got bool"),
        ({"ts": "yesterday"}, "field 'ts' expected timestamp, got 'yesterday' (Invalid isoformat string: 'yesterday')"),
        ({"ts": "2024-03-01T00:00:00.1234567Z"}, "more than 6 digits after the second"),
        ({"ts": 1.0000001}, "field 'ts' expected timestamp, got 1.0000001 seconds (finer than a microsecond)"),
        ({"ts": 10**12}, "seconds (outside the years 1 to 9999)"),
        ({"ts": Decimal("1e999999999")}, "seconds (outside the years 1 to 9999)"),
        ({"ts": Decimal("1e-999999999")}, "seconds (finer than a microsecond)"),
        ({"ts": "0001-01-01T00:00:00+01:00"}, "(date value out of range)"),
        ({"n": "2024-03-01T00:00:00Z"}, "a timestamp_ntz has no UTC offset"),
        ({"n": 0}, "field 'n' expected timestamp_ntz, got int"),
        ({"day": "2024-02-30"}, "field 'day' expected date, got '2024-02-30' (day is out of range for month)"),
        ({"tags": [1, "x"]}, "field 'tags' expected array<decimal(3,1)>, got 'x' (not a number)"),
        ({"tags": 1.5}, "field 'tags' expected array<decimal(3,1)>, got float"),
        ({"s": {"at": None}}, "field 's' expected struct<at:timestamp,x:bigint>, got an object without field 'x'"),
    ],
)
def test_typed_values_of_another_type_say_why(values, reason):
    weight, _, why = decode(typed(**values), TYPED)
    assert weight is None and reason in why and why.startswith("wrong schema: ")
