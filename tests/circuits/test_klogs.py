"""KLogs pipelines (docs/klogs.md) against a plain sequential Python fold (hypothesis).

Random messages over random keys of two named logs, with random timestamps (a
producer's clock may go back), cut into random steps: per key, the sink receives exactly
what a sequential fold over that key's messages emits (messages of a step in (timestamp
made monotonic per partition, source log, partition, offset) order), at 1, 2 and 4
workers, with a restart on a different number of workers (a rescale) part way.
Every message of a fan-out has its own position (a sink's token); a user function's
identity covers what it closes over and the globals it names.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import types
from collections import defaultdict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from circuits import InMemoryStateStore, Layout, StepRunner, from_rows
from circuits.klogs import DEAD_LETTERS, RECORD_SCHEMA, KLog, deploy, merge, messages
from circuits.library.orders import ORDERS, order_workflow
from circuits.operators.keyed import KLogsError, function_id

LOGS = ("events-a", "events-b")


def route(key, value):
    """Re-keys by lower case, copies every third value to "all", drops 7; refuses 8."""
    if value == 8:
        raise KeyError(f"eight for {key}")
    if value == 7:
        return []
    return [key.lower()] + (["all"] if value % 3 == 0 else [])


def step_fn(state, key, value):
    """A running sum and count; emits the sum, and the count for odd values; refuses 5."""
    if value == 5:
        raise ValueError(f"five for {key}")
    total, n = state[0] + value, state[1] + 1
    return [total, n], [total] + ([n] if value % 2 else [])


def pipeline_circuit():
    a, b = KLog.named(LOGS[0]), KLog.named(LOGS[1])

    def pipeline():
        merge([a, b]).partition(route).loop([0, 0], step_fn).sink(print)

    return deploy(pipeline, "klogs_test")


messages_strategy = st.lists(
    st.tuples(
        st.integers(0, 1), st.sampled_from(["A", "a", "B", "c", "C"]), st.integers(0, 9), st.none() | st.integers(0, 5)
    ),
    max_size=24,
)


@st.composite
def split_messages(draw):
    msgs = draw(messages_strategy)
    cuts = sorted(draw(st.sets(st.integers(0, len(msgs)), max_size=3)))
    bounds = [0, *cuts, len(msgs)]
    return msgs, [msgs[i:j] for i, j in zip(bounds, bounds[1:])], draw(st.integers(0, 3))


def records(steps):
    """Each step's input rows per log: a key goes to one partition, offsets count up;
    timestamps as drawn (None: the record has none)."""
    offsets = defaultdict(int)
    out = []
    for step in steps:
        rows = defaultdict(list)
        for src, key, value, timestamp in step:
            partition = ord(key[0].lower()) % 2
            offset = offsets[src, partition]
            offsets[src, partition] += 1
            rows[LOGS[src]].append((json.dumps(key), json.dumps(value), partition, offset, timestamp, 1))
        out.append(rows)
    return out


def oracle(steps_records):
    """Per new key, what a sequential fold emits, and the dead letters (stage, key, ord)."""
    states, emitted, dead = {}, defaultdict(list), set()
    for rows in steps_records:
        step_messages, newest = [], defaultdict(int)  # (log, partition): the largest timestamp so far
        for src, name in enumerate(LOGS):
            for key, value, partition, offset, timestamp, _ in rows.get(name, []):
                newest[src, partition] = max(newest[src, partition], timestamp or 0)
                if json.loads(value) == 8:
                    dead.add(("partition_1", key, (src, partition, offset)))
                    continue
                for new_key in route(json.loads(key), json.loads(value)):
                    step_messages.append(((newest[src, partition], src, partition, offset), new_key, json.loads(value)))
        for ord_, key, value in sorted(step_messages):
            ord_ = ord_[1:]
            try:
                state, out = step_fn(states.get(key, [0, 0]), key, value)
            except ValueError:
                dead.add(("loop_2", json.dumps(key), ord_))
                continue
            states[key] = state
            emitted[key] += out
    return dict(emitted), dead


def run(spark, steps_records, workers, restart_at):
    """Runs the steps; from ``restart_at`` a new runner on the same state with one more worker."""
    circuit = pipeline_circuit()
    sink = next(iter(circuit.sinks))
    store = InMemoryStateStore(small_traces=workers == 2)
    runner = StepRunner(circuit, spark, store, workers=workers)
    emitted, dead = defaultdict(list), set()
    for t, rows in enumerate(steps_records):
        if t == restart_at:
            runner = StepRunner(circuit, spark, store, layout=Layout.balanced(circuit.vnodes, workers + 1))
        inputs = {name: from_rows(spark, r, RECORD_SCHEMA) for name, r in rows.items() if r}
        out = runner.step(inputs, rows=sum(map(len, rows.values())) if t % 2 == 0 else None).collect_outputs()
        for key, value, _ in messages(out[sink]):
            emitted[key].append(value)
        for stage, key, _, ord_, reason, w in out[DEAD_LETTERS]:
            assert w == 1 and reason.startswith(
                {"loop_2": "ValueError: five", "partition_1": "KeyError: 'eight"}[stage]
            )
            dead.add((stage, key, tuple(ord_[1:4])))
    return dict(emitted), dead


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2, 4])
@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
@given(split=split_messages())
def test_loop_equals_a_sequential_fold(spark, workers, split):
    _, steps, restart_at = split
    steps_records = records(steps)
    assert run(spark, steps_records, workers, restart_at) == oracle(steps_records)


@pytest.mark.parametrize(
    "build, error",
    [
        (lambda log: log.loop(0, lambda s, k, v: ({s}, [])), 'stage loop_1: the state of key "k" is a set'),
        (lambda log: log.partition(lambda k, v: [(k, b"x")]), 'stage partition_1: the new key of key "k" is a tuple'),
    ],
    ids=["state", "key"],
)
def test_an_unserialisable_state_or_key_names_the_stage_key_and_type(spark, build, error):
    def pipeline():
        build(KLog.named("log")).sink(print)

    runner = StepRunner(deploy(pipeline, "bad_json"), spark, InMemoryStateStore())
    with pytest.raises(KLogsError, match=f"^{error}, not JSON-serialisable"):  # the project's error, not Spark's text
        runner.step({"log": from_rows(spark, [('"k"', "1", 0, 0, None, 1)], RECORD_SCHEMA)})


def test_an_unserialisable_initial_state_is_refused_when_deployed(spark):  # building needs a session
    def pipeline():
        KLog.named("log").loop(object(), lambda s, k, v: (s, [])).sink(print)

    with pytest.raises(KLogsError, match="initial state"):
        deploy(pipeline, "bad_init")


@pytest.mark.slow
def test_the_order_workflow_moves_each_order_on_and_reports_invalid_transitions(spark):
    circuit = order_workflow()
    runner = StepRunner(circuit, spark, InMemoryStateStore(), workers=2)
    events = [("o1", "created"), ("o2", "paid"), ("o1", "paid"), ("o2", "created"), ("o1", "shipped"), ("o1", "paid")]
    reports = defaultdict(list)
    for step in ([0, 1, 2], [3], [4, 5]):  # o1's events in three steps, o2's in two
        rows = [(json.dumps(events[i][0]), json.dumps({"event": events[i][1]}), 0, i, 1000 + i, 1) for i in step]
        out = runner.step({ORDERS: from_rows(spark, rows, RECORD_SCHEMA)}).collect_outputs()
        for key, report, _ in messages(out[next(iter(circuit.sinks))]):
            reports[key].append(report)
    assert reports == {
        "o1": [
            {"order": "o1", "status": "created"},
            {"order": "o1", "status": "paid"},
            {"order": "o1", "status": "shipped"},
            {"order": "o1", "invalid": "paid", "status": "shipped"},
        ],
        "o2": [{"order": "o2", "invalid": "paid", "status": None}, {"order": "o2", "status": "created"}],
    }


def counts_of_words(log: KLog) -> None:
    log.partition(lambda doc, text: text.split()).loop(0, lambda n, word, _: (n + 1, [n + 1])).sink(print)


@pytest.mark.parametrize(
    "build",
    [counts_of_words, lambda log: counts_of_words(merge([log, log.partition(lambda k, v: [k])]))],
    ids=["fan-out", "merged-with-its-own-copy"],
)
def test_every_message_of_a_fan_out_has_its_own_position(spark, build):
    runner = StepRunner(deploy(lambda: build(KLog.named("docs")), "fan_out"), spark, InMemoryStateStore())
    out = runner.step(
        {"docs": from_rows(spark, [('"doc1"', '"a a b"', 0, 0, None, 1)], RECORD_SCHEMA)}
    ).collect_outputs()
    got = messages(out[next(k for k in out if k.startswith("sink"))])
    per_key = defaultdict(list)
    for key, value, _ in got:
        per_key[key].append(value)
    copies = len(got) // 3  # each word once per path to the sink
    assert per_key == {"a": list(range(1, 2 * copies + 1)), "b": list(range(1, copies + 1))}
    assert len({ord_[1:] for _, _, ord_ in got}) == len(got)  # a sink token's offset: unique


def make_adder(n):
    return lambda s, k, v: (s + n, [s + n])


LIMIT = 10


def under_limit(s, k, v):
    return (s, [v] if v < LIMIT else [])


def calls_under_limit(s, k, v):
    return under_limit(s, k, v)


def test_a_function_id_covers_what_the_function_closes_over_and_the_globals_it_names():
    assert function_id(make_adder(1)) == function_id(make_adder(1))
    assert function_id(make_adder(1)) != function_id(make_adder(100))
    assert function_id(functools.partial(under_limit, 1)) == function_id(functools.partial(under_limit, 1))
    assert function_id(functools.partial(under_limit, 1)) != function_id(functools.partial(under_limit, 2))
    moved = types.FunctionType(under_limit.__code__, {**under_limit.__globals__, "LIMIT": 20}, "under_limit")
    moved.__qualname__ = under_limit.__qualname__
    assert function_id(moved) != function_id(under_limit)
    calls_moved = types.FunctionType(calls_under_limit.__code__, {**under_limit.__globals__, "under_limit": moved})
    assert function_id(calls_moved) != function_id(calls_under_limit)  # a helper's globals count too


def test_a_function_id_is_the_same_in_every_process():
    """A comprehension is a nested code object, whose repr holds its memory address."""
    script = (
        "from circuits.operators.keyed import function_id\n"
        "def words(k, v): return [w.lower() for w in v.split() if len(w) > 1]\n"
        "print(function_id(words))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    runs = [
        subprocess.run([sys.executable, "-c", script], env=env, check=True, capture_output=True, text=True)
        for _ in range(3)
    ]
    ids = {run.stdout for run in runs}
    assert len(ids) == 1, ids
