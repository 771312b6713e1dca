"""The store on an S3-compatible object store (moto's server, tests/s3.py): a pipeline's
steps, a ``kill -9`` mid-step, a rescale and a vacuum each end with the outputs of the same
run on a local disk, nothing lost or duplicated; Spark's own Delta reader reads every
table; a wrong endpoint, a missing bucket and refused credentials each name the setting."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml
from deltalake import DeltaTable

from dagster_project.config import ConfigError
from dagster_project.resources import StoreResource
from storage import location
from storage.pipeline import Pipeline

from ..s3 import ACCESS_KEY, SECRET_KEY, s3_server
from . import workload
from .test_crash_recovery import crash, worker_spark  # noqa: F401 (a fixture)

STEPS, INTERVAL = 3, 2


@pytest.fixture
def root(s3) -> str:
    root = f"s3://{s3.bucket()}/pipelines/p"
    s3.reach(root)
    return root


@pytest.fixture(scope="module")
def reference(spark, tmp_path_factory):
    root = str(tmp_path_factory.mktemp("local"))
    return workload.output_log(workload.drive(spark, root, 0, STEPS, INTERVAL), STEPS)


def files_under(s3, root: str) -> list[str]:
    bucket, _, prefix = root.removeprefix("s3://").partition("/")
    pages = s3.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return [o["Key"] for page in pages for o in page.get("Contents", [])]


def assert_views_are_their_logs_integrals(pipeline: Pipeline) -> None:
    for handle, (view, integral) in workload.views_match_logs(pipeline, STEPS).items():
        assert view and view == integral, handle


def test_steps_on_s3_equal_the_same_steps_on_a_local_disk_and_spark_reads_every_table(spark, s3, root, reference):
    pipeline = workload.drive(spark, root, 0, STEPS, INTERVAL)
    assert workload.output_log(pipeline, STEPS) == reference
    assert_views_are_their_logs_integrals(pipeline)
    assert workload.batch_sql_differences(spark, pipeline, STEPS) == []
    assert any(k.startswith("pipelines/p/state/") and k.endswith(".parquet") for k in files_under(s3, root))
    # delta-spark over s3a, at the latest version and by time travel, reads what delta-rs reads.
    assert workload.delta_spark_differences(spark, root, one_of_each_kind=True) == []


@pytest.mark.slow
def test_a_kill_9_mid_step_on_s3_recovers_with_nothing_lost_or_duplicated(
    spark,
    s3,
    root,
    reference,
    worker_spark,  # noqa: F811 (the fixture imported above)
    monkeypatch,
):
    monkeypatch.setenv(workload.S3_ENDPOINT_ENV, s3.endpoint)
    for fault, kill_after in [("during_commit:1", None), (None, 6.0)]:
        run_root = f"{root}-{(fault or 'random').replace(':', '-')}"
        s3.reach(run_root)
        assert crash(run_root, fault, kill_after, worker_spark) or fault is None, f"{fault} was not reached"
        pipeline = workload.drive(spark, run_root, 0, STEPS, INTERVAL)
        assert workload.output_log(pipeline, STEPS) == reference, fault
        assert_views_are_their_logs_integrals(pipeline)


def test_a_rescale_and_a_vacuum_on_s3_keep_the_outputs(spark, s3, root, reference):
    pipeline = workload.drive(spark, root, 0, 2, INTERVAL)
    report = pipeline.rescale(3, "fixed")
    assert report.after.workers == 3
    pipeline.compact()
    pipeline.compact()  # no openable checkpoint pins the files from before the compactions now
    before = set(files_under(s3, root))
    deleted = pipeline.vacuum()
    after = set(files_under(s3, root))
    assert deleted and len(before - after) == len(deleted)
    pipeline = workload.drive(spark, root, 0, STEPS, INTERVAL, workers=3)
    assert workload.output_log(pipeline, STEPS) == reference
    assert_views_are_their_logs_integrals(pipeline)


@pytest.fixture(scope="module")
def refusing_s3():
    """A server that checks credentials (none are known to it: every key is refused)."""
    with s3_server(env={"INITIAL_NO_AUTH_ACTION_COUNT": "0"}) as server:
        yield server


def test_a_wrong_endpoint_a_missing_bucket_and_refused_credentials_each_name_the_setting(s3, refusing_s3):
    keys = {"access_key_id": ACCESS_KEY, "secret_access_key": SECRET_KEY}
    bucket = s3.bucket()
    cases = [
        ({"root": f"s3://{bucket}/x", "endpoint": "http://127.0.0.1:1", **keys}, "resources.store.endpoint"),
        ({"root": "s3://no-such-bucket/x", "endpoint": s3.endpoint, **keys}, "resources.store.root"),
        ({"root": f"s3://{bucket}/x", "endpoint": refusing_s3.endpoint, **keys}, "resources.store.access_key_id"),
    ]
    for settings, named in cases:
        with pytest.raises(ConfigError, match=named) as refused:
            StoreResource(**settings).pipeline_root("p")
        assert SECRET_KEY not in str(refused.value)
    assert (
        StoreResource(root=f"s3://{bucket}/x", endpoint=s3.endpoint, **keys).pipeline_root("p") == f"s3://{bucket}/x/p"
    )
    assert location.store_of(f"s3://{bucket}/x/p") == s3.store()


@pytest.mark.slow
def test_the_demo_over_delta_tables_through_dagster_keeps_every_table_in_the_bucket_and_never_prints_the_keys(
    s3, tmp_path, spark_resource
):
    """``dbsp demo --source delta`` with the store on the bucket: Spark merges each batch into
    the input tables there, the sensor cuts their versions into steps, and every view equals
    Spark batch SQL over the tables as of the last step's versions."""
    from ..dagster_project.test_cli import PROJECT, demo_config, minimal_env, stop_daemons

    config, bucket = demo_config(tmp_path, spark_resource, "lake"), s3.bucket()
    settings = yaml.safe_load(config.read_text())
    settings["resources"]["store"] = {
        "root": f"s3://{bucket}/pipelines",
        "endpoint": s3.endpoint,
        "access_key_id": {"env": "LAKE_KEY"},
        "secret_access_key": {"env": "LAKE_SECRET"},
    }
    config.write_text(yaml.safe_dump(settings))
    env = minimal_env(tmp_path, PYTHONPATH=str(PROJECT), LAKE_KEY=ACCESS_KEY, LAKE_SECRET=SECRET_KEY)
    command = [sys.executable, "-m", "dagster_project.cli", "--config", str(config), "demo", "--source", "delta"]
    try:
        done = subprocess.run(
            [*command, "--steps", "2", "--events-per-step", "300"],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=600,
        )
    finally:
        stop_daemons(config, env)
    assert done.returncode == 0, done.stdout + done.stderr
    steps = [line.split(", rows")[0] for line in done.stdout.splitlines() if line.startswith("step ")]
    assert steps == ["step 0: events 0..300", "step 1: events 300..600"], done.stdout
    for view in ("bids_by_category", "q3", "q4", "q15"):
        assert f"{view} equals Spark batch SQL: yes" in done.stdout, done.stdout
    kept = files_under(s3, f"s3://{bucket}/pipelines/lake")
    for table in ("_divisions/", "_checkpoints/", "state/", "outputs/q4/", "views/q4/", "_lease/"):
        assert any(k.startswith(f"pipelines/lake/{table}") for k in kept), table
    # The second batch's MERGE updated and deleted earlier rows, not only inserted.
    metrics = {
        h: DeltaTable(uri, storage_options=s3.store().delta_options()).history(1)[0]["operationMetrics"]
        for h, uri in ((h, f"s3://{bucket}/pipelines/lake_sources/{h}") for h in ("persons", "bids"))
    }
    assert int(metrics["persons"]["numTargetRowsUpdated"]) > 0 < int(metrics["bids"]["numTargetRowsDeleted"]), metrics
    assert not (tmp_path / "dbsp" / "pipelines").exists()
    logs = [p.read_text(errors="replace") for p in (tmp_path / "dbsp").rglob("*.log")]
    assert logs and not any(SECRET_KEY in text for text in [done.stdout, done.stderr, *logs])


