"""The JVM decoder (``circuits/java/dbsp/RecordDecoder.java``) against the Python one
(``sensors.decode.decode``), which defines the rules: on random record values, every row
the JVM gives is a row Python accepts, with its weight and the values Spark's
``from_json`` reads from the text Python hands on; what the JVM leaves (null) Python
judges.  And the JVM must take the common case, valid records of plain columns."""

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F
from pyspark.sql import types as T

from circuits.zset import WEIGHT, parse_schema
from sensors.decode import _decoder, decode, fields_of

SCHEMA = parse_schema(
    "l BIGINT, i INT, s SMALLINT, t TINYINT, d DOUBLE, f FLOAT, b BOOLEAN, name STRING, p DECIMAL(5,2)"
)
FIELDS = fields_of(SCHEMA)

KINDS = {
    "l": st.integers(-(2**63), 2**63 - 1),
    "i": st.integers(-(2**31), 2**31 - 1),
    "s": st.integers(-(2**15), 2**15 - 1),
    "t": st.integers(-128, 127),
    "d": st.one_of(st.integers(-(2**70), 2**70), st.floats(allow_nan=False, allow_infinity=False)),
    "f": st.one_of(st.integers(-(2**40), 2**40), st.floats(allow_nan=False, allow_infinity=False, width=32)),
    "b": st.booleans(),
    "name": st.text(max_size=8),
    "p": st.decimals(min_value=-999, max_value=999, places=2).map(float),
}
ANY = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False), st.text(max_size=4)),
    lambda inner: st.one_of(st.lists(inner, max_size=2), st.dictionaries(st.text(max_size=3), inner, max_size=2)),
    max_leaves=4,
)
"""Any JSON value: of another kind than a column's, or an extra key's."""


@st.composite
def values(draw) -> bytes:
    """A record value: mostly a JSON object of the columns, each of its kind, another one,
    null or missing; a weight or none; then, sometimes, broken on purpose."""
    record = {}
    # Half the objects hold only values of their columns' kinds (the decimal null), so that
    # the breaks below fall on records the JVM would otherwise take.
    clean = draw(st.booleans())
    for name, kind in KINDS.items():
        forms = (
            ["kind", "null"] if clean and name != "p" else ["null"] if clean else ["kind", "null", "other", "missing"]
        )
        form = draw(st.sampled_from(forms))
        if form != "missing":
            record[name] = {"kind": lambda k=kind: draw(k), "null": lambda: None, "other": lambda: draw(ANY)}[form]()
    if draw(st.booleans()):
        weights = st.integers(-3, 3) if clean else st.one_of(st.integers(-(2**70), 2**70), ANY)
        record[WEIGHT] = draw(weights)
    taken = draw(st.integers(0, 12))
    if draw(st.integers(0, 4)) == 0:
        record[draw(st.text(max_size=3))] = draw(ANY)
    text = json.dumps(record, allow_nan=True, separators=draw(st.sampled_from([(",", ":"), (", ", ": ")])))
    broken = taken if taken < 8 else 0
    if broken == 1:
        text += draw(st.sampled_from([" x", " {}", "}", ",", "  \n", "\t", "\x00", "[]"]))
    elif broken == 2 and len(record) > 1:
        key = draw(st.sampled_from(sorted(record)))
        text = "{" + json.dumps(key) + ": " + json.dumps(draw(ANY)) + ", " + text[1:]  # a duplicate key, first
    elif broken == 3:
        text = text[: draw(st.integers(0, len(text)))]
    elif broken == 4:
        text = draw(st.sampled_from(["[" + text + "]", "null", "1", '"x"', "NaN", ""]))
    elif broken == 5:
        text = text.replace(": 1", ": 01").replace(":1", ":01").replace("0.", "0.e")
    elif broken == 6:
        return text.encode() + draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80"]))
    elif broken == 7:
        text = text.replace('"', "'", 2)
    return text.encode("utf-8", errors="surrogatepass")


def compared(spark, batch: list[bytes]) -> list[tuple]:
    """Per value: the JVM's row (or None), Python's (weight, reason), and the row Spark's
    ``from_json`` reads from the text Python hands on (None where Python refused it)."""
    name, text = _decoder(spark, SCHEMA)
    python = [decode(v, FIELDS) for v in batch]
    handed = [
        (v.decode("utf-8", errors="replace") if t is None else t) if r is None else None
        for v, (_, t, r) in zip(batch, python)
    ]
    schema = T.StructType(
        [T.StructField("i", T.IntegerType()), T.StructField("v", T.BinaryType()), T.StructField("t", T.StringType())]
    )
    frame = spark.createDataFrame(list(zip(range(len(batch)), batch, handed)), schema)
    got = frame.select(
        "i",
        F.call_function(name, "v", F.lit(text)).alias("jvm"),
        F.from_json("t", SCHEMA, {"mode": "FAILFAST"}).alias("py"),
    ).collect()
    by_index = {r.i: r for r in got}
    return [(by_index[i].jvm, python[i][0], python[i][2], by_index[i].py) for i in range(len(batch))]


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(batch=st.lists(values(), min_size=1, max_size=40))
def test_every_row_the_jvm_decodes_is_the_row_python_gives(spark, batch):
    results = compared(spark, batch)
    for value, (jvm, weight, reason, py) in zip(batch, results):
        if jvm is not None:
            assert reason is None, (value, reason, jvm)
            assert jvm[WEIGHT] == weight, value
            assert tuple(jvm)[:-1] == tuple(py), value


def test_the_jvm_takes_valid_records_of_plain_columns(spark):
    valid = [
        b'{"l": 9223372036854775807, "i": -2147483648, "s": 300, "t": -128, "d": 1e400, "f": 0.5, "b": true, '
        b'"name": "\\u00e9\\ud83d\\ude00", "p": null}',
        b' {"p": null, "name": "", "b": false, "f": -3, "d": 2, "t": 0, "s": -0, "i": 7, "l": 1, "extra": [{"x": 1}]}\n',
        b'{"l": null, "i": null, "s": null, "t": null, "d": null, "f": null, "b": null, "name": null, "p": null, "_weight": -2}',
        b'{"l":-0,"i":12,"s":-7,"t":0,"d":-1.5e-3,"f":null,"b":false,"name":"plain ascii","p":null,"_weight":3}',
    ]
    rows = compared(spark, valid)
    assert [jvm is not None for jvm, *_ in rows] == [True] * len(valid)
    assert [jvm[WEIGHT] for jvm, *_ in rows] == [1, 1, -2, 3]
    # What only Python can judge is left to it: a decimal's value, a duplicate key, text after the object.
    left = [b'{"l": 1, "i": 1, "s": 1, "t": 1, "d": 1, "f": 1, "b": true, "name": "x", "p": 1.5}']
    left += [
        b'{"l": 1, "l": 2}',
        b'{"l": 1, "i": 1, "s": 1, "t": 1, "d": 1, "f": 1, "b": true, "name": "x", "p": null} x',
    ]
    assert [jvm for jvm, *_ in compared(spark, left)] == [None, None, None]
