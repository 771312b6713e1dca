"""Pipelines served by Dagster against the real broker, real Delta tables and a real
(temporary) Dagster instance: sensor ticks, step runs, backfills, ordering, dead letters."""

import os
from collections import Counter

import pytest
import yaml
from dagster import SkipReason, instance_for_test

from circuits.daemon import free_port
from circuits.vnodes import Layout
from dagster_project import cli
from storage.delta import delta_tables
from storage.lease import Lease
from storage.pipeline import status
from storage.tables import open_table

from .harness import Harness, integral


@pytest.fixture
def instance():
    with instance_for_test() as instance:
        yield instance


def versions(root: str) -> dict[str, int]:
    """The Delta version of every data table under ``root`` (the lease records who ran, not data)."""
    return {
        os.path.relpath(uri, root): open_table(uri).version()
        for uri in delta_tables(root)
        if not uri.endswith("_lease")
    }


@pytest.mark.slow
def test_steps_from_kafka_through_dagster_equal_recomputation(spark_resource, spark, broker, tmp_path, instance):
    h = Harness(tmp_path, broker.bootstrap, instance, spark=spark_resource)
    for produce in ({"count": 300}, {"count": 200, "deletes": 15}, {"count": 100, "deletes": 30}):
        h.produce(**produce)
        result = h.tick()
        assert [r.partition_key for r in result.run_requests] == [f"{status(h.root).committed_step:010d}"]
        run = h.run(int(result.run_requests[0].partition_key))
        assert run.success
        # After every step: the output log integrates to the view recomputed from everything produced.
        assert integral(h.pipeline(spark).outputs.read("bids_by_category", 0, 10**9)) == h.expected_revenue()
    events = run.get_asset_materialization_events()
    metadata = events[0].materialization.metadata
    assert metadata["rows_in/bids"].value == 100 * 46 // 50 + 30  # this step's bids and retractions
    assert metadata["steps_run"].value == 1 and metadata["seconds/compute_and_write"].value > 0
    assert "| 2 |" in metadata["input_offsets"].value
    state = [open_table(uri) for uri in delta_tables(os.path.join(h.root, "state"))]
    assert metadata["state_rows"].value == sum(t.to_pyarrow_table().num_rows for t in state) > 0
    # The current view, as a plain table: the same rows, and the materialization previews it.
    view = open_table(os.path.join(h.root, "views", "bids_by_category")).to_pyarrow_table()
    assert Counter(tuple(r.values()) for r in view.to_pylist()) == h.expected_revenue()
    assert metadata["view_rows"].value == view.num_rows
    assert metadata["view_preview"].value.startswith("| category | revenue | bids |")
    checks = run.get_asset_check_evaluations()
    assert [(c.asset_key.path[-1], c.check_name) for c in checks] == [("bids_by_category", "well_formed")]
    assert checks[0].passed and set(checks[0].metadata) == {"bad_rows/consolidated", "bad_rows/is_a_set"}
    assert set(instance.get_dynamic_partitions(f"{h.name}_steps")) == {f"{s:010d}" for s in range(3)}


@pytest.mark.slow
def test_backfill_is_one_run_reruns_change_nothing_and_gaps_are_named(
    spark_resource, spark, broker, tmp_path, instance
):
    h = Harness(tmp_path, broker.bootstrap, instance, spark=spark_resource)
    for _ in range(4):
        h.produce(100)
        h.tick()
    assert status(h.root).divided_step == 4
    assert h.run(0).success

    skipped = h.run(2)  # step 1 is not committed
    assert not skipped.success
    assert "step 1 is not committed" in str(skipped.get_step_failure_events()[0].event_specific_data.error)

    before = len(instance.get_run_records())
    backfill = h.run(1, 3)
    assert backfill.success and len(instance.get_run_records()) == before + 1
    assert status(h.root).committed_step == 4 and status(h.root).checkpoint_version == 2  # one checkpoint for 1..3

    tables = versions(h.root)
    again = h.run(2)
    assert again.success
    assert again.get_asset_materialization_events()[0].materialization.metadata["steps_run"].value == 0
    assert versions(h.root) == tables  # no new Delta version in any table
    assert integral(h.pipeline(spark).outputs.read("bids_by_category", 0, 3)) == h.expected_revenue()


def test_malformed_records_go_to_the_dead_letter_table(spark_resource, spark, broker, tmp_path, instance):
    h = Harness(tmp_path, broker.bootstrap, instance, spark=spark_resource, topic_partitions=1)
    h.produce(200)
    bad = [
        b"not json",
        b'{"auction": 1}',
        b'{"auction": "x", "bidder": 1, "price": 2, "channel": "c", "date_time": 3}',
        b"\xff\xfe",
    ]
    h.send("bids", bad)
    h.produce(100)
    assert h.tick().run_requests
    assert h.run(0).success
    dead = h.pipeline(spark).inputs.dead_letters().collect()
    assert len(dead) == len(bad)
    assert {r["topic"] for r in dead} == {h.source.topics["bids"]} and {r["_step"] for r in dead} == {0}
    first_bad = len(h.produced["bids"]) - 100 * 46 // 50
    assert sorted(r["offset"] for r in dead) == list(range(first_bad, first_bad + len(bad)))
    assert all(r["reason"] for r in dead)
    # Every valid record made it: the view equals the recomputation over the valid records.
    assert integral(h.pipeline(spark).outputs.read("bids_by_category", 0, 0)) == h.expected_revenue()
    # A step without malformed records adds no version to the dead-letter table.
    dead_versions = versions(h.root)["_dead_letters"]
    h.produce(50)
    assert h.tick().run_requests and h.run(1).success
    assert versions(h.root)["_dead_letters"] == dead_versions


