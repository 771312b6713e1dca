"""A pipeline whose input is a Delta table, served by Dagster: the offset sensor cuts the
table's versions into steps (at most ``max_records_per_step`` versions each) and requests
their runs, and after every run the view equals Spark batch SQL over the table as of the
step's last version."""

from collections import Counter

import pytest
from dagster import build_sensor_context, instance_for_test

from circuits.sql import batch_views
from dagster_project.config import parse_project
from dagster_project.factory import build_definitions
from storage.logs import DivisionLog
from storage.pipeline import Pipeline

from .harness import integral

VIEWS = "CREATE MATERIALIZED VIEW totals AS SELECT k, count(*) AS n, sum(v) AS total FROM a GROUP BY k;\n"


@pytest.mark.slow
def test_the_sensor_cuts_a_delta_tables_versions_into_steps_whose_runs_equal_spark_batch_sql(
    spark_resource, spark, tmp_path
):
    table = str(tmp_path / "a")
    spark.sql(
        f"CREATE TABLE delta.`{table}` (k INT, v INT) USING delta TBLPROPERTIES (delta.enableChangeDataFeed = true)"
    )
    (tmp_path / "views.sql").write_text(VIEWS)
    pipeline = {"name": "dp", "sql": "views.sql", "sources": {"a": f"delta:{table}"}, "schemas": {"a": "k INT, v INT"}}
    settings = {
        "pipelines": [{**pipeline, "max_records_per_step": 2, "max_wait_seconds": 0, "sensor_running": False}],
        # No topics: the pipeline never asks this broker anything.
        "resources": {"store": {"root": str(tmp_path / "store")}, "kafka": {"bootstrap_servers": "localhost:1"}},
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
    with instance_for_test() as instance:
        for statements in rounds:
            for statement in statements:
                spark.sql(statement.format(t=f"delta.`{table}`"))
            for _ in range(4):  # one step a tick, of at most two versions
                result = sensor(build_sensor_context(instance=instance, resources=defs.resources))
                for request in result.dynamic_partitions_requests or []:
                    instance.add_dynamic_partitions(request.partitions_def_name, request.partition_keys)
                for run in result.run_requests or []:
                    assert job.execute_in_process(instance=instance, partition_key=run.partition_key).success
            divisions = DivisionLog(root).all()
            assert all(sum(r.end - r.start for r in ranges) <= 2 for ranges in divisions.values())
            last = max(divisions)
            version = divisions[last][0].end - 1
            assert version == spark.sql(f"DESCRIBE HISTORY delta.`{table}`").agg({"version": "max"}).first()[0]
            as_of = spark.read.format("delta").option("versionAsOf", version).load(table)
            want = Counter(tuple(r) for r in batch_views(spark, VIEWS, {"a": as_of})["totals"].collect())
            got = integral(Pipeline(spark, root, spec.circuit_for(spark)).outputs.read("totals", 0, last))
            assert got == want and got
