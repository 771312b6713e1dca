"""A value that makes a view's expression fail is its record's error, not the pipeline's:
the record is dead-lettered with the view, file, line and expression, and the step goes
on without it.  Oracle: Spark batch SQL of each view's text over the inputs minus the
dead-lettered records, at every step, at 1 and 2 workers, across a crash and restart."""

from __future__ import annotations

import json
import re
from collections import Counter

import pyarrow as pa
import pytest
from deltalake import write_deltalake
from pyspark.sql import types as T

from circuits.errors import RecordError
from circuits.sql import compile_sql, parse_views
from storage.delta import arrow_schema
from storage.faults import InjectedCrash
from storage.logs import DEAD_LETTER_SCHEMA, Range, dead_letters_uri
from storage.pipeline import Pipeline

from ..circuits.harness import failing_at, inputs_of, logged_rows
from ..oracle import add_into, zset

SCHEMAS = {"orders": "id bigint, cid bigint, ts string, qty int", "customers": "id bigint, name string"}
VIEWS = """CREATE MATERIALIZED VIEW daily AS
SELECT to_date(ts) AS day, count(*) AS n, sum(qty) AS q
FROM orders
GROUP BY to_date(ts);

CREATE MATERIALIZED VIEW per_unit AS
SELECT id, 100 / qty AS share FROM orders WHERE qty IS NOT NULL;

CREATE MATERIALIZED VIEW coded AS
SELECT o.id, c.code
FROM orders o JOIN (SELECT id, CAST(name AS INT) AS code FROM customers) c ON o.cid = c.id;
"""
STEPS = [
    {
        "orders": [(1, 10, "2024-01-01", 2, 1), (2, 10, "yesterday", 1, 1), (3, 11, "2024-01-02", 0, 1)],
        "customers": [(10, "7", 1), (11, "x", 1)],
    },
    {"orders": [(4, 11, "2024-01-03", 5, 1), (1, 10, "2024-01-01", 2, -1)], "customers": [(12, "12", 1)]},
    {"orders": [(5, 12, "tomorrow", 1, 1), (4, 11, "2024-01-03", 5, -1)], "customers": [(11, "x", -1)]},
]
DEAD = {
    0: {("orders", 2): "daily", ("orders", 3): "per_unit", ("customers", 11): "coded"},
    1: {},
    2: {("orders", 5): "daily", ("customers", 11): "coded"},
}
"""Per step, the records dead-lettered ((input, id) -> the view whose expression fails)."""
OLD_DEAD_LETTERS = T.StructType([*DEAD_LETTER_SCHEMA.fields, T.StructField("_step", T.LongType())])
"""The dead-letter table's columns before records that fail an expression were dead-lettered."""
EXPRESSIONS = {"daily": ("to_date(ts)", 4), "per_unit": ("100 / qty", 7), "coded": ("CAST(name AS INT)", 11)}


def batch(spark, text: str, schemas: dict, integrated: dict[str, Counter]) -> dict[str, Counter]:
    """Spark batch SQL of each materialized view's text over ``integrated``."""
    for name, schema in schemas.items():
        rows = [row for row, w in integrated[name].items() for _ in range(w)]
        spark.createDataFrame(rows, schema).createOrReplaceTempView(name)
    return {v.name: zset((*r, 1) for r in spark.sql(v.text).collect()) for v in parse_views(text) if v.materialized}


def dead_lettered(pipeline: Pipeline, step: int) -> list[dict]:
    return [r.asDict() for r in pipeline.inputs.dead_letters().where(f"_step = {step}").collect()]


def admitted(step: dict, dead: list[dict], schemas: dict) -> dict[str, Counter]:
    """The step's records minus the dead-lettered ones, as Z-sets."""
    out = {name: zset(step.get(name, [])) for name in schemas}
    for letter in dead:
        row = json.loads(letter["value"])
        names = [f.split()[0] for f in schemas[letter["input"]].split(", ")]
        add_into(out[letter["input"]], Counter({tuple(row[n] for n in names): -row["_weight"]}))
    return out


@pytest.mark.parametrize("workers", [1, 2])
def test_bad_values_are_dead_lettered_and_the_views_equal_batch_sql_over_the_rest(spark, tmp_path, workers):
    circuit = compile_sql(VIEWS, SCHEMAS, spark, file="shop.sql")
    root = str(tmp_path)
    pipeline = Pipeline(spark, root, circuit, workers=workers)
    integrated = {name: Counter() for name in SCHEMAS}
    outputs = {name: Counter() for name in circuit.outputs}
    for t, step in enumerate(STEPS):
        pipeline.submit(t, inputs_of(spark, circuit, step), [Range("steps", 0, t, t + 1)])
        if t == 1:  # dies after the step's output, before its checkpoint: the restart replays it
            with failing_at("after_output", t), pytest.raises(InjectedCrash):
                pipeline.run(through=t)
            pipeline = Pipeline(spark, root, circuit, workers=workers)
        pipeline.run(through=t)
        dead = dead_lettered(pipeline, t)
        got = {(d["input"], json.loads(d["value"])["id"]): d["view"] for d in dead}
        assert got == DEAD[t], f"step {t}: dead letters {dead}"
        for d in dead:
            expression, line = EXPRESSIONS[d["view"]]
            assert (d["file"], d["line"], d["expression"]) == ("shop.sql", line, expression), d
            assert d["reason"].startswith(f"view {d['view']!r} (shop.sql:{line}), {expression}: ["), d["reason"]
            assert not re.search(r"\bc\d+\b", d["reason"]), f"an internal column in {d['reason']!r}"
        for name, delta in admitted(step, dead, SCHEMAS).items():
            add_into(integrated[name], delta)
        want = batch(spark, VIEWS, SCHEMAS, integrated)
        for name in circuit.outputs:
            add_into(outputs[name], zset(logged_rows(pipeline, name, t)))
            assert outputs[name] == want[name], f"step {t}, view {name}: {outputs[name]} != {want[name]}"


