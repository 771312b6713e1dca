"""A lookup into a large trace reads only the files whose statistics admit the step's keys."""

from __future__ import annotations

import os
from collections import Counter
from contextlib import contextmanager

import pyarrow as pa
import pytest

from circuits import Circuit, agg, context, from_rows, runner
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


def _bounds(root: str, side: str) -> dict[str, tuple[int, int]]:
    """Every file of the join's trace of ``side`` (by name) with its keys' min and max."""
    adds = add_actions(open_table(os.path.join(root, "state", _trace_name(root, side))))
    lows, highs = adds.column("min.k").to_pylist(), adds.column("max.k").to_pylist()
    return dict(zip(adds.column("path").to_pylist(), zip(lows, highs, strict=True), strict=True))


def _recorded_reads(monkeypatch, by_spark: list[str] | None = None) -> list[str]:
    """The names of the data files the store reads from here on (by Spark or by the process),
    appended as it reads them; those Spark reads also to ``by_spark``."""
    read: list[str] = []
    reading, matching = database.read_files, database.read_matching

    def recorded(spark, uri, schema, paths, version=None):
        read.extend(p.rsplit("/", 1)[-1] for p in paths)
        (by_spark if by_spark is not None else []).extend(p.rsplit("/", 1)[-1] for p in paths)
        return reading(spark, uri, schema, paths, version)

    def matched(uri, schema, paths, keys, limit):
        read.extend(p.rsplit("/", 1)[-1] for p in paths)
        return matching(uri, schema, paths, keys, limit)

    monkeypatch.setattr(database, "read_files", recorded)
    monkeypatch.setattr(database, "read_matching", matched)
    return read


def _join_step(spark, root: str, step: int, left: list[int], right: list[int]) -> Pipeline:
    """Runs step ``step`` of :func:`_join` inserting keys ``left`` and ``right`` (columns a and b: the step)."""
    inputs = {
        side: from_rows(spark, [(k, step, 1) for k in keys], f"k bigint, {c} bigint")
        for side, c, keys in (("left", "a", left), ("right", "b", right))
    }
    pipeline = Pipeline(spark, root, _join(), workers=2)
    pipeline.submit(step, inputs, [Range("r", 0, step, step + 1)])
    pipeline.run()
    return pipeline


def _assert_joined(pipeline: Pipeline, steps: list[tuple[list[int], list[int]]]) -> None:
    """The integral of :func:`_join`'s output after ``steps`` (left and right keys by step)
    is the join of every step's left keys with every step's right keys."""
    expected = Counter()
    for left_step, (left, _) in enumerate(steps):
        for right_step, (_, right) in enumerate(steps):
            expected.update((k, left_step, right_step) for k in left if k in right)
    joined = Counter()
    for r in pipeline.read_outputs("joined", 0, len(steps) - 1).collect():
        joined[(r["k"], r["a"], r["b"])] += r["_weight"]
    assert +joined == expected


def test_a_join_reads_only_the_trace_files_that_may_hold_the_other_sides_keys_and_is_right(
    spark, tmp_path, monkeypatch
):
    monkeypatch.setattr(database, "SMALL_TRACE_ROWS", 0)  # every trace is looked up by its keys
    read = _recorded_reads(monkeypatch)
    root = str(tmp_path / "pruned")
    # Steps 0-2 insert keys 100s..100s+9 on both sides; step 3 a new key and an old one on each.
    steps = [([100 * s + i for i in range(10)],) * 2 for s in range(3)] + [([300, 5], [301, 205])]
    for step, (left, right) in enumerate(steps):
        before = {side: _bounds(root, side) for side in ("left", "right")} if step else {}
        del read[:]
        pipeline = _join_step(spark, root, step, left, right)
    # Each trace is read for the other side's keys: of its files before step 3, those whose
    # bounds admit one (the left trace's of step 2, for 205; the right trace's of step 0, for 5).
    for side, keys in (("left", steps[3][1]), ("right", steps[3][0])):
        admitting = {path for path, (low, high) in before[side].items() if any(low <= k <= high for k in keys)}
        assert admitting and set(read) & set(before[side]) == admitting, side
    _assert_joined(pipeline, steps)


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


