"""ICADD (docs/gateway.md) for the gateway: the distributor's rules one by one, then the simulator
over hypothesis-drawn migrations (invariants, ping-pong cases) and the mutation checks."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, find, given, settings, target
from hypothesis import Phase as HPhase
from hypothesis import strategies as st

from circuits.layouts import initial, rescale
from gateway.icadd import (
    DOWN,
    Acquire,
    Collect,
    Data,
    Distributor,
    Done,
    Drop,
    Envelope,
    Interrogate,
    Phase,
    Placement,
    Rules,
)
from tests.gateway.icadd_sim import Scenario, Violation, simulate

W2 = initial(256, 2)
W3 = rescale(W2, 3)


def key_where(f: int, f_new: int) -> str:
    """A source id with ``F(K, W2) == f`` and ``F'(K, W3) == f_new``."""
    old, new = Placement(W2), Placement(W3)
    return next(k for k in (f"src-{i}" for i in range(10_000)) if old.worker(k) == f and new.worker(k) == f_new)


def sent(out: list) -> list[tuple]:
    """``(destination, body)`` of each output, envelopes opened."""
    return [(dest, m.body if isinstance(m, Envelope) else m) for dest, m in out]


def interrogated(d: Distributor, keys: set[str] = frozenset()) -> list:
    """Begins W2 -> W3 at ``d``, its operator holding ``keys``; returns what Collect's start sent."""
    [(_, interrogate)] = d.begin(W3)
    interrogate.add_keys(keys)
    return d.processed(interrogate)


# -- placement ---------------------------------------------------------------------------------


def test_placement_moves_about_one_in_w_plus_one():
    keys = [f"tcp-{i}" for i in range(3000)]
    old, new = Placement(W2), Placement(W3)
    moved = [k for k in keys if old.worker(k) != new.worker(k)]
    assert all(new.worker(k) == 2 for k in moved)  # least movement: only to the new worker
    assert 0.28 < len(moved) / len(keys) < 0.39


# -- the rules, one by one ---------------------------------------------------------------------


def test_interrogate_rules_1_1_1_2_and_2():
    d = Distributor(0, W2)
    [(dest, interrogate)] = d.begin(W3)
    assert dest is DOWN and isinstance(interrogate, Interrogate) and d.phase is Phase.INTERROGATE
    leaving, staying, remote = key_where(0, 2), key_where(0, 0), key_where(1, 1)
    assert sent(d.offer(Data(leaving, 0))) == [(DOWN, Data(leaving, 0))]  # rule 1.1
    assert sent(d.offer(Data(staying, 0))) == [(DOWN, Data(staying, 0))]  # rule 1.2
    assert d.whitelist == {leaving}
    assert d.offer(Data(remote, 0)) == [(1, Envelope(0, 0, Data(remote, 0)))]  # rule 2, version attached


def test_collect_phase_moves_a_key_and_sends_done():
    d = Distributor(0, W2)
    leaving, staying = key_where(0, 2), key_where(0, 0)
    assert interrogated(d, {leaving, staying}) == []
    assert d.phase is Phase.COLLECT and d.version == 1 and d.whitelist == {leaving}  # pruned of F' == Local
    assert sent(d.offer(Data(leaving, 1))) == [(DOWN, Data(leaving, 1))]  # rule 1.1
    [(_, collect)] = d.collect(leaving)
    assert d.hold == {leaving: []} and not d.whitelist
    assert d.offer(Data(leaving, 2)) == []  # rule 1.2: buffered
    collect.add_state("source", "cursor 2")
    out = sent(d.processed(collect))
    acquire = out[0][1]
    assert out[0][0] == 2 and isinstance(acquire, Acquire) and acquire.states == {"source": "cursor 2"}
    assert out[1] == (2, Data(leaving, 2))  # the buffered message, after the Acquire
    assert out[2][0] is DOWN and isinstance(out[2][1], Drop)
    assert out[3:] == [(1, Done(0)), (2, Done(0))] and d.finished == {0}
    # The key has left: rule 2 sends its messages to F'(K) (this worker was F(K)).
    assert d.offer(Data(leaving, 3)) == [(2, Envelope(0, 1, Data(leaving, 3)))]
    # Done from the other old worker: finished == W, routing by F' only.
    d.receive(Envelope(1, 1, Done(1)))
    assert d.phase in (Phase.SWITCH, Phase.STEADY) and d.finished >= {0, 1}


