"""A pipeline defined by a file of SQL views (``sql:`` in dbsp.yaml): what fails when the
configuration loads, and a view reading a view served by Dagster, equal at every step to
Spark batch SQL of the same text over everything produced."""

import os
from collections import Counter

import pytest
from dagster import AssetKey, instance_for_test

from circuits.library.nexmark import SCHEMAS
from circuits.library.nexmark_queries import NEXMARK_SQL
from circuits.sql import batch_views
from dagster_project.config import ConfigError, load_project, parse_project

from .harness import Harness, integral, project_settings, sql_harness

VIEWS = """\
-- Bids with their auction's category: shared, not published.
CREATE TEMPORARY VIEW priced AS
SELECT b.auction, b.price, a.category FROM bids b JOIN auctions a ON b.auction = a.id;

CREATE MATERIALIZED VIEW revenue AS
SELECT category, sum(price) AS revenue, count(*) AS bids FROM priced GROUP BY category;

-- A view reading a view.
CREATE MATERIALIZED VIEW busy AS
SELECT category, revenue FROM revenue WHERE bids > 5;

CREATE MATERIALIZED VIEW sellers AS
SELECT p.state, count(DISTINCT a.id) AS auctions FROM persons p JOIN auctions a ON a.seller = p.id GROUP BY p.state;
"""


def sql_settings(tmp_path, text: str = VIEWS, **change) -> dict:
    (tmp_path / "views.sql").write_text(text)
    settings = project_settings(str(tmp_path / "store"), "localhost:1", "sqlp")
    pipeline = settings["pipelines"][0]
    del pipeline["circuit"], pipeline["sinks"]
    pipeline.update({"sql": "views.sql", "producer": "circuits.library.nexmark:nexmark_records", **change})
    return settings


def load(tmp_path, settings: dict):
    """The project, as loaded from a dbsp.yaml in ``tmp_path`` (paths relative to it)."""
    return parse_project(settings, "dbsp.yaml", base=str(tmp_path))


def test_sinks_default_to_the_materialized_views_and_the_path_is_relative_to_the_file(tmp_path):
    spec = load(tmp_path, sql_settings(tmp_path)).pipelines[0]
    assert spec.sql == str(tmp_path / "views.sql")
    assert spec.sink_names == ["revenue", "busy", "sellers"]  # not the temporary view
    assert spec.view_reads("busy") == ["revenue"] and spec.view_reads("revenue") == []  # priced is not published
    assert spec.view_sql("busy") == "SELECT category, revenue FROM revenue WHERE bids > 5"


