"""The state database, input, division and output logs on real Delta tables."""

from __future__ import annotations

import inspect
import os
import threading
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from circuits import Circuit, agg, from_rows
from circuits.library import word_count
from circuits.library.wordcount import WORDS_SCHEMA
from circuits.spark import round_trips
from storage import database, logs
from storage import delta as delta_module
from storage.database import crowded
from storage.delta import delta_tables
from storage.errors import (
    CancelledError,
    CorruptTableError,
    DivisionConflictError,
    InputTimeoutError,
    OutputMismatchError,
    StaleWriterError,
    StepOrderError,
)
from storage.logs import Range
from storage.pipeline import Pipeline, status

from .test_rescale import assert_files_follow_owners

STEPS = [
    {"upper": [("F", 1, 1), ("M", 3, 1)], "lower": [("f", 4, 1)]},
    {"upper": [("M", 4, 1)], "lower": [("dog", 2, 1)]},
    {"upper": [("F", 1, -1)], "lower": [("dog", 2, -1), ("m", 1, 1)]},
]


def submit_all(spark, pipeline: Pipeline, steps=STEPS) -> None:
    for step, rows in enumerate(steps):
        inputs = {name: from_rows(spark, r, WORDS_SCHEMA) for name, r in rows.items()}
        pipeline.submit(step, inputs, [Range("words", 0, step * 10, step * 10 + 10)])


def totals(pipeline: Pipeline, last: int) -> Counter:
    return Counter(
        (r["_step"], r["word"], r["total"], r["_weight"]) for r in pipeline.read_outputs("totals", 0, last).collect()
    )


def tables(root: str) -> dict[str, DeltaTable]:
    return {os.path.relpath(uri, root): DeltaTable(uri) for uri in delta_tables(root)}


@pytest.fixture
def pipeline(spark, tmp_path):
    p = Pipeline(spark, str(tmp_path / "wc"), word_count(), workers=2)
    submit_all(spark, p)
    return p


def test_steps_produce_the_running_totals_and_survive_a_restart(spark, pipeline, tmp_path):
    assert pipeline.run(through=1) == 2
    restarted = Pipeline(spark, pipeline.root, word_count(), workers=3)  # another worker count too
    assert restarted.run() == 3
    assert +totals(restarted, 2) == Counter(
        {
            (0, "f", 5, 1): 1,
            (0, "m", 3, 1): 1,
            (1, "m", 3, -1): 1,
            (1, "m", 7, 1): 1,
            (1, "dog", 2, 1): 1,
            (2, "f", 5, -1): 1,
            (2, "f", 4, 1): 1,
            (2, "dog", 2, -1): 1,
            (2, "m", 7, -1): 1,
            (2, "m", 8, 1): 1,
        }
    )
    step_two = restarted.read_outputs("totals", 2, 2).collect()
    assert {tuple(r["_input"][0]) for r in step_two} == {("words", 0, 20, 30)}


def test_rerunning_committed_steps_creates_no_new_delta_version(spark, pipeline):
    pipeline.run()
    before = {name: t.version() for name, t in tables(pipeline.root).items()}
    again = Pipeline(spark, pipeline.root, word_count(), workers=2)
    submit_all(spark, again)
    assert again.run() == 3
    assert again.run(through=1) == 3
    assert {name: t.version() for name, t in tables(pipeline.root).items()} == before


def test_every_table_is_plain_parquet_with_reader_protocol_1_at_every_version(spark, pipeline):
    pipeline.run(through=0)
    pipeline.run()
    found = tables(pipeline.root)
    assert {"_checkpoints", "_divisions", "inputs/upper", "outputs/totals"} <= set(found)
    for name, table in found.items():
        protocol = table.protocol()
        assert protocol.min_reader_version == 1 and not protocol.reader_features, name
        for version in range(table.version() + 1):
            at = DeltaTable(table.table_uri, version=version)
            files = at.file_uris()
            rows = spark.read.parquet(*files).count() if files else 0
            assert rows == at.to_pyarrow_table().num_rows, f"{name} v{version}"