def test_rule_3_and_ping_pong_1():
    d = Distributor(2, W2)  # the new worker
    interrogated(d)
    arriving = key_where(0, 2)
    # Rule 3 with a sender other than F(K): the state may still be at F(K).
    assert d.offer(Data(arriving, 0)) == [(0, Envelope(2, 1, Data(arriving, 0)))]
    # F(K) sent it back (its rule 2): it has no state for K, so it goes downstream.
    assert sent(d.receive(Envelope(0, 1, Data(arriving, 0)))) == [(DOWN, Data(arriving, 0))]
    assert d.counts["rule3.sender"] == 1


def test_version_rule_and_ping_pong_2():
    d = Distributor(2, W2)  # has not begun: it routes by F and would send K back to worker 0
    arriving = key_where(0, 2)
    assert d.receive(Envelope(1, 0, Data(arriving, 0))) == [(0, Envelope(2, 0, Data(arriving, 0)))]
    assert sent(d.receive(Envelope(0, 1, Data(arriving, 1)))) == [(DOWN, Data(arriving, 1))]
    assert d.counts["version.pingpong"] == 1
    without = Distributor(2, W2, rules=Rules(version_rule=False))
    assert without.receive(Envelope(0, 1, Data(arriving, 1))) == [(0, Envelope(2, 0, Data(arriving, 1)))]


def test_rule_2_goes_through_the_old_owner_for_keys_never_held_here():
    d = Distributor(1, W2)
    interrogated(d)
    third = key_where(0, 2)  # F = 0, F' = 2, produced at worker 1
    assert d.offer(Data(third, 0)) == [(0, Envelope(1, 1, Data(third, 0)))]
    literal = Distributor(1, W2, rules=Rules(rule2_via_old_owner=False))
    interrogated(literal)
    assert literal.offer(Data(third, 0)) == [(2, Envelope(1, 1, Data(third, 0)))]


def test_regions_discard_icadd_messages_from_upstream():
    d = Distributor(0, W2)
    for message in (Interrogate(), Collect(key="k"), Acquire(key="k"), Drop(key="k")):
        assert d.offer(message) == []


def test_status():
    d = Distributor(0, W2)
    interrogated(d, {key_where(0, 2)})
    assert d.status() == {
        "worker": 0,
        "phase": "collect",
        "version": 1,
        "workers": 2,
        "to_workers": 3,
        "whitelist": 1,
        "hold": 0,
        "finished": [],
        "moved": 0,
        "waiting": 0,
    }


def test_multi_pathing():
    interrogate = Interrogate(copies=2)
    interrogate.add_keys({"a"})
    interrogate.add_keys({"a", "b"})
    assert interrogate.keys == {"a", "b"}  # add_keys is idempotent
    collect = Collect(copies=2, key="a")
    collect.add_state("source", 1)
    collect.add_state("source", 2)
    assert collect.states == {"source": 2}  # the last add_state wins
    acquire = Acquire(key="a", states={"source": 2})
    assert acquire.take("source") == 2 and acquire.take("source") is None  # the first take wins
    drop = Drop(copies=2, key="a")
    assert drop.drop("source") and not drop.drop("source")  # so does the first Drop
    d = Distributor(0, W2, paths=2)
    [(_, copy)] = d.begin(W3)
    assert copy.copies == 2 and d.processed(copy) == [] and d.phase is Phase.INTERROGATE
    d.processed(copy)
    assert d.phase is Phase.COLLECT  # after the last copy only


# -- the simulator -----------------------------------------------------------------------------