def test_a_large_write_is_cut_into_files_by_the_lookup_key_and_a_lookup_reads_only_those_holding_its_key(
    spark, tmp_path, monkeypatch
):
    monkeypatch.setattr(database, "SMALL_TRACE_ROWS", 0)
    monkeypatch.setattr(database, "CLUSTER_ROWS", 10)
    read = _recorded_reads(monkeypatch)
    root = str(tmp_path / "cut")
    # Step 0 inserts keys 0..99 on the left (its per-worker files span every key unless
    # cut); step 1 one old key on the right, whose lookup of the left trace follows.
    steps = [(list(range(100)), [1000]), ([], [37])]
    for step, (left, right) in enumerate(steps):
        del read[:]
        pipeline = _join_step(spark, root, step, left, right)
        if step == 0:
            bounds = _bounds(root, "left")
    # The load's left trace: files of at most 10 rows of a worker's keys, in key order, so
    # that key 37 lies within the bounds of one file per worker at most (of two, uncut).
    assert len(bounds) >= 10, bounds
    admitting = {path for path, (low, high) in bounds.items() if low <= 37 <= high}
    assert 1 <= len(admitting) <= 2
    assert set(read) & set(bounds) == admitting
    joined = [(r["k"], r["a"], r["b"], r["_weight"]) for r in pipeline.read_outputs("joined", 0, 1).collect()]
    assert joined == [(37, 0, 1, 1)]


def test_a_lookup_of_small_admitted_files_sends_spark_only_the_rows_holding_its_keys(spark, tmp_path, monkeypatch):
    monkeypatch.setattr(database, "SMALL_TRACE_ROWS", 0)
    by_spark: list[str] = []
    read = _recorded_reads(monkeypatch, by_spark)
    sent: list[tuple[int, bool]] = []  # rows of each Arrow table sent, and whether they are lookup keys
    create = spark.createDataFrame

    def created(data, *args, **kwargs):
        if isinstance(data, pa.Table):
            sent.append((data.num_rows, "_p_vnode" in data.column_names))
        return create(data, *args, **kwargs)

    root = str(tmp_path / "local")
    # Step 0 inserts keys 0..99 on the left, one file per worker spanning its keys; step 1
    # looks two of them up from the right, keys in every file's bounds.
    for step, (left, right) in enumerate([(list(range(100)), [1000]), ([], [3, 96])]):
        if step == 0:
            pipeline = _join_step(spark, root, step, left, right)
            bounds = _bounds(root, "left")
            continue
        del read[:], by_spark[:]
        monkeypatch.setattr(spark, "createDataFrame", created)
        pipeline = _join_step(spark, root, step, left, right)
        monkeypatch.setattr(spark, "createDataFrame", create)
    # The left trace's admitting files are read by the process, Spark reads none of them
    # and gets the two rows holding the keys, not the files' 100; the two keys it matches
    # them with are sent from the process too.
    assert set(read) & set(bounds) and not set(by_spark) & set(bounds)
    assert sorted(sent) == [(2, False), (2, True)]
    joined = sorted((r["k"], r["a"], r["b"], r["_weight"]) for r in pipeline.read_outputs("joined", 0, 1).collect())
    assert joined == [(3, 0, 1, 1), (96, 0, 1, 1)]


@contextmanager
def _queries(spark):
    """Counts the queries (requests for rows, each a Spark job or more) ``spark`` sends its
    Spark Connect server in the block; commands, such as a frame's checkpoint, are not."""
    if not hasattr(spark, "client"):
        pytest.skip("counts Spark Connect requests")
    stub = spark.client._stub
    execute, counted = stub.ExecutePlan, Counter()

    def recorded(request, *args, **kwargs):
        counted[request.plan.WhichOneof("op_type")] += 1
        return execute(request, *args, **kwargs)

    stub.ExecutePlan = recorded
    try:
        yield counted
    finally:
        stub.ExecutePlan = execute


def _layered():
    """Three lookups into large traces in one layer (the join's two sides, the distinct's
    trace), and one in the next (the count's groups, keyed by the join's output)."""
    circuit = Circuit("layers")
    left = circuit.input("left", "k bigint, a bigint")
    right = circuit.input("right", "k bigint, b bigint")
    joined = left.join(right, "k")
    joined.output("joined")
    left.distinct().output("distinct")
    joined.group_by("k").agg(n=agg.count()).output("counts")
    return circuit


