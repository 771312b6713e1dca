"""A pipeline whose input is a Delta table, served by Dagster: the offset sensor cuts the
table's versions into steps (at most ``max_records_per_step`` versions each) and requests
their runs, and after every run the view equals Spark batch SQL over the table as of the
step's last version.  A second pipeline that reads the first's view (``view:up.totals``)
is cut as the first commits, and equals Spark batch SQL over the first's view."""

import shutil
import uuid
from collections import Counter

import pytest
from dagster import AssetKey, instance_for_test
from pyspark.sql import types as T

from circuits.sql import batch_views
from dagster_project.config import parse_project
from dagster_project.demo_producer import create_change_fed
from dagster_project.factory import build_definitions
from dagster_project.status import status_text
from sensors.division import DivisionPolicy, cut_next
from sensors.errors import InputColumnsChangedError, TableRewrittenError
from sensors.status import report
from storage import location
from storage.logs import DivisionLog, Range
from storage.pipeline import Pipeline

from ..s3 import ACCESS_KEY, SECRET_KEY, s3_server
from .harness import integral, tick

VIEWS = "CREATE MATERIALIZED VIEW totals AS SELECT k, count(*) AS n, sum(v) AS total FROM a GROUP BY k;\n"


def change_fed_table(spark, table: str) -> str:
    """An empty Delta table ``(k INT, v INT)`` with the change data feed on, at ``table``
    (a path or an ``s3://`` URI, reached as this process reaches its bucket)."""
    create_change_fed(spark, table, "k INT, v INT")
    return table


@pytest.fixture(params=["local", "s3"])
def where(request, tmp_path) -> tuple[str, dict]:
    """Where the source table lives (a local path, or a bucket of an S3-compatible server)
    and the store's settings (on that server too for S3)."""
    if request.param == "local":
        yield str(tmp_path / "a"), {"root": str(tmp_path / "store")}
        return
    with s3_server() as s3:
        bucket = s3.bucket()
        s3.reach(f"s3://{bucket}/tables/a")
        keys = {"access_key_id": ACCESS_KEY, "secret_access_key": SECRET_KEY}
        yield f"s3://{bucket}/tables/a", {"root": f"s3://{bucket}/store", "endpoint": s3.endpoint, **keys}


@pytest.mark.slow
def test_the_sensor_cuts_a_delta_tables_versions_into_steps_whose_runs_equal_spark_batch_sql(
    spark_resource, spark, tmp_path, where
):
    table, store = where
    table = change_fed_table(spark, table)
    (tmp_path / "views.sql").write_text(VIEWS)
    pipeline = {"name": "dp", "sql": "views.sql", "sources": {"a": f"delta:{table}"}, "schemas": {"a": "k INT, v INT"}}
    settings = {
        "pipelines": [{**pipeline, "max_records_per_step": 2, "max_wait_seconds": 0, "sensor_running": False}],
        # No topics: the pipeline never asks this broker anything.
        "resources": {"store": store, "kafka": {"bootstrap_servers": "localhost:1"}},
    }
    settings["resources"]["spark"] = spark_resource
    project = parse_project(settings, "dbsp.yaml", base=str(tmp_path))
    spec, defs = project.pipelines[0], build_definitions(project)
    sensor, job = defs.resolve_sensor_def("dp_delta_versions"), defs.resolve_job_def("dp_step_job")
    root = defs.resources["store"].pipeline_root("dp")
    rounds = [
        ["INSERT INTO {t} VALUES (1, 1), (2, 2)"],
        ["UPDATE {t} SET v = v + 10 WHERE k = 1", "DELETE FROM {t} WHERE k = 2", "INSERT INTO {t} VALUES (1, 5)"],
    ]
    named = f"delta.`{location.spark_path(table)}`"
    with instance_for_test() as instance:
        for statements in rounds:
            for statement in statements:
                spark.sql(statement.format(t=named))
            for _ in range(4):  # one step a tick, of at most two versions
                tick_and_run(defs, sensor, job, instance)
            divisions = DivisionLog(root).all()
            assert all(sum(r.end - r.start for r in ranges) <= 2 for ranges in divisions.values())
            last = max(divisions)
            version = divisions[last][0].end - 1
            assert version == spark.sql(f"DESCRIBE HISTORY {named}").agg({"version": "max"}).first()[0]
            as_of = spark.read.format("delta").option("versionAsOf", version).load(location.spark_path(table))
            want = Counter(tuple(r) for r in batch_views(spark, VIEWS, {"a": as_of})["totals"].collect())
            got = integral(Pipeline(spark, root, spec.circuit_for(spark)).outputs.read("totals", 0, last))
            assert got == want and got