@st.composite
def scenarios(
    draw: Callable,
    migrations: tuple[int, int] = (1, 3),
    keys: tuple[int, int] = (1, 8),
    messages: tuple[int, int] = (0, 6),
    rescale_only: bool = False,
) -> Scenario:
    """``W, W', ...`` in 1..5 (one to three migrations in a row), source ids, message
    counts, producers in every layout, 1 or 2 downstream paths, how much flows before each
    trigger, and the scheduler's seed."""
    sizes = [draw(st.integers(1, 5))]
    for _ in range(draw(st.integers(*migrations))):
        size = st.integers(1, 5)
        sizes.append(draw(size.filter(lambda n: n != sizes[-1]) if rescale_only else size))
    ids = draw(st.lists(st.integers(0, 999).map(lambda i: f"src-{i}"), min_size=keys[0], max_size=keys[1], unique=True))
    return Scenario(
        tuple(sizes),
        tuple(ids),
        messages=tuple(draw(st.integers(*messages)) for _ in ids),
        producers=tuple(draw(st.integers(0, min(sizes) - 1)) for _ in ids),
        paths=draw(st.integers(1, 2)),
        trigger=draw(st.integers(0, 10)),
        seed=draw(st.integers(0, 2**32 - 1)),
    )


def test_every_migration_keeps_the_invariants_and_terminates():
    """Invariants after every event (the simulator raises on the first failure), every run
    terminates on F'; both ping-pong cases of ICADD occur, and end."""
    seen: Counter[str] = Counter()

    @settings(max_examples=400, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(scenarios())
    def migrate(scenario: Scenario) -> None:
        result = simulate(scenario)
        seen.update(result.counts)
        seen["runs"] += 1
        seen["keys moved"] += len(result.moved)
        target(float(result.counts["version.pingpong"]), label="ping-pong 2")
        target(float(result.counts["rule3.sender"]), label="ping-pong 1")

    migrate()
    print(
        f"\nICADD simulator: {seen['runs']} runs, {seen['keys moved']} keys moved, "
        f"ping-pong 1 (rule 3, F(K) == sender): {seen['rule3.sender']}, "
        f"ping-pong 2 (version rule): {seen['version.pingpong']}, "
        f"switch-barrier waits: {seen['barrier.wait']}"
    )
    assert seen["rule3.sender"] > 0 and seen["version.pingpong"] > 0
    # With rule 2 through the old owner, the version rule fires only in the ping-pong 2 case.
    assert seen["version.other"] == 0
    assert seen["keys moved"] > 0 and seen["barrier.wait"] > 0


def test_the_live_sequence_2_3_1():
    """The live test's rescale, 2 -> 3 -> 1, with many sources and data all along."""
    ids = tuple(f"file-{i:03d}.log" for i in range(60))
    for seed in range(5):
        result = simulate(
            Scenario(
                (2, 3, 1), ids, messages=(5,) * len(ids), producers=(0,) * len(ids), paths=2, trigger=40, seed=seed
            ),
            max_steps=100_000,
        )
        assert len(result.moved) > len(ids) // 2  # ~1/3 move to the new worker, then all but w0's to w0


MUTATIONS = [
    # (rule switched off, whether the simulator checks for ping-pong, the invariant that breaks)
    ("version_rule", True, "pingpong"),  # a lagging new owner returns K to the old one, again and again
    ("version_rule", False, "order"),  # a message still bouncing is overtaken by the next one
    ("rule3_sender_check", True, "pingpong"),  # new owner -> old owner -> new owner -> ...
    ("rule3_sender_check", False, "order"),
    ("rule2_via_old_owner", True, "state"),  # a lagging new owner starts a second state for K
    ("switch_barrier", True, "order"),  # a message sent directly at the switch overtakes the old route
]


@pytest.mark.parametrize("rule, check_pingpong, kind", MUTATIONS)
def test_each_rule_is_needed(rule: str, check_pingpong: bool, kind: str):
    rules = Rules(**{rule: False})

    def breaks(scenario: Scenario) -> bool:
        try:
            simulate(scenario, rules, check_pingpong=check_pingpong, max_steps=5_000)
        except Violation as violation:
            return violation.kind == kind
        return False

    example = find(
        scenarios(migrations=(1, 1), keys=(3, 10), messages=(2, 8), rescale_only=True),
        breaks,
        settings=settings(
            max_examples=400,
            deadline=None,
            database=None,
            derandomize=True,
            phases=[HPhase.generate],
            suppress_health_check=list(HealthCheck),
        ),
    )
    with pytest.raises(Violation, match=f"^{kind}: "):
        simulate(example, rules, check_pingpong=check_pingpong, max_steps=5_000)
    simulate(example)  # the same run with every rule keeps the invariants