@pytest.mark.slow
def test_a_broker_that_is_down_skips_and_records_nothing(spark_resource, tmp_path, instance):
    bootstrap = f"127.0.0.1:{free_port()}"  # nothing listens there
    h = Harness(tmp_path, bootstrap, instance, spark=spark_resource, create_topics=False)
    result = h.tick()
    reason = result if isinstance(result, SkipReason) else result.skip_reason
    assert bootstrap in str(reason) and "bootstrap" in str(reason)
    assert status(h.root).divided_step == 0 and not os.path.exists(os.path.join(h.root, "_divisions"))


@pytest.mark.slow
def test_the_rescale_asset_moves_one_share_and_steps_go_on(spark_resource, spark, broker, tmp_path, instance):
    h = Harness(tmp_path, broker.bootstrap, instance, spark=spark_resource, workers=4)
    h.produce(300)
    h.tick()
    assert h.run(0).success
    job = h.defs.resolve_job_def(f"{h.name}_rescale")
    result = job.execute_in_process(
        instance=instance, run_config={"ops": {f"{h.name}__layout": {"config": {"workers": 5}}}}
    )
    assert result.success
    metadata = result.get_asset_materialization_events()[0].materialization.metadata
    assert metadata["workers"].value == 5 and 0 < metadata["fraction_moved"].value <= 1 / 5 + 1 / 256
    assert metadata["state_rows_rewritten"].value > 0 and metadata["pause_seconds"].value > 0
    h.produce(200, deletes=20)
    h.tick()
    assert h.run(1).success
    assert Layout.from_json(status(h.root).meta["layout"]).workers == 5  # the step ran on the new layout
    assert integral(h.pipeline(spark).outputs.read("bids_by_category", 0, 1)) == h.expected_revenue()


@pytest.mark.slow
def test_the_rescale_job_keeps_a_dynamic_layout_when_no_strategy_is_given(
    spark_resource, spark, broker, tmp_path, instance
):
    h = Harness(tmp_path, broker.bootstrap, instance, spark=spark_resource, workers=4)
    h.produce(100)
    h.tick()
    assert h.run(0).success
    job = h.defs.resolve_job_def(f"{h.name}_rescale")
    for config in ({"workers": 4, "strategy": "dynamic", "k": 0.25}, {"workers": 5}):
        run_config = {"ops": {f"{h.name}__layout": {"config": config}}}
        assert job.execute_in_process(instance=instance, run_config=run_config).success
    layout = Layout.from_json(status(h.root).meta["layout"])
    assert (layout.workers, layout.k) == (5, 0.25) and layout.shards > 0  # still dynamic, as `dbsp rescale` keeps it


@pytest.mark.slow
def test_recover_by_the_cli_and_by_the_job_runs_the_divided_steps_past_a_dead_runs_lease(
    spark_resource, spark, broker, tmp_path, instance, monkeypatch, capsys
):
    monkeypatch.setenv("DBSP_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home" / "dagster"))
    h = Harness(tmp_path, broker.bootstrap, instance, spark=spark_resource)
    config = tmp_path / "dbsp.yaml"
    config.write_text(yaml.safe_dump(h.settings))
    h.produce(300)
    h.tick()  # step 0 divided, never run
    Lease(h.root).acquire("a run that died")
    assert cli.main(["--config", str(config), "recover"]) == 2
    assert "being advanced by a run that died" in capsys.readouterr().err
    assert cli.main(["--config", str(config), "recover", "--break-lease"]) == 0
    out = capsys.readouterr().out
    assert "holder='a run that died'" in out and "ran steps [0]; next step 1" in out
    h.produce(200, deletes=20)
    h.tick()
    Lease(h.root).acquire("another run that died")
    job = h.defs.resolve_job_def(f"{h.name}_recover")
    config = {"ops": {f"{h.name}_recover_op": {"config": {"break_lease": True}}}}
    assert job.execute_in_process(instance=instance, run_config=config).success
    assert status(h.root).committed_step == 2 and status(h.root).lease_holder is None
    assert integral(h.pipeline(spark).outputs.read("bids_by_category", 0, 1)) == h.expected_revenue()


def test_the_produce_job_continues_the_demo_events_and_the_status_job_logs_where_the_pipeline_stands(
    broker, tmp_path, instance
):
    kafka = {"bootstrap_servers": broker.bootstrap}
    resources = {"store": {"root": str(tmp_path / "store")}, "kafka": kafka, "spark": {}}
    h = Harness(
        tmp_path,
        broker.bootstrap,
        instance,
        project={"resources": resources},
        producer="circuits.library.nexmark:nexmark_records",
    )
    produce = h.defs.resolve_job_def(f"{h.name}_produce")
    config = {"ops": {f"{h.name}_produce_op": {"config": {"events": 100}}}}
    assert all(produce.execute_in_process(instance=instance, run_config=config).success for _ in range(2))
    ends = h.client.offsets(list(h.source.topics.values())).values()
    assert sum(high for _, high in ends) == 200  # the second run went on from event 100
    h.tick()
    run = h.defs.resolve_job_def(f"{h.name}_status").execute_in_process(instance=instance)
    logged = "\n".join(entry.user_message for entry in instance.all_logs(run.run_id))
    assert "divided steps: 1 (waiting to run: 1)" in logged and "lease: free" in logged
    assert "records not yet in a step" in logged