def test_replayed_output_that_differs_is_refused_with_a_diff(spark, pipeline, tmp_path):
    pipeline.run()
    other = Pipeline(spark, str(tmp_path / "other"), word_count())
    submit_all(spark, other, [{"upper": [("F", 2, 1)], "lower": []}])
    other.run()
    pipeline.outputs.write(0, other.state.written_outputs)  # a replay: compared before the next checkpoint
    with pytest.raises(OutputMismatchError, match=r"output 'totals', step 0: .*only now: \[\('f', 2, 1, 0\)\]"):
        pipeline.outputs.verify_replayed()
    with pytest.raises(StepOrderError, match=r"cannot write step 7, the next step to write is 3"):
        pipeline.outputs.write(7, other.state.written_outputs)


def test_a_run_verifies_only_its_own_replays(spark, pipeline, tmp_path):
    pipeline.run(through=1)
    other = Pipeline(spark, str(tmp_path / "other"), word_count())
    submit_all(spark, other, [{"upper": [("F", 2, 1)], "lower": []}])
    other.run()
    pipeline.outputs.write(0, other.state.written_outputs)  # a differing replay, left by a run that then failed
    assert pipeline.run() == 3


def test_opening_reads_only_the_openable_checkpoints(tmp_path):
    """A run opens the state by the latest two checkpoints' files alone, so its cost does
    not grow with the pipeline's age: older checkpoints' files are never read again."""
    store = database.DeltaStateStore(None, str(tmp_path))  # no state tables: no Spark needed
    for step in range(1, 6):
        store.open(store.versions()[-1])
        store.set_step(step)
        store.set_meta("at", str(step))
        store.commit()
    for f in DeltaTable(store.checkpoints_uri).file_uris():  # 3 stays: openable once 5 is discarded
        if pq.read_table(f).column("version")[0].as_py() < 3:
            os.remove(f)
    assert store.versions() == range(4, 6)
    store.open(4)  # the earlier openable checkpoint: checkpoint 5 is discarded
    assert (store.get_step(), store.get_meta("at")) == (4, "4")
    assert database.latest_checkpoint(str(tmp_path)) == (4, 4, {"at": "4"})


def test_a_run_opens_each_state_table_at_most_once_however_many_steps_it_commits(spark, pipeline, monkeypatch):
    """Each step commits on the handles of the state tables it read (an open costs 5-10 ms
    a table, and a step commits to every table it touches); a pipeline that already holds a
    table's latest version from an earlier run opens it not at all."""
    pipeline.run(through=0)  # creates the state tables
    opened = Counter()
    original = DeltaTable.__init__

    def counted(self, table_uri, *args, **kwargs):
        opened[os.path.relpath(str(table_uri), pipeline.root)] += 1
        original(self, table_uri, *args, **kwargs)

    monkeypatch.setattr(DeltaTable, "__init__", counted)
    assert pipeline.run() == 3
    state = {f"state/{name}" for name in os.listdir(os.path.join(pipeline.root, "state"))}
    assert state and all(opened[t] <= 1 for t in state), opened
    monkeypatch.undo()
    assert +totals(pipeline, 2) == +totals(_fresh(spark, pipeline.root + "-fresh"), 2)


def test_a_division_is_written_once(tmp_path):
    from storage.logs import DivisionLog

    log = DivisionLog(str(tmp_path))
    log.record(0, [Range("t", 1, 5, 9), Range("t", 0, 0, 3)])
    log.record(0, [Range("t", 0, 0, 3), Range("t", 1, 5, 9)])  # the same again: fine
    with pytest.raises(DivisionConflictError, match="step 0 was divided as"):
        log.record(0, [Range("t", 0, 0, 4), Range("t", 1, 5, 9)])
    with pytest.raises(StepOrderError, match="step 1 is not recorded yet"):
        log.record(2, [Range("t", 0, 3, 4)])


def test_reading_input_waits_with_a_timeout_and_a_cancellation_token(spark, pipeline):
    with pytest.raises(InputTimeoutError, match="step 9 did not arrive within 0.3 s"):
        pipeline.inputs.read(9, timeout=0.3)
    cancel = threading.Event()
    threading.Timer(0.2, cancel.set).start()
    with pytest.raises(CancelledError):
        pipeline.inputs.read(9, timeout=30, cancel=cancel)


def test_a_missing_data_file_is_named_and_nothing_is_committed_on_top(spark, pipeline):
    pipeline.run(through=1)
    checkpoints = DeltaTable(os.path.join(pipeline.root, "_checkpoints")).version()
    state = [t for n, t in tables(pipeline.root).items() if n.startswith("state/") and t.file_uris()][0]
    os.remove(state.file_uris()[0].removeprefix("file://"))
    with pytest.raises(CorruptTableError, match=r"state/n\d+_aggregate.* version \d+: data file .* is missing"):
        Pipeline(spark, pipeline.root, word_count()).run()
    assert DeltaTable(os.path.join(pipeline.root, "_checkpoints")).version() == checkpoints


