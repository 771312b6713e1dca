"""The record validator alone: no JVM, no broker."""

import pytest
from pyspark.sql import types as T

from sensors.decode import fields_of, validate
from sensors.errors import UnsupportedSchemaError

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
    schema = T.StructType([T.StructField("id", T.LongType()), T.StructField("at", T.TimestampType())])
    with pytest.raises(UnsupportedSchemaError, match="column 'at' has type timestamp"):
        fields_of(schema)
    with pytest.raises(UnsupportedSchemaError, match="'_weight' is reserved"):
        fields_of(T.StructType([T.StructField("_weight", T.LongType())]))
    assert fields_of(T.StructType([T.StructField("id", T.LongType())])) == (("id", "bigint"),)