def test_the_lookups_of_a_circuit_layer_collect_their_keys_with_one_query(spark, tmp_path, monkeypatch):
    monkeypatch.setattr(database, "SMALL_TRACE_ROWS", 0)
    prunes = database.DeltaStateStore.prunes
    queries, views = {}, {}
    for pruned in (False, True):
        monkeypatch.setattr(
            database.DeltaStateStore, "prunes", lambda self, table, on=pruned: on and prunes(self, table)
        )
        root = str(tmp_path / f"pruned-{pruned}")
        for step, keys in enumerate(([1, 2, 3], [2, 3, 4])):
            inputs = {
                side: from_rows(spark, [(k, step, 1) for k in keys], f"k bigint, {c} bigint")
                for side, c in (("left", "a"), ("right", "b"))
            }
            pipeline = Pipeline(spark, root, _layered(), workers=2)
            pipeline.submit(step, inputs, [Range("r", 0, step, step + 1)])
            with _queries(spark) as counted:
                pipeline.run()
        queries[pruned] = counted["root"]
        views[pruned] = {
            view: sorted(map(tuple, pipeline.read_outputs(view, 0, 1).collect()))
            for view in ("joined", "distinct", "counts")
        }
    # Step 1 looks up four large traces in two layers: a query each layer, not each lookup.
    assert queries[True] - queries[False] == 2
    assert views[True] == views[False]
    counts = Counter()
    for _, k, n, weight, *_ in views[True]["counts"]:
        counts[(k, n)] += weight
    assert +counts == {(1, 1): 1, (2, 4): 1, (3, 4): 1, (4, 1): 1}


def test_a_compaction_by_a_fresh_pipeline_cuts_the_trace_files_by_the_lookup_keys_the_state_records(
    spark, tmp_path, monkeypatch
):
    monkeypatch.setattr(database, "SMALL_TRACE_ROWS", 0)
    monkeypatch.setattr(database, "CLUSTER_ROWS", 2)  # a unit's file of 100 keys is cut
    layouts = []
    for fresh in (False, True):
        root = str(tmp_path / f"fresh-{fresh}")
        pipeline = _join_step(spark, root, 0, list(range(100)), [1000])
        # Another process (the CLI's `dbsp compact`) has run no step: its store saw no lookup.
        (pipeline if not fresh else Pipeline(spark, root, _join(), workers=2)).compact()
        layouts.append(sorted(_bounds(root, "left").values()))
        assert max(_file_rows(root, "left")) <= 2
    assert layouts[0] == layouts[1]


def _trace_name(root: str, side: str) -> str:
    (name,) = [n for n in os.listdir(os.path.join(root, "state")) if n.endswith(f".{side}")]
    return name


def _file_rows(root: str, side: str) -> list[int]:
    """The rows of each file of the join's trace of ``side``."""
    return (
        add_actions(open_table(os.path.join(root, "state", _trace_name(root, side)))).column("num_records").to_pylist()
    )


def test_a_large_step_reads_a_large_trace_whole_without_collecting_its_keys_and_is_right(spark, tmp_path, monkeypatch):
    """A step of more than ``LARGE_STEP_ROWS`` input rows joins the traces with its keys by a
    shuffle: it collects no keys (a 10M-event step's exceeded the driver's result size) and
    skips no file; the join is the same."""
    monkeypatch.setattr(database, "SMALL_TRACE_ROWS", 0)
    monkeypatch.setattr(runner, "LARGE_STEP_ROWS", 12)  # the second step, 14 rows, is large
    collections = []
    collect = context.StepContext.collect_keys
    monkeypatch.setattr(context.StepContext, "collect_keys", lambda step: collections.append(1) or collect(step))
    root = str(tmp_path / "large")
    steps = [(list(range(10)), list(range(5, 15))), (list(range(10, 20)), [1, 2, 12, 30])]
    for step, (left, right) in enumerate(steps):
        del collections[:]
        pipeline = _join_step(spark, root, step, left, right)
    assert collections == []
    _assert_joined(pipeline, steps)
