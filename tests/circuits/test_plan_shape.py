"""Which stateful nodes' deltas a step shares (a local checkpoint, a round trip each) and
which it leaves to the one plan that reads them: pure circuit structure, no Spark."""

import sys
import threading
from concurrent.futures import ThreadPoolExecutor

from circuits import agg
from circuits.circuit import PLANNERS, Circuit, _InOrder
from circuits.context import NodeContext, StepContext

RUNNING = ("run", "sum(v)", "ORDER BY o")


def _window(outputs: int = 0) -> tuple[Circuit, object]:
    circuit = Circuit("shape")
    windowed = circuit.input("t", "k int, o bigint, v int").window(["k"], [RUNNING])
    for i in range(outputs):
        windowed.output(f"w{i}")
    return circuit, windowed


def _once(circuit: Circuit, stream) -> bool:
    return circuit._planned_once()[stream.node]


def test_a_stateful_delta_written_alone_or_through_one_projection_is_planned_once():
    circuit, windowed = _window(outputs=1)
    assert _once(circuit, windowed)
    circuit, windowed = _window()
    windowed.select("k", "run").output("view")
    assert _once(circuit, windowed)
    circuit, windowed = _window()
    windowed.filter("run > 0").output("view")
    assert _once(circuit, windowed)


def test_a_stateful_delta_copied_into_several_plans_or_deeper_is_shared():
    circuit, windowed = _window(outputs=1)  # written, and read by a projection: two plans
    windowed.select("k").output("view")
    assert not _once(circuit, windowed)
    circuit, windowed = _window()  # two readers
    windowed.select("k").output("a")
    windowed.select("run").output("b")
    assert not _once(circuit, windowed)
    circuit, windowed = _window()  # a chain of projections would nest the plan deeper
    windowed.select("k", "run").filter("run > 0").output("view")
    assert not _once(circuit, windowed)
    circuit, windowed = _window()  # read by an operator that may read its input in several terms
    windowed.group_by("k").agg(total=agg.sum("run")).output("view")
    assert not _once(circuit, windowed)
    circuit, windowed = _window()  # a projection read by another operator
    windowed.select("k", "run").group_by("k").agg(total=agg.sum("run")).output("view")
    assert not _once(circuit, windowed)


def test_independent_nodes_are_planned_at_once_and_a_waiting_node_holds_its_readers():
    circuit = Circuit("layers")
    t = circuit.input("t", "k int, v int")
    left, right = t.filter("v > 0"), t.filter("v < 0")
    left.output("l")
    right.select("k").output("r")
    both_running = threading.Barrier(2, timeout=10)
    asked = []

    def planned(node):
        asked.append(node.id)
        if node.id in (left.node, right.node):
            both_running.wait()  # one planned after the other would break the barrier
        return node, None if node.id == right.node else f"delta of {node.id}"  # right waits for keys

    deltas = {}
    with ThreadPoolExecutor(PLANNERS) as pool:
        circuit._plan_layer(pool, planned, deltas)
    assert deltas == {t.node: f"delta of {t.node}", left.node: f"delta of {left.node}"}
    assert sorted(asked) == sorted([t.node, left.node, right.node])  # not right's reader


def test_a_classic_session_plans_in_order_with_the_same_waits():
    circuit = Circuit("layers")
    t = circuit.input("t", "k int, v int")
    waiting = t.filter("v < 0")
    waiting.select("k").output("r")
    ready = t.filter("v > 0")
    ready.output("l")
    deltas = {}
    circuit._plan_layer(_InOrder(), lambda node: (node, None if node.id == waiting.node else node.id), deltas)
    assert sorted(deltas) == sorted([t.node, ready.node])  # not the waiting node's reader


def test_nodes_staging_and_unstaging_in_threads_at_once():
    """Planner threads stage and drop (a deferred node) their deltas in one step at once."""
    step = StepContext(None, None, None, {})
    failed: list[BaseException] = []

    def node(label: str) -> None:
        try:
            for i in range(20_000):
                step.staged[f"{label}.{i % 50}"] = i
                if i % 50 == 49:
                    step.unstage(label)
        except BaseException as e:
            failed.append(e)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch often, as they do waiting on the server
    try:
        threads = [threading.Thread(target=node, args=(label,)) for label in ("a", "b", "c")]
        [t.start() for t in threads]
        [t.join() for t in threads]
    finally:
        sys.setswitchinterval(interval)
    assert not failed
    assert step.staged == {}


class _CountingStep(StepContext):
    """A step whose shared frames are names, counted as they are computed."""

    def share(self, df, empty):
        self.shared.append(df)
        return f"shared {df}"


def test_a_node_planned_again_after_waiting_for_keys_reads_what_it_shared_before_it_waited():
    step = _CountingStep(None, None, None, {})
    first = NodeContext(step, "n1_aggregate")
    assert first.share("before") == "shared before"
    first.deferred = True  # a lookup asked for keys not collected yet
    assert first.share("after") == "after"  # dropped, not computed
    first.wait()
    again = NodeContext(step, "n1_aggregate")
    assert again.share("before, planned again") == "shared before"
    assert again.share("after") == "shared after"
    assert step.shared == ["before", "after"]  # each computed once
    assert NodeContext(step, "n2_join").share("other") == "shared other"  # another node's are its own
