"""Runs a circuit step by step and compares it with an oracle at every step."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from circuits import InMemoryStateStore, StepRunner, from_rows
from circuits.circuit import Circuit
from circuits.runner import SMALL_STEP_ROWS
from circuits.sql import View, batch_views, compile_sql, parse_views
from circuits.zset import WEIGHT
from storage.faults import InjectedCrash
from storage.logs import STEP, Range
from storage.pipeline import Pipeline

from ..oracle import add_into, zset

Delta = list[tuple]  # rows whose last element is the weight
Expected = Callable[[int, list[dict[str, Counter]], dict[str, Counter]], dict[str, tuple[str, Counter]]]


def run_and_compare(
    spark, circuit: Circuit, steps: list[dict[str, Delta]], workers: int, expected: Expected, compiled: bool = False
) -> None:
    """At every step, each output must match ``expected``: ``("integral", Z)`` compares the
    integral of the output so far with Z; ``("step", Z)`` compares this step's output.
    ``compiled``: see :func:`in_memory_outputs`."""
    compare(circuit, steps, workers, expected, in_memory_outputs(spark, circuit, steps, workers, compiled))


def run_and_compare_durably(
    spark,
    circuit: Circuit,
    steps: list[dict[str, Delta]],
    workers: int,
    expected: Expected,
    root: str,
    restart: Restart,
) -> None:
    """:func:`run_and_compare` over a real :class:`Pipeline` on Delta at ``root``, one
    checkpoint per step, restarted as ``restart`` says."""
    compare(circuit, steps, workers, expected, durable_outputs(spark, circuit, steps, workers, root, restart))


def compare(
    circuit: Circuit,
    steps: list[dict[str, Delta]],
    workers: int,
    expected: Expected,
    produced_steps: Iterable[dict[str, list[tuple]]],
) -> None:
    """Checks each step's outputs (``produced_steps``, one dict per step, consumed in
    order so that a failure names the first wrong step) against ``expected``."""
    integrated = {name: Counter() for name in circuit.inputs}
    deltas: list[dict[str, Counter]] = []
    outputs = {name: Counter() for name in circuit.outputs}
    for t, (step, produced) in enumerate(zip(steps, produced_steps, strict=True)):
        deltas.append({name: zset(step.get(name, [])) for name in circuit.inputs})
        for name, delta in deltas[-1].items():
            add_into(integrated[name], delta)
        for name, (mode, want) in expected(t, deltas, integrated).items():
            got = zset(produced[name])
            assert sum(1 for *row, _ in produced[name]) == len(got), f"step {t}: output {name} is not consolidated"
            if mode == "integral":
                add_into(outputs[name], got)
                got = outputs[name]
            assert got == want, (
                f"step {t}, workers={workers}, output {name!r} ({mode}):\n"
                f"  missing: {dict(want - got)}\n  extra:   {dict(got - want)}"
            )


def in_memory_outputs(
    spark, circuit: Circuit, steps: list[dict[str, Delta]], workers: int, compiled: bool = False
) -> Iterator[dict]:
    """Each step's outputs, run on an in-memory state.  Even steps run in one partition, as a
    small step does; odd steps are planned across the workers, as a large one is: the two
    kinds of step read each other's state.  Where ``compiled``, odd steps also compile their
    code, as a large step does; else they interpret it.  The operator and Nexmark tests
    compile (every operator family); the SQL tests, whose views plan to the same operators,
    interpret: compiling their many views' code took 40% of their time."""
    # At 2 workers lookups shuffle whole traces, at 1 and 4 they broadcast the step's keys:
    # every property test covers both ways of reading state, in both kinds of step.
    runner = StepRunner(circuit, spark, InMemoryStateStore(small_traces=workers == 2), workers=workers)
    for t, step in enumerate(steps):
        rows = sum(len(r) for r in step.values())
        runner.small_step_rows = SMALL_STEP_ROWS if t % 2 == 0 else 0
        known = t % 2 == 0 or not compiled  # a step of unknown size compiles
        yield runner.step(inputs_of(spark, circuit, step), rows=rows if known else None).collect_outputs()


