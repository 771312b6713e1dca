"""A lookup into a large trace reads only the files whose statistics admit the step's keys."""

from __future__ import annotations

import os
from collections import Counter

import pyarrow as pa
import pytest

from circuits import Circuit, from_rows
from circuits.library import nexmark_circuit
from storage import database
from storage.database import may_hold
from storage.delta import add_actions, open_table
from storage.logs import Range
from storage.pipeline import Pipeline

from . import workload


def _adds(**columns: list) -> pa.Table:
    return pa.table({"path": [f"f{i}" for i in range(len(next(iter(columns.values()))))], **columns})


def test_a_file_is_held_when_a_listed_value_lies_within_its_bounds_in_every_named_column():
    adds = _adds(
        **{
            "min.k": [0, 10, 20, None],
            "max.k": [9, 19, 29, None],
            "null_count.k": [0, 0, 1, 5],
            "min.s": ["a", "m", "a", "a"],
            "max.s": ["l", "z", "z", "z"],
        }
    )
    assert may_hold(adds, {"k": pa.array([12, 35])}) == [False, True, False, True]
    assert may_hold(adds, {"k": pa.array([5, 15]), "s": pa.array(["n"])}) == [False, True, False, True]
    assert may_hold(adds, {"k": pa.array([40, None])}) == [False, False, True, True]  # a listed null matches nulls
    assert may_hold(adds, {"k": pa.array([], pa.int64())}) == [False, False, False, True]
    assert may_hold(adds, {"v": pa.array([1])}) == [True] * 4  # no statistics of v: every file may hold it


def _join():
    circuit = Circuit("pruned")
    left = circuit.input("left", "k bigint, a bigint")
    right = circuit.input("right", "k bigint, b bigint")
    left.join(right, "k").output("joined")
    return circuit


def _bounds(root: str) -> dict[str, tuple[int, int]]:
    """Every file of the join's traces (by name) with its keys' min and max."""
    bounds = {}
    for name in os.listdir(os.path.join(root, "state")):
        adds = add_actions(open_table(os.path.join(root, "state", name)))
        lows, highs = adds.column("min.k").to_pylist(), adds.column("max.k").to_pylist()
        bounds.update(zip(adds.column("path").to_pylist(), zip(lows, highs, strict=True), strict=True))
    return bounds


def test_a_step_reads_only_the_trace_files_that_may_hold_its_keys_and_the_join_is_right(spark, tmp_path, monkeypatch):
    monkeypatch.setattr(database, "SMALL_TRACE_ROWS", 0)  # every trace is looked up by its keys
    read: list[str] = []
    reading = database.read_files

    def recorded(spark, uri, schema, paths, version=None):
        read.extend(p.rsplit("/", 1)[-1] for p in paths)
        return reading(spark, uri, schema, paths, version)

    monkeypatch.setattr(database, "read_files", recorded)
    root = str(tmp_path / "pruned")
    # Steps 0-2 insert keys 100s..100s+9 on both sides; step 3 two new keys and one of step 0's.
    steps = [[100 * s + i for i in range(10)] for s in range(3)] + [[300, 301, 5]]
    expected = Counter()
    for step, keys in enumerate(steps):
        before = _bounds(root) if step else {}
        rows = [(k, step, 1) for k in keys]
        inputs = {side: from_rows(spark, rows, f"k bigint, {c} bigint") for side, c in (("left", "a"), ("right", "b"))}
        pipeline = Pipeline(spark, root, _join(), workers=2)
        pipeline.submit(step, inputs, [Range("r", 0, step, step + 1)])
        del read[:]
        pipeline.run()
        for k in keys:
            expected[(k, step, step)] += 1
            for earlier, old in enumerate(steps[:step]):
                expected[(k, step, earlier)] += old.count(k)
                expected[(k, earlier, step)] += old.count(k)
    # Of the files before step 3, it read those whose keys' bounds admit one of 300, 301, 5: of step 0's.
    admitting = {path for path, (low, high) in before.items() if any(low <= k <= high for k in steps[3])}
    assert admitting and len(admitting) < len(before)
    assert set(read) & set(before) == admitting
    joined = Counter()
    for r in pipeline.read_outputs("joined", 0, 3).collect():
        joined[(r["k"], r["a"], r["b"])] += r["_weight"]
    assert +joined == +expected


def _demo_outputs(spark, root: str, steps: int) -> dict[str, Counter]:
    """The demo circuit's four views after ``steps`` steps of Nexmark events with deletes."""
    pipeline = Pipeline(spark, root, nexmark_circuit("pruned"), workers=2)
    for step in range(steps):
        pipeline.submit(step, workload.inputs(spark, 3, step), [Range("n", 0, step, step + 1)])
    pipeline.run()
    views = {}
    for view in ("bids_by_category", "q3", "q4", "q15"):
        rows = pipeline.read_outputs(view, 0, steps - 1).drop("_step").collect()
        integral = Counter()
        for r in rows:
            integral[tuple(round(v, 6) if isinstance(v, float) else v for v in r[:-1])] += r["_weight"]
        views[view] = +integral
    return views


@pytest.mark.slow
def test_the_demo_views_are_the_same_with_every_lookup_pruned_and_a_pruned_lookup_skips_files(
    spark, tmp_path, monkeypatch
):
    expected = _demo_outputs(spark, str(tmp_path / "in-place"), 4)
    monkeypatch.setattr(database, "SMALL_TRACE_ROWS", 0)
    scanned, kept = [], []
    scan_keys = database.DeltaStateStore.scan_keys

    def counted(self, table, keys):
        scanned.append(len(database.paths(self._pinned(table))))
        trace = scan_keys(self, table, keys)
        kept.append(len(trace.inputFiles()))
        return trace

    monkeypatch.setattr(database.DeltaStateStore, "scan_keys", counted)
    assert _demo_outputs(spark, str(tmp_path / "pruned"), 4) == expected
    assert sum(kept) < sum(scanned)
