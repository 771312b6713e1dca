"""The offset sensor across daemon crashes: whatever happens between recording a division
and requesting its run, every offset ends up in exactly one step, steps have no gaps,
and every recorded step is requested."""

import os
import re
import time
from collections import Counter

import pytest
from dagster import AssetKey, DagsterInstance, DagsterRunStatus, SkipReason
from dagster._core.test_utils import create_run_for_test
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dagster_project.factory import FAILURES_TAG
from storage.faults import InjectedCrash
from storage.lease import Lease
from storage.logs import DivisionLog
from storage.pipeline import status

from .harness import Harness

ACTIONS = st.one_of(
    st.tuples(st.just("produce"), st.sampled_from(["bids", "auctions"]), st.integers(0, 1), st.integers(1, 25)),
    st.tuples(st.just("tick")),
    st.tuples(st.just("crash")),  # the tick dies right after recording a division
    st.tuples(st.just("lose_cursor")),
)


def tick(h: Harness, cursor: str | None, requested: set[str], crash: bool) -> tuple[str | None, object]:
    """One daemon tick: the cursor it leaves and its result (None when it died)."""
    if crash:
        os.environ.update(DBSP_FAULT=f"sensor_after_division:{status(h.root).divided_step}", DBSP_FAULT_MODE="raise")
    try:
        result = h.tick(cursor)
    except InjectedCrash:
        return cursor, None  # no run requested, cursor not advanced: the daemon died
    finally:
        os.environ.pop("DBSP_FAULT", None)
        os.environ.pop("DBSP_FAULT_MODE", None)
    requested.update(r.partition_key for r in (getattr(result, "run_requests", None) or []))
    return getattr(result, "cursor", cursor), result


def failed(result) -> bool:
    """Whether a tick skipped because the broker failed it (a leader not elected yet, a
    request that timed out under load): the daemon ticks again, so the test does too."""
    return isinstance(result, SkipReason) and "nothing recorded" in (result.skip_message or "")


@pytest.mark.slow
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(actions=st.lists(ACTIONS, min_size=1, max_size=14), cap=st.integers(1, 40))
def test_every_offset_is_in_exactly_one_step(broker, spark_resource, tmp_path_factory, actions, cap):
    h = Harness(
        tmp_path_factory.mktemp("sensor"),
        broker.bootstrap,
        DagsterInstance.ephemeral(),
        spark=spark_resource,
        max_records_per_step=cap,
    )
    produced, requested, cursor = Counter(), set(), None
    for action in actions:
        if action[0] == "produce":
            _, handle, partition, n = action
            h.client.produce(h.source.topics[handle], [b"{}"] * n, partition=partition)
            produced[(h.source.topics[handle], partition)] += n
        elif action[0] == "lose_cursor":
            cursor = None
        else:
            cursor, _ = tick(h, cursor, requested, crash=action[0] == "crash")
    deadline = time.monotonic() + 60
    while True:  # the daemon keeps ticking until the topics are divided
        divided = status(h.root).divided_step
        cursor, result = tick(h, cursor, requested, crash=False)
        if status(h.root).divided_step == divided and not failed(result):
            break
        assert time.monotonic() < deadline, f"the sensor still cannot divide: {result.skip_message}"

    divisions = DivisionLog(h.root).all()
    assert list(divisions) == list(range(len(divisions)))  # no gap
    ends: Counter = Counter()
    for ranges in divisions.values():
        assert 0 < sum(r.end - r.start for r in ranges) <= cap
        for r in ranges:
            assert r.start == ends[(r.source, r.partition)]  # no overlap, no hole
            ends[(r.source, r.partition)] = r.end
    assert +ends == +produced, f"the last tick: {result}"  # every offset, exactly once
    assert requested == {f"{s:010d}" for s in divisions}  # every step requested, crash or not


def failed_partitions(h: Harness, sink: str = "bids_by_category") -> set[str]:
    """The step partitions Dagster's UI shows as failed: the last attempt has no materialization."""
    storage = h.instance.event_log_storage
    return set(
        storage.get_latest_asset_partition_materialization_attempts_without_materializations(AssetKey([h.name, sink]))
    )


@pytest.mark.slow
def test_a_failed_step_is_requested_again_after_a_back_off_and_a_step_committed_outside_shows_as_materialized(
    broker, spark_resource, tmp_path
):
    h = Harness(tmp_path, broker.bootstrap, DagsterInstance.ephemeral(), spark=spark_resource, retry_backoff_seconds=3)
    h.produce(30)
    [first] = h.tick().run_requests
    assert first.run_key == f"{h.name}:0000000000"
    # The cause: another run of the pipeline holds its lease (and lease_wait_seconds is 0).
    other = create_run_for_test(h.instance, job_name="another", status=DagsterRunStatus.STARTED).run_id
    lease = Lease(h.root)
    lease.acquire(other)
    assert not h.run(0).success
    assert failed_partitions(h) == {"0000000000"}

    waiting = h.tick()
    assert not waiting.run_requests
    assert re.fullmatch(
        r"step 0: 1 run\(s\) failed; requesting it again in [23] s \(attempt 2\)", waiting.skip_reason.skip_message
    )
    time.sleep(3)
    [retry] = h.tick().run_requests
    assert retry.run_key == f"{h.name}:0000000000:retry1"  # a run key Dagster has not run
    assert retry.partition_key == "0000000000" and retry.tags[FAILURES_TAG] == "1"

    lease.break_()  # the cause fixed
    assert h.run(0).success
    assert not failed_partitions(h)
    h.produce(10)
    [second] = h.tick().run_requests
    assert second.run_key == f"{h.name}:0000000001"
    lease.acquire(other)
    assert not h.run(1).success
    assert failed_partitions(h) == {"0000000001"}
    # Committed by the recover job (as by `dbsp recover`), not by a step run: recorded as
    # materialized, not failed.
    lease.break_()
    assert h.defs.resolve_job_def(f"{h.name}_recover").execute_in_process(instance=h.instance).success
    assert status(h.root).committed_step == 2
    assert not failed_partitions(h)
    assert h.instance.get_materialized_partitions(AssetKey([h.name, "bids_by_category"])) == {
        "0000000000",
        "0000000001",
    }
    assert not h.tick().run_requests