def inputs_of(spark, circuit: Circuit, step: dict[str, Delta]) -> dict:
    return {name: from_rows(spark, rows, circuit.inputs[name]) for name, rows in step.items() if rows}


@dataclass(frozen=True)
class Restart:
    """Where a durable run is restarted: a new :class:`Pipeline` on the same root runs
    ``step``, after the old one either stopped cleanly before it (``fault`` None) or died
    inside it at the fault point ``fault`` (:mod:`storage.faults`)."""

    step: int
    fault: str | None


RESTART_FAULTS = ("after_output", "during_commit", None)  # points every step reaches


@st.composite
def with_restart(draw, steps: st.SearchStrategy):
    """Steps (drawn from ``steps``) and a :class:`Restart` at one of them."""
    drawn = draw(steps)
    return drawn, Restart(draw(st.integers(0, len(drawn) - 1)), draw(st.sampled_from(RESTART_FAULTS)))


def durable_outputs(
    spark, circuit: Circuit, steps: list[dict[str, Delta]], workers: int, root: str, restart: Restart
) -> Iterator[dict]:
    """Each step's outputs as a real pipeline writes them to its output log on Delta."""
    pipeline = Pipeline(spark, root, circuit, workers=workers)
    for t, step in enumerate(steps):
        pipeline.submit(t, inputs_of(spark, circuit, step), [Range("steps", 0, t, t + 1)])
        if t == restart.step:
            if restart.fault:
                with failing_at(restart.fault, t), pytest.raises(InjectedCrash):
                    pipeline.run(through=t)
            pipeline = Pipeline(spark, root, circuit, workers=workers)  # recovery: opens the last checkpoint
        pipeline.run(through=t)
        yield {name: logged_rows(pipeline, name, t) for name in circuit.outputs}


@contextmanager
def failing_at(point: str, step: int) -> Iterator[None]:
    """Within the block, reaching ``point`` at ``step`` raises :class:`InjectedCrash`."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("DBSP_FAULT", f"{point}:{step}")
        env.setenv("DBSP_FAULT_MODE", "raise")
        yield


def logged_rows(pipeline: Pipeline, output: str, step: int) -> list[tuple]:
    """``step``'s rows of ``output`` in the output log: the user's columns, then the weight."""
    return [
        (*(v for k, v in row.asDict().items() if k not in (WEIGHT, STEP)), row[WEIGHT])
        for row in pipeline.outputs.read(output, step, step).collect()
    ]


@st.composite
def insert_delete_steps(draw, inputs: Mapping[str, st.SearchStrategy], max_steps: int = 4, max_rows: int = 6):
    """Steps of random inserts, and deletes of rows that exist (sometimes all of them)."""
    present = {name: Counter() for name in inputs}
    steps = []
    for _ in range(draw(st.integers(1, max_steps))):
        step = {}
        for name, rows in inputs.items():
            if draw(st.integers(0, 3)) == 0:
                # Absent from the step, so known to be empty: operators over it plan less.
                step[name] = []
                continue
            inserts = draw(st.lists(rows, max_size=max_rows))
            existing = sorted(present[name].elements(), key=repr)
            if existing and draw(st.integers(0, 5)) == 0:
                deletes = existing  # delete everything
            elif existing:
                picked = draw(st.sets(st.integers(0, len(existing) - 1), max_size=4))
                deletes = [existing[i] for i in sorted(picked)]
            else:
                deletes = []
            present[name].update(inserts)
            present[name].subtract(deletes)
            present[name] = +present[name]
            step[name] = [(*r, 1) for r in inserts] + [(*r, -1) for r in deletes]
        steps.append(step)
    return steps


SQL_WORKERS = (1, 2)
"""The worker counts of the SQL property tests.  A view compiles to the same operators at
every worker count; the operators' exchange at more workers than that is what the
operator and Nexmark view property tests check at 1, 2 and 4."""

DURABLE_WORKERS = (2,)
"""The worker count of a durable twin (a pipeline on Delta, dying and recovering, about a
minute an example) of a property test that runs at :data:`SQL_WORKERS` in memory: what
the twin adds is the restart."""


def at_every_worker_count(steps: st.SearchStrategy, max_examples: int = 3, workers: tuple[int, ...] = (1, 2, 4)):
    """A property test over random ``steps``, run at each of ``workers``.

    Each example runs a real Spark step per generated step, so examples are few; the
    strategies are built to make each one count (collisions, nulls, deletes of all).
    """

    def decorate(test):
        test = given(steps=steps)(test)
        test = settings(max_examples=max_examples, deadline=None, suppress_health_check=list(HealthCheck))(test)
        return pytest.mark.parametrize("workers", workers)(test)

    return decorate


# Views compiled from SQL, against Spark batch SQL of the same text.

SQL_SCHEMAS = {"a": "k int, v int, s string", "b": "k bigint, x int, d double"}
"""The inputs of the SQL property tests' views."""