def test_a_write_failing_midway_commits_nothing_and_the_retry_succeeds(spark, pipeline, tmp_path, monkeypatch):
    reference = Pipeline(spark, str(tmp_path / "reference"), word_count())
    submit_all(spark, reference)
    reference.run()

    real_commit, calls = delta_module.commit, []

    def failing_commit(files, app_id, version, base=None, remove=None):
        calls.append(files.uri)
        if len(calls) == 2:
            raise OSError("injected: disk went away")
        return real_commit(files, app_id, version, base, remove)

    monkeypatch.setattr("storage.database.commit", failing_commit)
    with pytest.raises(OSError, match="injected"):
        pipeline.run()
    assert not os.path.exists(os.path.join(pipeline.root, "_checkpoints")) or (
        DeltaTable(os.path.join(pipeline.root, "_checkpoints")).to_pyarrow_table().num_rows == 0
    )
    monkeypatch.undo()
    assert Pipeline(spark, pipeline.root, word_count()).run() == 3
    assert totals(pipeline, 2) == totals(reference, 2)


def test_of_two_writers_on_the_same_step_exactly_one_commits(spark, pipeline):
    pipeline.run(through=0)
    writers = [Pipeline(spark, pipeline.root, word_count()) for _ in range(2)]
    for w in writers:
        w.open()  # both start from the same checkpoint
    barrier, results = threading.Barrier(2), []

    def run(writer):
        barrier.wait()
        try:
            results.append(writer.advance(through=1))
        except StaleWriterError as e:
            results.append(e)

    threads = [threading.Thread(target=run, args=(w,)) for w in writers]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert sorted(map(type, results), key=str) == sorted([int, StaleWriterError], key=str), results
    assert "another writer committed" in str([r for r in results if isinstance(r, Exception)][0])
    final = Pipeline(spark, pipeline.root, word_count())
    assert final.run() == 3
    assert +totals(final, 2) == +totals(_fresh(spark, pipeline.root + "-fresh"), 2)


def _fresh(spark, root):
    p = Pipeline(spark, root, word_count())
    submit_all(spark, p)
    p.run()
    return p


def test_a_large_step_writes_each_table_apart_and_a_small_one_packed_with_the_same_results(
    spark, pipeline, tmp_path, monkeypatch
):
    """A large step sends each table's rows to writer tasks of their own; a small one packs
    every table into one union (each way's cost, see ``storage.delta.APART_ROWS``)."""
    reference = _fresh(spark, str(tmp_path / "reference"))
    monkeypatch.setattr(delta_module, "APART_ROWS", 2)
    apart, write_tables = [], database.write_tables

    def recorded(*args, **kwargs):
        apart.append(delta_module.apart(kwargs.get("size")))
        return write_tables(*args, **kwargs)

    monkeypatch.setattr(database, "write_tables", recorded)
    assert pipeline.run() == 3
    assert apart == [True, False, True]  # the steps' input rows: 3, 2, 3
    assert totals(pipeline, 2) == totals(reference, 2)
    assert_files_follow_owners(pipeline)  # either way, a trace's file holds one worker's vnodes


def test_a_large_division_compaction_and_relayout_write_each_table_apart_with_the_same_results(
    spark, tmp_path, monkeypatch
):
    """Each write of more than ``APART_ROWS`` rows sends every table to writer tasks of its
    own: a step's input log when its division holds more records (offsets; 10 a step
    here), a compaction or a relayout when the traces it rewrites hold more rows."""
    reference = _fresh(spark, str(tmp_path / "reference"))
    monkeypatch.setattr(delta_module, "APART_ROWS", 2)
    writes = []
    for module in (database, logs):

        def recorded(*args, write_tables=module.write_tables, **kwargs):
            writes.append((inspect.stack()[1].function, delta_module.apart(kwargs.get("size"))))
            return write_tables(*args, **kwargs)

        monkeypatch.setattr(module, "write_tables", recorded)
    pipeline = _fresh(spark, str(tmp_path / "wc"))
    monkeypatch.setattr(delta_module, "APART_ROWS", 0)  # the traces moved hold a row or two
    pipeline.compact()
    pipeline.rescale(3)
    steps = [("persist", True)] * 3 + [("materialize", True), ("materialize", False), ("materialize", True)]
    assert writes == [*steps, ("compact", True), ("relayout", True)]
    assert totals(pipeline, 2) == totals(reference, 2)
    assert_files_follow_owners(pipeline)


