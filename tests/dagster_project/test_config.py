"""The code location loads, and bad configuration fails with the field and the fix named."""

from pathlib import Path

import pytest

from dagster_project.config import ConfigError, load_project, parse_project
from dagster_project.resources import build_resources

from .harness import project_settings, python_without_spark

PROJECT = Path(__file__).resolve().parents[2]


def test_default_code_location_serves_the_demo_pipeline(spark):
    from dagster_project.definitions import defs

    keys = {"/".join(k.path) for k in defs.resolve_asset_graph().get_all_asset_keys()}
    assert keys == {"nexmark/bids_by_category", "nexmark/q3", "nexmark/q4", "nexmark/q15", "nexmark/layout"}
    assert defs.resolve_sensor_def("nexmark_kafka_offsets")
    for job in ("step_job", "rescale", "compact", "vacuum", "recover", "status", "produce"):
        assert defs.resolve_job_def(f"nexmark_{job}")


def binary_input():
    """A circuit over the demo's inputs whose ``bids`` has a column JSON cannot carry (BINARY)."""
    from circuits.circuit import Circuit

    circuit = Circuit("binary")
    circuit.input("persons", "id bigint")
    circuit.input("auctions", "id bigint")
    circuit.input("bids", "auction bigint, raw binary").output("bids_by_category")
    return circuit


@pytest.mark.parametrize(
    "change, named",
    [
        ({"max_records_per_step": 0}, ["pipelines.0.max_records_per_step", "greater than 0", "at most this many"]),
        ({"circuit": "no_such_module:circuit"}, ["pipelines.0.circuit", "cannot import", "package.module:function"]),
        ({"sources": {"clicks": "t"}}, ["sources", "give a topic for", "bids"]),
        ({"sinks": ["q9"]}, ["sinks", "q9", "not outputs of the circuit"]),
        ({"bags": ["q9"]}, ["bags", "not sinks"]),
        (
            {"sinks": [{"name": "bids_by_category", "current": "maybe"}]},
            ["pipelines.0.sinks.0.current", "valid boolean", "views/<sink>"],
        ),
        ({"name": "Bad-Name"}, ["pipelines.0.name", "identifier"]),
        ({"max_dead_letter_share": 1.5}, ["pipelines.0.max_dead_letter_share", "less than or equal to 1"]),
        (
            {"circuit": "tests.dagster_project.test_config:binary_input"},
            ["circuit: input 'bids'", "column 'raw' has type binary", "declare it as one of tinyint"],
        ),
        ({"workerz": 3}, ["pipelines.0.workerz", "xtra", "did you mean 'workers'?"]),
        (
            {"sinks": [{"name": "bids_by_category", "curent": False}]},
            ["pipelines.0.sinks.0.curent", "did you mean 'current'?"],
        ),
    ],
)
def test_a_bad_pipeline_setting_is_named_with_its_fix(spark, change, named):
    settings = project_settings("/tmp/x", "localhost:1", "good")
    settings["pipelines"][0].update(change)
    with pytest.raises(ConfigError) as error:
        parse_project(settings, "dbsp.yaml")
    for text in named:
        assert text in str(error.value)


@pytest.mark.parametrize(
    "resources, named",
    [
        (
            {"kafka": {"embedded_port": "x"}},
            [
                "resources.kafka.embedded_port",
                "(expected: port of the embedded broker (its controller takes the next port))",
            ],
        ),
        ({"store": {"root": "gs://bucket/pipelines"}}, ["resources.store.root", "not gs://", "mount"]),
        ({"store": {"root": "s3:///pipelines"}}, ["resources.store.root", "name the bucket"]),
        ({"store": {"root": "s3://b/p", "endpoint": "minio:9000"}}, ["resources.store.endpoint", "http://host:port"]),
        ({"store": {"root": "s3://b/p", "access_key_id": "k"}}, ["access_key_id and secret_access_key", "both"]),
        # Misspelled, each would fall back to its default (another user's port, say).
        ({"spark": {"embeded_port": 15202}}, ["resources.spark.embeded_port", "did you mean 'embedded_port'?"]),
        (
            {"kafka": {"bootstrap_server": "k:9092"}},
            ["resources.kafka.bootstrap_server", "did you mean 'bootstrap_servers'?"],
        ),
        ({"store": {"rot": "/data"}}, ["resources.store.rot", "did you mean 'root'?"]),
        ({"sprak": {}}, ["resources.sprak", "did you mean 'spark'?"]),
    ],
)
def test_a_bad_resource_setting_is_named(spark, resources, named):
    settings = project_settings("/tmp/x", "localhost:1", "good")
    settings["resources"] = resources
    with pytest.raises(ConfigError) as error:
        build_resources(parse_project(settings, "my.yaml"))
    assert str(error.value).startswith("my.yaml: resources."), error.value
    for text in named:
        assert text in str(error.value)