def tick_and_run(defs, sensor, job, instance) -> int:
    """One tick of ``sensor`` and the runs it requests, in process; returns how many ran."""
    result = tick(sensor, instance, defs.resources)
    for run in result.run_requests or []:
        assert job.execute_in_process(instance=instance, partition_key=run.partition_key).success
    return len(result.run_requests or [])


@pytest.mark.slow
def test_a_table_named_in_the_spark_catalog_is_found_once_and_a_name_moved_elsewhere_is_refused(
    spark_resource, spark, tmp_path
):
    schema = f"shop_{uuid.uuid4().hex[:8]}"
    spark.sql(f"CREATE SCHEMA {schema}")
    create = (
        f"CREATE TABLE {schema}.a (k INT, v INT) USING delta LOCATION '{{where}}' "
        "TBLPROPERTIES (delta.enableChangeDataFeed = true)"
    )
    spark.sql(create.format(where=tmp_path / "a"))
    (tmp_path / "views.sql").write_text(VIEWS)
    quick = {"max_wait_seconds": 0, "sensor_running": False, "sql": "views.sql", "schemas": {"a": "k INT, v INT"}}
    settings = {
        "pipelines": [
            {"name": "named", "sources": {"a": f"table:{schema}.a"}} | quick,
            {"name": "nameless", "sources": {"a": f"table:{schema}.missing"}} | quick,
        ],
        "resources": {"store": {"root": str(tmp_path / "store")}, "spark": spark_resource},
    }
    project = parse_project(settings, "dbsp.yaml", base=str(tmp_path))
    defs = build_definitions(project)
    sensor, job = defs.resolve_sensor_def("named_delta_versions"), defs.resolve_job_def("named_step_job")
    root = defs.resources["store"].pipeline_root("named")
    with instance_for_test() as instance:
        spark.sql(f"INSERT INTO {schema}.a VALUES (1, 1), (2, 2)")
        spark.sql(f"UPDATE {schema}.a SET v = v + 10 WHERE k = 1")
        assert tick_and_run(defs, sensor, job, instance) == 1
        (division,) = DivisionLog(root).all()[0]
        # The divisions name the table by where the catalog keeps it: one table whatever its name.
        assert division == Range(f"delta:{tmp_path / 'a'}", 0, 0, 3), division
        as_of = spark.read.format("delta").option("versionAsOf", 2).load(str(tmp_path / "a"))
        want = Counter(tuple(r) for r in batch_views(spark, VIEWS, {"a": as_of})["totals"].collect())
        got = integral(Pipeline(spark, root, project.pipelines[0].circuit_for(spark)).outputs.read("totals", 0, 0))
        assert got == want == Counter({(1, 1, 11): 1, (2, 1, 2): 1})

        skipped = tick(defs.resolve_sensor_def("nameless_delta_versions"), instance, defs.resources)
        assert f"table {schema}.missing: not in the Spark session's catalog" in skipped.skip_message, skipped

        # The name now names another table: a step run's inputs (asked again) refuse it, naming both places.
        spark.sql(f"DROP TABLE {schema}.a")
        spark.sql(create.format(where=tmp_path / "b"))
        with pytest.raises(TableRewrittenError, match=f"the catalog names {tmp_path / 'b'}, but the pipeline"):
            defs.resources["kafka"].source(project.pipelines[0], defs.resources["store"], defs.resources["spark"], True)


