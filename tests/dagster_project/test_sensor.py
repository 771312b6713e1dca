"""The offset sensor across daemon crashes: whatever happens between recording a division
and requesting its run, every offset ends up in exactly one step, steps have no gaps,
and every recorded step is requested."""

import os
from collections import Counter

import pytest
from dagster import DagsterInstance
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from storage.faults import InjectedCrash
from storage.logs import DivisionLog
from storage.pipeline import status

from .harness import Harness

ACTIONS = st.one_of(
    st.tuples(st.just("produce"), st.sampled_from(["bids", "auctions"]), st.integers(0, 1), st.integers(1, 25)),
    st.tuples(st.just("tick")),
    st.tuples(st.just("crash")),  # the tick dies right after recording a division
    st.tuples(st.just("lose_cursor")),
)


def tick(h: Harness, cursor: str | None, requested: set[str], crash: bool) -> str | None:
    if crash:
        os.environ.update(DBSP_FAULT=f"sensor_after_division:{status(h.root).divided_step}", DBSP_FAULT_MODE="raise")
    try:
        result = h.tick(cursor)
    except InjectedCrash:
        return cursor  # no run requested, cursor not advanced: the daemon died
    finally:
        os.environ.pop("DBSP_FAULT", None)
        os.environ.pop("DBSP_FAULT_MODE", None)
    requested.update(r.partition_key for r in (getattr(result, "run_requests", None) or []))
    return getattr(result, "cursor", cursor)


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
            cursor = tick(h, cursor, requested, crash=action[0] == "crash")
    while True:  # the daemon keeps ticking until the topics are divided
        divided = status(h.root).divided_step
        cursor = tick(h, cursor, requested, crash=False)
        if status(h.root).divided_step == divided:
            break

    divisions = DivisionLog(h.root).all()
    assert list(divisions) == list(range(len(divisions)))  # no gap
    ends: Counter = Counter()
    for ranges in divisions.values():
        assert 0 < sum(r.end - r.start for r in ranges) <= cap
        for r in ranges:
            assert r.start == ends[(r.source, r.partition)]  # no overlap, no hole
            ends[(r.source, r.partition)] = r.end
    assert +ends == +produced  # every offset, exactly once
    assert requested == {f"{s:010d}" for s in divisions}  # every step requested, crash or not
