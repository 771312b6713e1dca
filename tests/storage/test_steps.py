"""The step driver in storage: a step range's input read through the reader the caller
passes in (no source imported), persisted once, run and committed as one checkpoint;
recovery and layout changes under the lease, as the CLI and the Dagster jobs call them."""

from __future__ import annotations

import os
from contextlib import contextmanager

import pytest

from circuits import from_rows, runner
from circuits.library import word_count
from storage import database, delta, logs
from storage.errors import LeaseHeldError, StepOrderError
from storage.faults import InjectedCrash
from storage.lease import Holder, Lease
from storage.logs import Range
from storage.pipeline import Pipeline, StepInput

from .test_storage import STEPS, submit_all, totals


class RowsReader:
    """A source of the word count's rows: the range starting at offset ``10 * s`` holds
    step ``s``'s rows (as :func:`tests.storage.test_storage.submit_all` divides them)."""

    def __init__(self) -> None:
        self.read_steps: list[int] = []

    @contextmanager
    def __call__(self, spark, ranges, schemas, taken):
        [r] = ranges
        step = r.start // 10
        self.read_steps.append(step)
        yield StepInput({name: from_rows(spark, rows, schemas[name]) for name, rows in STEPS[step].items()})


def divide(pipeline: Pipeline, steps: int) -> None:
    for step in range(steps):
        pipeline.divisions.record(step, [Range("words", 0, step * 10, step * 10 + 10)])


@pytest.fixture
def reference(spark, tmp_path) -> Pipeline:
    pipeline = Pipeline(spark, str(tmp_path / "reference"), word_count(), workers=2)
    submit_all(spark, pipeline)
    pipeline.run()
    return pipeline


def test_a_step_range_reads_each_divided_step_once_and_commits_what_submitted_input_gives(spark, tmp_path, reference):
    pipeline, reader = Pipeline(spark, str(tmp_path / "p"), word_count(), workers=2), RowsReader()
    divide(pipeline, len(STEPS))
    assert pipeline.run_steps(reader, 0, 1) == range(0, 2)
    assert pipeline.run_steps(reader, 0, 2) == range(2, 3)  # committed steps are not read again
    assert pipeline.run_steps(reader, 1, 2) == range(3, 3)
    assert reader.read_steps == [0, 1, 2]
    assert totals(pipeline, 2) == totals(reference, 2)
    assert pipeline.timings["ingest"] > 0


def test_a_step_run_alone_computes_from_the_rows_its_read_holds_and_reads_no_input_log_back(
    spark, tmp_path, reference, monkeypatch
):
    pipeline, reader = Pipeline(spark, str(tmp_path / "p"), word_count(), workers=2), RowsReader()
    divide(pipeline, len(STEPS))
    read, read_files = [], logs.read_files
    monkeypatch.setattr(logs, "read_files", lambda spark, uri, *a: read.append(uri) or read_files(spark, uri, *a))
    for step in range(len(STEPS)):
        assert pipeline.run_steps(reader, step, step) == range(step, step + 1)
    assert [uri for uri in read if uri.startswith(pipeline.inputs.uri(""))] == []
    assert reader.read_steps == [0, 1, 2]
    assert totals(pipeline, 2) == totals(reference, 2)
    assert all(pipeline.inputs.persisted(step) for step in range(len(STEPS)))


@pytest.mark.parametrize("large", [False, True])
def test_a_crash_after_the_input_log_or_during_the_state_of_a_step_computed_from_its_read_recovers_from_the_log(
    spark, tmp_path, reference, monkeypatch, large
):
    if large:  # every step takes a large step's paths: planned across workers, each table written apart
        monkeypatch.setattr(runner, "SMALL_STEP_ROWS", 0)
        monkeypatch.setattr(delta, "APART_ROWS", 0)
    root, reader = str(tmp_path / "p"), RowsReader()
    divide(Pipeline(spark, root, word_count(), workers=2), len(STEPS))
    monkeypatch.setenv("DBSP_FAULT_MODE", "raise")
    for point, step in [("after_input", 0), ("during_state", 1)]:
        monkeypatch.setenv("DBSP_FAULT", f"{point}:{step}")
        with pytest.raises(InjectedCrash):  # each time in a new run process
            Pipeline(spark, root, word_count(), workers=2).run_steps(reader, 0, step)
    monkeypatch.delenv("DBSP_FAULT")
    pipeline = Pipeline(spark, root, word_count(), workers=2)
    assert pipeline.run_steps(reader, 0, 2) == range(0, 3)
    assert reader.read_steps == [0, 1, 2]  # the crashed steps are replayed from the input log
    assert totals(pipeline, 2) == totals(reference, 2)