def test_the_gateways_cursors_live_beside_the_pipelines_on_the_bucket(s3, tmp_path):
    from dagster_project.config import ProjectSpec
    from dagster_project.store import store_settings
    from storage.cursors import CursorStore

    bucket = s3.bucket()
    project = ProjectSpec(
        pipelines=[],
        resources={
            "store": {
                "root": f"s3://{bucket}/lake",
                "endpoint": s3.endpoint,
                "access_key_id": ACCESS_KEY,
                "secret_access_key": {"env": "LAKE_SECRET"},
            }
        },
    )
    with pytest.MonkeyPatch.context() as env:
        env.delenv("LAKE_SECRET", raising=False)
        with pytest.raises(
            ConfigError, match="resources.store.secret_access_key: the environment variable LAKE_SECRET"
        ):
            store_settings(project)
        env.setenv("LAKE_SECRET", SECRET_KEY)
        uri = store_settings(project).gateway_cursors("")
    assert uri == f"s3://{bucket}/lake/_gateway_cursors"
    cursors = CursorStore(uri)
    cursors.commit({("t", "a.log"): 120}, {("t", 0): 7})
    loaded = CursorStore(uri).load()
    assert loaded.positions == {("t", "a.log"): 120} and loaded.read_back == {("t", 0): 7}
    assert any(k.startswith("lake/_gateway_cursors/_delta_log/") for k in files_under(s3, f"s3://{bucket}/lake"))