def test_the_built_in_demo_pipeline_is_the_nexmark_sql_file(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # no dbsp.yaml here
    monkeypatch.delenv("DBSP_CONFIG", raising=False)
    spec = load_project().pipelines[0]
    assert spec.circuit is None and spec.sql == str(NEXMARK_SQL)
    assert spec.sink_names == ["bids_by_category", "q3", "q4", "q15"]
    assert spec.view_sql("q4") == "SELECT category, avg(final) AS avg_final FROM finals GROUP BY category"


@pytest.mark.parametrize(
    "text, change, named",
    [
        (VIEWS, {"circuit": "circuits.library.nexmark_queries:revenue_circuit"}, ["circuit, sql: give exactly one"]),
        (
            VIEWS.replace("FROM priced GROUP", "FROM priced GRUP BY"),
            {},
            ["pipelines.0.sql", "views.sql:6", "syntax error"],
        ),
        (
            VIEWS.replace("FROM revenue WHERE", "FROM revenu WHERE"),
            {},
            ["views.sql:9, view 'busy'", "['revenu']", "sources are"],
        ),
        (
            VIEWS + "CREATE MATERIALIZED VIEW busy AS SELECT 1 AS x FROM bids;\n",
            {},
            ["views.sql:14, view 'busy'", "a second view"],
        ),
        (
            VIEWS.replace("FROM priced GROUP", "FROM busy GROUP"),
            {},
            ["view 'revenue'", "cycle (revenue -> busy -> revenue)"],
        ),
        (
            VIEWS.replace("GROUP BY p.state", "GROUP BY p.state LIMIT 3"),
            {},
            ["views.sql:13, view 'sellers'", "LIMIT"],
        ),
        (
            VIEWS,
            {"schemas": {"bids": "auction BIGINT, price"}},
            ["pipelines.0.schemas", "bids: 'auction BIGINT, price'", "'price' has no type"],
        ),
        (
            VIEWS,
            {"schemas": {**SCHEMAS, "bids": SCHEMAS["bids"].replace("channel string", "channel BINARY")}},
            ["pipelines.0", "schemas: input 'bids'", "column 'channel' has type binary", "decimal(p,s), string"],
        ),
        (VIEWS, {"producer": None}, ["schemas: give the Spark DDL schema of ['auctions', 'bids', 'persons']"]),
        (VIEWS, {"sources": {"bids": "t.bids", "auctions": "t.auctions"}}, ["view 'sellers'", "['persons']"]),
    ],
)
def test_a_views_file_that_does_not_load_fails_the_configuration(tmp_path, text, change, named):
    with pytest.raises(ConfigError) as error:
        load(tmp_path, sql_settings(tmp_path, text, **change))
    for part in named:
        assert part in str(error.value)
    assert not os.path.exists(tmp_path / "store")  # nothing written


def test_an_unknown_column_fails_the_configuration_when_spark_is_there(spark, tmp_path):
    with pytest.raises(ConfigError) as error:
        load(tmp_path, sql_settings(tmp_path, VIEWS.replace("sum(price)", "sum(prize)")))
    # Line 6 holds sum(prize): the error names the line at fault, not the view's first line (5).
    assert "views.sql:6, view 'revenue'" in str(error.value) and "prize" in str(error.value)


def test_a_schemas_entry_is_the_sources_schema(spark, tmp_path):
    schemas = {**SCHEMAS, "bids": "auction BIGINT, price DOUBLE"}
    spec = load(tmp_path, sql_settings(tmp_path, schemas=schemas)).pipelines[0]
    assert spec.circuit_def.inputs["bids"].fieldNames() == ["auction", "price"]


@pytest.fixture
def instance():
    with instance_for_test() as instance:
        yield instance


def produced(spark, h: Harness) -> dict:
    """Everything produced so far, per input: each row as many times as its summed weight."""
    tables = {}
    for handle, rows in h.produced.items():
        schema = h.spec.circuit_def.inputs[handle]
        bag = Counter()
        for row in rows:
            bag[tuple(row[c] for c in schema.fieldNames())] += row.get("_weight", 1)
        tables[handle] = spark.createDataFrame([r for r, w in bag.items() for _ in range(w)], schema)
    return tables


@pytest.mark.slow
def test_a_sql_pipeline_through_dagster_equals_spark_batch_sql_with_lineage(
    spark_resource, spark, broker, tmp_path, instance
):
    h = sql_harness(
        tmp_path, broker.bootstrap, instance, spark_resource, VIEWS, producer="circuits.library.nexmark:nexmark_records"
    )
    graph = h.defs.resolve_asset_graph()
    key = {name: AssetKey([h.name, name]) for name in ("revenue", "busy", "sellers")}
    assert graph.get(key["busy"]).parent_keys == {key["revenue"]}
    assert not graph.get(key["revenue"]).parent_keys and not graph.get(key["sellers"]).parent_keys
    busy = graph.get(key["busy"])
    assert "SELECT category, revenue FROM revenue WHERE bids > 5" in busy.description
    assert busy.metadata["sql"].value == "```sql\nSELECT category, revenue FROM revenue WHERE bids > 5\n```"
    for count, deletes in ((400, 0), (300, 40)):
        h.produce(count, deletes)
        run = h.run(int(h.tick().run_requests[0].partition_key))
        assert run.success
        pipeline = h.pipeline(spark)
        expected = batch_views(spark, VIEWS, produced(spark, h))
        for name in key:
            got = integral(pipeline.outputs.read(name, 0, 10**9))
            assert got == Counter(tuple(r) for r in expected[name].collect()), name
            assert got, f"{name} is empty: the check would be vacuous"