def test_a_step_the_division_log_has_not_cut_is_refused_before_any_read(spark, tmp_path):
    pipeline, reader = Pipeline(spark, str(tmp_path / "p"), word_count()), RowsReader()
    divide(pipeline, 1)
    with pytest.raises(StepOrderError, match="step 1 has no recorded division yet"):
        pipeline.run_steps(reader, 0, 1)
    assert reader.read_steps == [0] and pipeline.inputs.persisted(0) and not pipeline.inputs.persisted(1)


def test_recover_runs_every_divided_uncommitted_step_once_a_dead_holders_lease_is_broken(spark, tmp_path, reference):
    pipeline, reader = Pipeline(spark, str(tmp_path / "p"), word_count(), workers=2), RowsReader()
    divide(pipeline, len(STEPS))
    pipeline.run_steps(reader, 0, 0)
    Lease(pipeline.root).acquire("a run that died")
    with pytest.raises(LeaseHeldError, match="a run that died"):
        pipeline.recover(reader, Holder("recovery"))
    assert reader.read_steps == [0]  # refused before reading anything
    recovery = pipeline.recover(reader, Holder("recovery"), break_lease=True)
    assert recovery.broken.holder == "a run that died"
    assert (recovery.ran, recovery.next_step) == (range(1, 3), 3) and reader.read_steps == [0, 1, 2]
    assert totals(pipeline, 2) == totals(reference, 2)
    lease = Lease(pipeline.root).current()
    assert (lease.holder, lease.released) == ("recovery", True)
    assert pipeline.recover(reader, Holder("again")).ran == range(3, 3)


@pytest.mark.parametrize("hot", [False, True], ids=["cold", "hot"])
def test_a_rescale_holds_the_lease_for_all_of_a_cold_change_and_only_to_switch_a_hot_one(
    spark, tmp_path, reference, monkeypatch, hot
):
    pipeline = Pipeline(spark, str(tmp_path / "p"), word_count(), workers=2)
    submit_all(spark, pipeline)
    pipeline.run(through=1)
    events, prepare = [], pipeline.prepare_rescale
    monkeypatch.setattr(pipeline, "prepare_rescale", lambda *a: events.append("copy") or prepare(*a))
    Lease(pipeline.root).acquire("a run that ended")

    def gone(holder: str) -> bool:  # asked while waiting for the lease
        events.append("wait for the lease")
        return holder == "a run that ended"

    report = pipeline.rescale(3, hot=hot, holder=Holder("rescale", wait=5, gone=gone))
    assert events == (["copy", "wait for the lease"] if hot else ["wait for the lease", "copy"])
    assert report.after.workers == 3 and pipeline.layout() == report.after
    assert (report.copy_seconds > 0) == hot and report.pause_seconds > 0
    assert Lease(pipeline.root).current().holder == "rescale" and Lease(pipeline.root).current().released
    pipeline.run()  # the last step on the new layout: the same output
    assert totals(pipeline, 2) == totals(reference, 2)


def test_a_pipeline_kept_open_reopens_only_what_another_process_wrote_since(spark, tmp_path, reference, monkeypatch):
    """A process that keeps its pipeline open between runs (the step worker) opens no state
    table again at the checkpoint it committed itself, but restores what another process
    wrote after it (a run that died before its checkpoint) and sees what another committed."""
    root, reader = str(tmp_path / "p"), RowsReader()
    kept = Pipeline(spark, root, word_count(), workers=2)
    divide(kept, len(STEPS))
    assert kept.run_steps(reader, 0, 0) == range(0, 1)
    opened = []
    real_open = database.open_table
    monkeypatch.setattr(database, "open_table", lambda uri, *a: opened.append(uri) or real_open(uri, *a))
    kept.open()
    assert opened == [kept.state.checkpoints_uri]

    monkeypatch.setenv("DBSP_FAULT_MODE", "raise")
    monkeypatch.setenv("DBSP_FAULT", "during_commit:1")  # after step 1's state, before its checkpoint
    with pytest.raises(InjectedCrash):
        Pipeline(spark, root, word_count(), workers=2).run_steps(reader, 1, 1)
    monkeypatch.delenv("DBSP_FAULT")
    opened.clear()
    assert kept.run_steps(reader, 1, 1) == range(1, 2)
    assert any(f"{os.sep}state{os.sep}" in uri for uri in opened)  # the dead run's state was restored away

    assert Pipeline(spark, root, word_count(), workers=2).run_steps(reader, 2, 2) == range(2, 3)
    kept.open()
    assert kept.state.get_step() == 3
    assert totals(kept, 2) == totals(reference, 2)
