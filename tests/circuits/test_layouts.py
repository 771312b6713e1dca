"""Layout changes (pure logic): balanced within one unit, and the fewest vnodes moved."""

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from circuits import CircuitDefinitionError
from circuits.layouts import initial, moved, rescale


def least_moves(owners: tuple[int, ...], workers: int) -> int:
    """The fewest units any balanced assignment to ``workers`` must move: each worker keeps
    at most its share, and only ``extra`` workers may have the one-larger share."""
    held = Counter(o for o in owners if o < workers)
    base, extra = divmod(len(owners), workers)
    keep = sum(min(held[w], base) for w in range(workers)) + min(extra, sum(held[w] > base for w in range(workers)))
    return len(owners) - keep


def next_power_of_two(x: float) -> int:
    n = 1
    while n < x:
        n *= 2
    return n


def shares(layout) -> list[int]:
    counts = Counter(layout.owners)
    return [counts.get(w, 0) for w in range(layout.workers)]


@given(vnodes=st.sampled_from([64, 100, 256, 1024]), changes=st.lists(st.integers(1, 40), min_size=1, max_size=5))
def test_fixed_changes_move_the_fewest_vnodes_and_stay_balanced(vnodes, changes):
    layout = initial(vnodes, changes[0])
    for workers in changes[1:]:
        after = rescale(layout, workers, "fixed")
        assert len(moved(layout, after)) == least_moves(layout.owners, workers)
        assert max(shares(after)) - min(shares(after)) <= 1
        if workers == layout.workers + 1:  # consistent hashing's bound: about S / (W + 1), never W / (W + 1)
            assert len(moved(layout, after)) <= -(-vnodes // workers)
        layout = after


@given(changes=st.lists(st.integers(1, 40), min_size=2, max_size=5), k=st.sampled_from([0.05, 0.1, 0.25]))
def test_dynamic_changes_stay_within_one_shard_and_move_about_one_share(changes, k):
    layout = initial(256, changes[0], "dynamic", k)
    for workers in changes[1:]:
        after = rescale(layout, workers)
        per_shard = 256 // after.shards
        assert after.shards == min(256, next_power_of_two(workers / k))
        assert max(shares(after)) - min(shares(after)) <= per_shard
        assert all(after.owners[v] == after.owners[v % after.shards] for v in range(256))
        if workers == layout.workers + 1 and after.shards >= layout.shards:
            assert len(moved(layout, after)) <= -(-after.shards // workers) * per_shard
        layout = after


@pytest.mark.parametrize("before, after, bound", [(4, 5, 0.2), (8, 9, 1 / 9), (5, 4, 0.2)])
def test_one_more_or_one_fewer_worker_moves_one_share(before, after, bound):
    for strategy in ("fixed", "dynamic"):
        layout = initial(256, before, strategy)
        assert len(moved(layout, rescale(layout, after))) / 256 <= bound + 1 / 256


def test_bad_strategies_are_refused():
    with pytest.raises(CircuitDefinitionError, match="unknown layout strategy"):
        rescale(initial(256, 2), 3, "consistent")
    with pytest.raises(CircuitDefinitionError, match="power-of-two"):
        initial(100, 2, "dynamic")
    with pytest.raises(CircuitDefinitionError, match="between 0 and 1"):
        initial(256, 2, "dynamic", k=1.5)