def test_a_first_step_checkpoints_no_lookup_of_a_trace_not_written_yet(spark, pipeline, tmp_path):
    """A new pipeline's first step (a load) looks up traces that do not exist yet: what
    those lookups find is known to be nothing, so it is not checkpointed for the step (a
    round trip each, and a checkpoint hides from Spark's optimizer that the terms it
    feeds are empty).  Lookups of written traces still are (the second step's)."""
    reference = _fresh(spark, str(tmp_path / "reference"))
    counted = []
    for through in (0, 1):
        with round_trips(spark) as calls:
            Pipeline(spark, pipeline.root, word_count(), workers=2).run(through=through)
        counted.append(calls["ExecutePlan"])
    # The aggregate's lookup of its groups is checkpointed in the second step only (3 on
    # the code that checkpointed it in both).
    assert counted == [2, 3]
    assert totals(pipeline, 1) == totals(reference, 1)


def test_compaction_consolidates_traces_and_changes_no_result(spark, pipeline, tmp_path):
    reference = _fresh(spark, str(tmp_path / "reference"))
    pipeline.run(through=1)
    report = pipeline.compact()
    assert report
    for name, table in tables(pipeline.root).items():
        if name.startswith("state"):
            rows = table.to_pyarrow_table().drop_columns(["_weight"]).to_pylist()
            assert len(rows) == len({tuple(sorted(r.items())) for r in rows}), f"{name} is not consolidated"
    assert Pipeline(spark, pipeline.root, word_count()).run() == 3
    assert totals(pipeline, 2) == totals(reference, 2)


def _adds(rows: list[int | None]) -> pa.Table:
    return pa.table({"path": [f"f{i}" for i in range(len(rows))], "num_records": pa.array(rows, pa.int64())})


def test_a_small_trace_merges_whole_and_a_large_one_its_smallest_crowded_size_class(monkeypatch):
    monkeypatch.setattr(database, "COMPACT_FILES", 2)
    monkeypatch.setattr(database, "SMALL_TRACE_ROWS", 100)
    monkeypatch.setattr(database, "CLUSTER_ROWS", 1_000)
    assert crowded(_adds([10, 20])) == []
    assert crowded(_adds([10, 20, 30])) == ["f0", "f1", "f2"]  # small: every file
    assert crowded(_adds([10, 20, 30, None])) == []  # a file without statistics: unknown
    # Large: classes 0-15 rows, 16-255, 256-4095; files of CLUSTER_ROWS rows or more are cut by their keys.
    assert crowded(_adds([5_000, 300, 1, 20, 40, 2])) == []
    assert crowded(_adds([5_000, 300, 1, 20, 40, 2, 90])) == ["f3", "f4", "f6"]
    assert crowded(_adds([5_000, 300, 1, 20, 40, 2, 90, 3])) == ["f2", "f5", "f7"]  # the smallest class first
    assert crowded(_adds([1_000, 1_000, 1_000, 300])) == []


@pytest.mark.parametrize("large", [False, True], ids=["small trace", "large trace"])
def test_a_crowded_trace_is_merged_by_the_step_and_changes_no_result(spark, pipeline, tmp_path, monkeypatch, large):
    reference = _fresh(spark, str(tmp_path / "reference"))
    monkeypatch.setattr(database, "COMPACT_FILES", 1)
    if large:  # every trace is large: a step merges one size class of its files, not all
        monkeypatch.setattr(database, "SMALL_TRACE_ROWS", 0)
    for step in range(3):  # a checkpoint per step, so that the next one sees the files it added
        pipeline.run(through=step)
    assert totals(pipeline, 2) == totals(reference, 2)
    traces = {name: t for name, t in tables(pipeline.root).items() if name.startswith("state")}
    # A rewrite removes the trace's files: some files of earlier versions are gone.
    ever = {
        name: {f for v in range(t.version() + 1) for f in DeltaTable(t.table_uri, version=v).file_uris()}
        for name, t in traces.items()
    }
    assert traces and all(set(t.file_uris()) < ever[name] for name, t in traces.items() if len(ever[name]) > 1)
    assert any(set(t.file_uris()) < ever[name] for name, t in traces.items())