def test_a_yaml_error_names_the_file_given(tmp_path, monkeypatch):
    monkeypatch.setenv("DBSP_CONFIG", str(tmp_path / "other.yaml"))
    path = tmp_path / "given.yaml"
    path.write_text("pipelines: [\n")
    with pytest.raises(ConfigError) as error:
        load_project(str(path))
    assert str(error.value).startswith(f"{path}: cannot read") and "DBSP_CONFIG" not in str(error.value)


# A process without Spark, as a code server is when it loads the definitions.
UNKNOWN_SINK = """
import sys
from dagster_project.config import ConfigError, parse_project
from pyspark import SparkContext
settings = {"pipelines": [{"name": "wc", "circuit": "circuits.library:word_count",
                           "sources": {"upper": "a", "lower": "b"}, "sinks": ["totalz"]}]}
try:
    parse_project(settings, "dbsp.yaml")
except ConfigError as e:
    print(e)
assert SparkContext._active_spark_context is None
"""


def test_an_unknown_sink_fails_when_the_configuration_loads_without_spark():
    out = python_without_spark(UNKNOWN_SINK)
    assert "sinks: ['totalz'] are not outputs of the circuit; its outputs are ['totals']" in out, out


MISSING_COMMA = """
import sys
from dagster_project.config import ConfigError, parse_project
settings = {"pipelines": [{"name": "shop", "sql": sys.argv[1], "sources": {"customers": "c"},
                           "schemas": {"customers": "id BIGINT name STRING, country STRING"}}]}
try:
    parse_project(settings, "dbsp.yaml")
except ConfigError as e:
    print(e)
"""


def test_a_missing_comma_in_a_schema_is_blamed_on_the_schema_when_loading_without_spark(tmp_path):
    sql = tmp_path / "shop.sql"
    sql.write_text("CREATE MATERIALIZED VIEW named AS SELECT id, name FROM customers;\n")
    out = python_without_spark(MISSING_COMMA, str(sql))
    assert "pipelines.0.schemas: customers: 'id BIGINT name STRING, country STRING' is not a Spark DDL schema" in out
    assert "'id BIGINT name STRING' is two columns: a comma is missing" in out and "shop.sql" not in out, out


def test_the_example_configuration_is_valid(spark):
    project = load_project("dbsp.example.yaml")
    assert [p.name for p in project.pipelines] == ["nexmark", "revenue"]
    assert [g.kind for g in project.sources] == ["files", "tcp"]
    build_resources(project)
    for spec in project.pipelines:
        assert spec.circuit_def  # sources and sinks match the circuits


@pytest.mark.parametrize(
    "change, named",
    [
        (
            {"sources": [{"kind": "files", "name": "in", "topic": "nope", "directory": "/d"}]},
            ["sources.0.topic", "no pipeline's input topic", "good.bids"],
        ),
        (
            {"sources": [{"kind": "udp", "name": "in", "topic": "good.bids"}]},
            ["sources.0", "'udp'", "'files', 'tcp', 'http', 'generator'"],
        ),
        ({"sources": [{"kind": "tcp", "name": "in", "topic": "good.bids"}]}, ["sources.0.tcp.port", "Field required"]),
        ({"gateway": {"buffers": 1}}, ["gateway.buffers", "greater than 1"]),
    ],
)
def test_a_bad_gateway_setting_is_named(spark, change, named):
    settings = project_settings("/tmp/x", "localhost:1", "good") | change
    with pytest.raises(ConfigError) as error:
        parse_project(settings, "dbsp.yaml")
    for text in named:
        assert text in str(error.value)


def _delta_project(tmp_path, sources: dict) -> dict:
    (tmp_path / "views.sql").write_text("CREATE MATERIALIZED VIEW n AS SELECT a.k, count(*) AS c FROM a GROUP BY a.k;")
    schemas = {h: "k INT" for h in sources}
    return {"pipelines": [{"name": "p", "sql": "views.sql", "sources": sources, "schemas": schemas}]}