_keys = st.one_of(st.just(1), st.integers(0, 3), st.none())
_small = st.one_of(st.integers(0, 4), st.none())
a_rows = st.tuples(_keys, _small, st.sampled_from(["a", "b", None]))
b_rows = st.tuples(_keys, _small, st.one_of(st.sampled_from([-1.5, 0.0, 2.25]), st.none()))
SQL_STEPS = insert_delete_steps({"a": a_rows, "b": b_rows}, max_steps=3, max_rows=5)
"""Inserts and deletes of ``a`` and ``b`` rows: few keys (collisions), NULLs, duplicates."""
SQL_DURABLE_STEPS = with_restart(insert_delete_steps({"a": a_rows, "b": b_rows}, max_steps=3, max_rows=4))


def spark_batch(spark, views: list[View], integrated) -> dict[str, Counter]:
    """Each materialized view by Spark batch SQL of its own text over the integrated inputs."""
    for name, schema in SQL_SCHEMAS.items():
        rows = [row for row, w in integrated[name].items() for _ in range(w)]
        spark.createDataFrame(rows, schema).createOrReplaceTempView(name)
    results = {}
    for view in views:
        df = spark.sql(view.text)
        df.createOrReplaceTempView(view.name)
        if view.materialized:
            results[view.name] = zset((*row, 1) for row in df.collect())
    return results


def batch_integrals(spark, text: str) -> Expected:
    """The oracle: at every step, each view's integral is Spark batch SQL of its text."""
    views = parse_views(text)

    def expected(t, deltas, integrated):
        return {name: ("integral", z) for name, z in spark_batch(spark, views, integrated).items()}

    return expected


def tie_broken_batch_integrals(
    spark, text: str, schemas: Mapping[str, str], spark_row: Callable[[tuple], tuple] = tuple
) -> Expected:
    """The oracle: at every step, each view's integral is Spark batch SQL of its text, with
    the engine's tie-break (see :func:`circuits.sql.batch_views`), over the integrated
    inputs of ``schemas``; ``spark_row`` gives an integrated row as Spark takes it."""

    def expected(t, deltas, integrated):
        tables = {
            name: spark.createDataFrame(
                [spark_row(row) for row, w in integrated[name].items() for _ in range(w)], schema
            )
            for name, schema in schemas.items()
        }
        views = batch_views(spark, text, tables)
        return {name: ("integral", zset((*row, 1) for row in df.collect())) for name, df in views.items()}

    return expected


def equals_spark_batch(spark, text: str, circuit: Circuit, steps, workers: int) -> None:
    """Runs ``circuit``, compiled from ``text``: at every step, the integral of each
    view's outputs equals Spark batch SQL of the view's own text over the integrated inputs."""
    run_and_compare(spark, circuit, steps, workers, batch_integrals(spark, text))


