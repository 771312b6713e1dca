"""Which stateful nodes' deltas a step shares (a local checkpoint, a round trip each) and
which it leaves to the one plan that reads them: pure circuit structure, no Spark."""

from circuits import agg
from circuits.circuit import Circuit

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