def test_an_error_no_single_record_causes_fails_the_step_naming_the_view_until_the_record_is_quarantined(
    spark, tmp_path
):
    """A division by a value of the other side of a join fails on the joined row: no one
    record is its cause, so the step fails, naming what the user wrote; once a record is
    quarantined, the step goes on without it."""
    views = "CREATE MATERIALIZED VIEW spread AS\nSELECT o.id, o.qty / c.id AS r\nFROM orders o JOIN customers c ON o.cid = c.id;\n"
    pipeline = Pipeline(spark, str(tmp_path), compile_sql(views, SCHEMAS, spark, file="spread.sql"))
    step = {"orders": [(1, 0, "2024-01-01", 3, 1)], "customers": [(0, "zero", 1)]}
    pipeline.submit(0, inputs_of(spark, pipeline.circuit, step), [Range("steps", 0, 0, 1)])
    with pytest.raises(RecordError) as raised:
        pipeline.run(through=0)
    message = str(raised.value)
    assert "view 'spread' (spread.sql:2), expression o.qty / c.id failed" in message, message
    assert "DIVIDE_BY_ZERO" in message and "dbsp quarantine" in message, message
    assert not re.search(r"\bc\d+\b", message), f"an internal column in {message!r}"

    pipeline.quarantine(0, "customers", {"id": 0, "name": "zero", "_weight": 1})
    assert pipeline.run(through=0) == 1
    assert logged_rows(pipeline, "spread", 0) == []
    (letter,) = dead_lettered(pipeline, 0)
    assert (letter["input"], json.loads(letter["value"])) == ("customers", {"id": 0, "name": "zero", "_weight": 1})


def test_a_sum_over_strings_dead_letters_a_value_that_is_no_number(spark, tmp_path):
    """``sum`` of a STRING column casts each value to a double, as Spark does: a value that
    is no number is its record's error, and the sum is Spark's over the others."""
    views = "CREATE MATERIALIZED VIEW totals AS\nSELECT count(*) AS n, sum(name) AS total FROM customers;\n"
    pipeline = Pipeline(spark, str(tmp_path), compile_sql(views, SCHEMAS, spark, file="totals.sql"))
    step = {"customers": [(1, "2.5", 1), (2, "x", 1), (3, "4", 1)]}
    pipeline.submit(0, inputs_of(spark, pipeline.circuit, step), [Range("steps", 0, 0, 1)])
    pipeline.run(through=0)
    dead = dead_lettered(pipeline, 0)
    assert [(d["expression"], d["line"], json.loads(d["value"])["id"]) for d in dead] == [("sum(name)", 2, 2)], dead
    integrated = admitted(step, dead, SCHEMAS)
    assert zset(logged_rows(pipeline, "totals", 0)) == batch(spark, views, SCHEMAS, integrated)["totals"]


def test_a_dead_letter_table_from_before_the_record_fields_still_takes_them(spark, tmp_path):
    """A pipeline whose ``_dead_letters`` has only the decoding columns opens, and a record
    that makes an expression fail is dead-lettered there with a reason naming it all."""
    write_deltalake(
        dead_letters_uri(str(tmp_path)), pa.Table.from_pylist([], schema=arrow_schema(OLD_DEAD_LETTERS)), mode="append"
    )
    views = "CREATE MATERIALIZED VIEW codes AS\nSELECT id, CAST(name AS INT) AS code FROM customers;\n"
    pipeline = Pipeline(spark, str(tmp_path), compile_sql(views, SCHEMAS, spark, file="codes.sql"))
    step = {"customers": [(1, "7", 1), (2, "x", 1)]}
    pipeline.submit(0, inputs_of(spark, pipeline.circuit, step), [Range("steps", 0, 0, 1)])
    pipeline.run(through=0)
    (letter,) = dead_lettered(pipeline, 0)
    assert letter["reason"].startswith("view 'codes' (codes.sql:2), CAST(name AS INT): [CAST_INVALID_INPUT]"), letter
    assert letter["input"] is None  # the old table has no such column
    assert zset(logged_rows(pipeline, "codes", 0)) == Counter({(1, 7): 1})