def test_vacuum_keeps_what_recovery_from_the_earliest_checkpoint_needs(spark, pipeline, tmp_path):
    reference = _fresh(spark, str(tmp_path / "reference"))
    pipeline.run(through=1)
    before_compaction = {f for n, t in tables(pipeline.root).items() if n.startswith("state/") for f in t.file_uris()}
    pipeline.compact()
    pipeline.compact()  # now no openable checkpoint pins the files from before compaction
    orphan = os.path.join(pipeline.root, "outputs", "totals", "part-orphan-from-a-discarded-replay.parquet")
    with open(orphan, "wb") as f:
        f.write(b"not committed")
    deleted = pipeline.vacuum()
    assert os.path.basename(orphan) in deleted and not os.path.exists(orphan)
    assert before_compaction and all(not os.path.exists(f.removeprefix("file://")) for f in before_compaction)
    # Recover from the earliest retained checkpoint: everything it needs is still there.
    earliest = Pipeline(spark, pipeline.root, word_count())
    earliest.state.open(earliest.state.versions()[0])
    assert earliest.advance() == 3
    assert totals(earliest, 2) == totals(reference, 2)


def test_a_paused_worker_stops_every_step_at_the_same_boundary_and_checkpoints(spark, tmp_path):
    import time

    from storage.pipeline import Worker

    p = Pipeline(spark, str(tmp_path / "paused"), word_count())
    submit_all(spark, p, STEPS[:1])  # only step 0 has input so far
    p.open()
    worker = Worker(p, poll=0.2)
    worker.start(p.state.opened_version)  # runs until told to stop
    deadline = time.monotonic() + 120
    while p.outputs.last("totals") < 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert worker.pause() == 1  # was blocked reading step 1: cancelled, parked at the boundary
    submit_all(spark, p)  # steps 1 and 2 arrive while paused
    assert worker.stop(2) == 2  # runs step 1, not step 2
    assert p.outputs.last("totals") == 2
    reopened = Pipeline(spark, p.root, word_count())
    reopened.open()
    assert reopened.state.get_step() == 2
    with pytest.raises(StepOrderError, match="cannot run through step 5: step 3 has no recorded input yet"):
        reopened.advance(through=5)


def _max_price_circuit():
    circuit = Circuit("max_price")
    bids = circuit.input("bids", "auction bigint, price bigint")
    bids.group_by("auction").agg(top=agg.max("price")).output("top")
    return circuit


def test_max_reads_no_values_while_the_input_only_inserts_and_is_right_after_a_retraction(spark, tmp_path):
    """While an input has only inserted rows, max is the old max against the delta's (the
    fast path); the first retraction, seen from the input log's statistics, switches the
    operator back to re-deriving from the values for good, across restarts."""
    root = str(tmp_path / "max")
    steps = [
        [(1, 5, 1), (1, 7, 1), (2, 3, 1)],
        [(1, 9, 1)],
        [],  # an empty step: planned by no one, changes nothing
        [(1, 9, -1), (2, 1, 1)],  # retracts auction 1's max: the answer must fall back to 7
        [(1, 8, 1)],
    ]
    expected = [{(1, 7), (2, 3)}, {(1, 9), (2, 3)}, {(1, 9), (2, 3)}, {(1, 7), (2, 3)}, {(1, 8), (2, 3)}]
    append_only = ['["bids"]', '["bids"]', '["bids"]', "[]", "[]"]
    for step, rows in enumerate(steps):
        pipeline = Pipeline(spark, root, _max_price_circuit(), workers=2)  # a restart every step
        inputs = {"bids": from_rows(spark, rows, "auction bigint, price bigint")} if rows else {}
        pipeline.submit(step, inputs, [Range("b", 0, step, step + 1)])
        assert pipeline.inputs.read(step).retracting == ({"bids"} if step == 3 else set())
        pipeline.run()
        integral = Counter()
        for r in pipeline.read_outputs("top", 0, step).collect():
            integral[(r["auction"], r["top"])] += r["_weight"]
        assert {row for row, w in integral.items() if w} == expected[step], step
        assert all(w in (0, 1) for w in integral.values())
        assert status(root).meta["append_only_inputs"] == append_only[step]