def test_a_delta_table_source_is_its_path_made_absolute(tmp_path):
    settings = _delta_project(tmp_path, {"a": "delta:tables/a"})
    spec = parse_project(settings, "dbsp.yaml", base=str(tmp_path)).pipelines[0]
    assert spec.tables == {"a": f"delta:{tmp_path}/tables/a"} and spec.topics == {}
    settings = _delta_project(tmp_path, {"a": "delta:s3a://lake/tables/a"})  # an object store's: as it is, s3://
    assert parse_project(settings, "dbsp.yaml", base=str(tmp_path)).pipelines[0].tables == {
        "a": "delta:s3://lake/tables/a"
    }


def test_the_sensor_is_named_for_what_it_watches(tmp_path):
    """Tables only: their versions; a topic among the inputs: the topics' offsets."""
    for sources, name in (({"a": "delta:a"}, "p_delta_versions"), ({"a": "delta:a", "b": "b"}, "p_kafka_offsets")):
        settings = _delta_project(tmp_path, sources)
        (tmp_path / "views.sql").write_text(
            f"CREATE MATERIALIZED VIEW n AS SELECT k, count(*) AS c FROM ({' UNION ALL '.join(f'SELECT k FROM {h}' for h in sources)}) GROUP BY k;"
        )
        spec = parse_project(settings, "dbsp.yaml", base=str(tmp_path)).pipelines[0]
        assert spec.sensor_name == name


@pytest.mark.parametrize(
    "source, named",
    [
        ("delta:", ["pipelines.0.sources", "names no table", "delta:/path/to/table"]),
        ("delta:gs://bucket/a", ["pipelines.0.sources", "not gs://", "mount path"]),
        ("a topic", ["pipelines.0.sources", "neither a Kafka topic", "delta:/path/to/table"]),
        ("view:q", ["pipelines.0.sources", "names no view", "view:<pipeline>.<view>"]),
        ("table:shop.orders;drop", ["pipelines.0.sources", "names no table", "table:<schema>.<name>"]),
        ("table:", ["pipelines.0.sources", "names no table", "table:<schema>.<name>"]),
    ],
)
def test_a_bad_source_names_the_field_and_the_fix(tmp_path, source, named):
    with pytest.raises(ConfigError) as raised:
        parse_project(_delta_project(tmp_path, {"a": source}), "dbsp.yaml", base=str(tmp_path))
    assert all(part in str(raised.value) for part in named), str(raised.value)


def test_a_table_named_in_the_catalog_is_a_delta_input(tmp_path):
    spec = parse_project(_delta_project(tmp_path, {"a": "table:cat.shop.orders"}), "x", base=str(tmp_path)).pipelines[0]
    assert (
        spec.tables == {"a": "table:cat.shop.orders"} and spec.topics == {} and spec.sensor_name == "p_delta_versions"
    )


def _chained(tmp_path, up_sources: dict, down_source: str) -> dict:
    """Pipeline ``p`` of :func:`_delta_project` (sink ``n``), and ``q``, which reads ``down_source``."""
    settings = _delta_project(tmp_path, up_sources)
    (tmp_path / "q.sql").write_text("CREATE MATERIALIZED VIEW m AS SELECT c, count(*) AS k FROM t GROUP BY c;")
    q = {"name": "q", "sql": "q.sql", "sources": {"t": down_source}, "schemas": {"t": "k INT, c BIGINT"}}
    return {"pipelines": [*settings["pipelines"], q]}


def test_a_view_of_another_pipeline_is_an_input_watched_by_delta_versions(tmp_path):
    project = parse_project(_chained(tmp_path, {"a": "delta:a"}, "view:p.n"), "dbsp.yaml", base=str(tmp_path))
    q = project.pipelines[1]
    assert q.upstream == {"t": "view:p.n"} and q.topics == {} and q.sensor_name == "q_delta_versions"


@pytest.mark.parametrize(
    "up_sources, source, named",
    [
        ({"a": "delta:a"}, "view:r.n", ["pipelines.1.sources.t", "'r' is no other pipeline", "['p']"]),
        ({"a": "delta:a"}, "view:q.m", ["pipelines.1.sources.t", "'q' is no other pipeline"]),
        ({"a": "delta:a"}, "view:p.m", ["pipelines.1.sources.t", "'m' is no sink of pipeline 'p'", "['n']"]),
        ({"a": "view:q.m"}, "view:p.n", ["'p' reads its own views (p reads view:q.m, q reads view:p.n)", "cycle"]),
    ],
)
def test_a_view_source_names_a_sink_of_another_pipeline_without_a_cycle(tmp_path, up_sources, source, named):
    with pytest.raises(ConfigError) as raised:
        parse_project(_chained(tmp_path, up_sources, source), "dbsp.yaml", base=str(tmp_path))
    assert all(part in str(raised.value) for part in named), str(raised.value)