def equals_spark_batch_durably(spark, text: str, circuit: Circuit, steps, workers: int, tmp_path_factory) -> None:
    """:func:`equals_spark_batch` over a real pipeline on Delta, restarted at the step
    that ``steps`` (steps, :class:`Restart`) names."""
    steps, restart = steps
    root = str(tmp_path_factory.mktemp("sql"))
    run_and_compare_durably(spark, circuit, steps, workers, batch_integrals(spark, text), root, restart)


def sql_views(text: str, name: str = "circuit"):
    """A fixture named ``name``: the views of ``text`` over :data:`SQL_SCHEMAS`, compiled
    once for every test and example of the module (each runs it on a new state)."""

    @pytest.fixture(scope="module", name=name)
    def circuit(spark):
        return compile_sql(text, SQL_SCHEMAS, spark)

    return circuit


def equal_to_spark_batch_sql(text: str, max_examples: int = 2):
    """A property test of the module's ``circuit`` (see :func:`sql_views`) of ``text``: at
    :data:`SQL_WORKERS`, at every step of random inserts and deletes (:data:`SQL_STEPS`),
    each view's integral equals Spark batch SQL of its text (the test's docstring says so)."""

    @pytest.mark.slow
    @at_every_worker_count(SQL_STEPS, max_examples=max_examples, workers=SQL_WORKERS)
    def test(spark, circuit, workers, steps):
        equals_spark_batch(spark, text, circuit, steps, workers)

    workers = " and ".join(map(str, SQL_WORKERS))
    test.__doc__ = f"Every view equals Spark batch SQL of its text at every step, at {workers} workers."
    return test


def durably_equal_to_spark_batch_sql(text: str, doc: str, fixed: tuple, max_examples: int = 2):
    """:func:`equal_to_spark_batch_sql` over a real pipeline on Delta at :data:`DURABLE_WORKERS`, which
    dies (or stops) at a random step and recovers: ``fixed`` (steps, :class:`Restart`) is
    an example of its own, run first (hypothesis's first is the simplest: one empty step)."""

    @pytest.mark.slow
    @at_every_worker_count(SQL_DURABLE_STEPS, max_examples=max_examples, workers=DURABLE_WORKERS)
    @example(steps=fixed)
    def test(spark, circuit, tmp_path_factory, workers, steps):
        equals_spark_batch_durably(spark, text, circuit, steps, workers, tmp_path_factory)

    test.__doc__ = doc
    return test


def tie_broken_equal_to_spark_batch_sql(text: str, doc: str, fixed: list, max_examples: int = 2):
    """A property test of the module's ``circuit`` of ``text`` at :data:`SQL_WORKERS`:
    at every step of :data:`SQL_STEPS`, each view's integral equals Spark batch SQL of its
    text with the engine's tie-break (:func:`tie_broken_batch_integrals`); ``fixed`` (steps)
    is an example of its own, run first."""

    @pytest.mark.slow
    @at_every_worker_count(SQL_STEPS, max_examples=max_examples, workers=SQL_WORKERS)
    @example(steps=fixed)
    def test(spark, circuit, workers, steps):
        run_and_compare(spark, circuit, steps, workers, tie_broken_batch_integrals(spark, text, SQL_SCHEMAS))

    test.__doc__ = doc
    return test


def joins_of(circuit, view: str) -> list:
    """The joins upstream of ``view``'s output."""
    from circuits.operators import Join, KeyedJoin

    seen, todo = set(), [circuit.outputs[view]]
    while todo:
        node = circuit.nodes[todo.pop()]
        if node.id not in seen:
            seen.add(node.id)
            todo.extend(node.inputs)
    return [circuit.nodes[i] for i in sorted(seen) if isinstance(circuit.nodes[i].operator, (Join, KeyedJoin))]