DOWNSTREAM = "CREATE MATERIALIZED VIEW by_count AS SELECT n, count(*) AS keys, sum(total) AS total FROM t GROUP BY n;\n"


@pytest.mark.slow
def test_a_pipeline_reading_anothers_view_is_cut_as_it_commits_and_equals_spark_batch_sql(
    spark_resource, spark, tmp_path
):
    table = change_fed_table(spark, str(tmp_path / "a"))
    (tmp_path / "up.sql").write_text(VIEWS)
    (tmp_path / "down.sql").write_text(DOWNSTREAM)
    quick = {"max_wait_seconds": 0, "sensor_running": False}
    settings = {
        "pipelines": [
            {"name": "up", "sql": "up.sql", "sources": {"a": f"delta:{table}"}, "schemas": {"a": "k INT, v INT"}}
            | quick,
            {
                "name": "down",
                "sql": "down.sql",
                "sources": {"t": "view:up.totals"},
                "schemas": {"t": "k INT, n BIGINT, total BIGINT"},
            }
            | quick,
        ],
        "resources": {"store": {"root": str(tmp_path / "store")}, "kafka": {"bootstrap_servers": "localhost:1"}},
    }
    settings["resources"]["spark"] = spark_resource
    project = parse_project(settings, "dbsp.yaml", base=str(tmp_path))
    defs = build_definitions(project)
    up, down = (
        (defs.resolve_sensor_def(f"{p}_delta_versions"), defs.resolve_job_def(f"{p}_step_job")) for p in ("up", "down")
    )
    graph = defs.resolve_asset_graph()
    assert AssetKey(["up", "totals"]) in graph.get(AssetKey(["down", "by_count"])).parent_keys
    root = defs.resources["store"].pipeline_root("down")
    rounds = [
        ["INSERT INTO {t} VALUES (1, 1), (2, 2), (3, 3)"],
        ["INSERT INTO {t} VALUES (1, 5), (3, 1)", "UPDATE {t} SET v = v + 10 WHERE k = 2"],
        ["DELETE FROM {t} WHERE k = 1"],
    ]
    with instance_for_test() as instance:
        assert tick_and_run(defs, *down, instance) == 0  # nothing upstream yet
        for statements in rounds:
            for statement in statements:
                spark.sql(statement.format(t=f"delta.`{table}`"))
            assert tick_and_run(defs, *up, instance) == 1
            assert tick_and_run(defs, *down, instance) == 1
            upstream_view = spark.read.format("delta").load(str(tmp_path / "store" / "up" / "views" / "totals"))
            want = Counter(tuple(r) for r in batch_views(spark, DOWNSTREAM, {"t": upstream_view})["by_count"].collect())
            last = max(DivisionLog(root).all())
            spec = project.pipelines[1]
            got = integral(Pipeline(spark, root, spec.circuit_for(spark)).outputs.read("by_count", 0, last))
            assert got == want and got
        spark.sql(f"INSERT INTO delta.`{table}` VALUES (4, 4)")
        assert tick_and_run(defs, *up, instance) == 1
        source = defs.resources["kafka"].source(project.pipelines[1], defs.resources["store"], defs.resources["spark"])
        assert "lag view totals of up: 1 upstream steps not yet in a step" in status_text(report(root, source))
        divisions = DivisionLog(root).all()
        assert [(r.source, r.start, r.end) for step in sorted(divisions) for r in divisions[step]] == [
            ("view:up.totals", 0, 1),
            ("view:up.totals", 1, 2),
            ("view:up.totals", 2, 3),
        ]
        retyped = T.StructType([T.StructField("k", T.StringType())])
        with pytest.raises(InputColumnsChangedError, match="column 'k', which input 't' reads as string, is int there"):
            source.views.changes(spark, "view:up.totals", Range("view:up.totals", 0, 0, 1), "t", retyped)
        shutil.rmtree(tmp_path / "store" / "up")  # the upstream starts anew
        with pytest.raises(
            TableRewrittenError, match="its output log has 0 steps, but steps have read it up to step 2"
        ):
            cut_next(DivisionLog(root), source, DivisionPolicy(10, 0))
