"""Layout changes on a running pipeline: outputs stay identical, step by step, to a run
that never rescaled; state files follow the new owners; a crash in the middle leaves the
old layout or the new one, never a mix; state in a format this engine cannot read is
refused with the versions named."""

import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from circuits.sharding import VNODE
from storage import database
from storage.database import ENGINE_VERSION, STATE_FORMAT
from storage.errors import StateFormatError
from storage.faults import InjectedCrash
from storage.logs import Range
from storage.pipeline import Pipeline

from .workload import EVENTS_PER_STEP, circuit, inputs, output_log

SEED, STEPS = 11, 5


def submit(spark, pipeline: Pipeline, step: int) -> None:
    ranges = [Range("nexmark", 0, step * EVENTS_PER_STEP, (step + 1) * EVENTS_PER_STEP)]
    pipeline.submit(step, inputs(spark, SEED, step), ranges)


@pytest.fixture(scope="module")
def reference(spark, tmp_path_factory):
    """The output log of a run that never changes its layout (4 workers)."""
    pipeline = Pipeline(spark, str(tmp_path_factory.mktemp("reference")), circuit(), workers=4)
    for step in range(STEPS):
        submit(spark, pipeline, step)
    pipeline.run()
    return output_log(pipeline, STEPS)


def run_with_rescales(spark, root: str, first_workers: int, plan: dict[int, tuple], hot: bool = False) -> Pipeline:
    """Runs every step, changing the layout after the steps ``plan`` names (``step -> (workers, strategy)``)."""
    pipeline = Pipeline(spark, root, circuit(), workers=first_workers)
    for step in range(STEPS):
        submit(spark, pipeline, step)
        if step in plan and hot:
            prepared = pipeline.prepare_rescale(*plan[step])  # the copy, while the step below runs
            pipeline.run()
            report = pipeline.finish_rescale(prepared)
        else:
            pipeline.run()
            if step in plan:
                report = pipeline.rescale(*plan[step])
        if step in plan:
            assert pipeline.layout() == report.after and report.after.workers == plan[step][0]
            assert_files_follow_owners(pipeline)
    return pipeline


def assert_files_follow_owners(pipeline: Pipeline) -> None:
    """Every state file holds the vnodes of one worker of the current layout: files that
    held moved vnodes were rewritten, and each step's files are written by their owners."""
    owners = pipeline.layout().owners
    for table in os.listdir(os.path.join(pipeline.root, "state")):
        for uri in DeltaTable(os.path.join(pipeline.root, "state", table)).file_uris():
            vnodes = set(pq.read_table(uri.removeprefix("file://"), columns=[VNODE]).column(VNODE).to_pylist())
            assert len({owners[v] for v in vnodes}) <= 1, (table, sorted(vnodes))


@pytest.mark.slow
@pytest.mark.parametrize(
    "first, plan",
    [
        (4, {1: (5, "fixed"), 3: (3, "fixed")}),  # 4 -> 5 -> 3
        (1, {1: (8, "fixed"), 3: (1, "fixed")}),  # 1 -> 8 -> 1
        (4, {0: (5, "dynamic"), 1: (3, "dynamic"), 2: (6, "dynamic"), 3: (2, "fixed")}),  # several in a row
    ],
)
def test_outputs_are_identical_to_a_run_without_rescaling(spark, tmp_path, reference, first, plan):
    pipeline = run_with_rescales(spark, str(tmp_path / "p"), first, plan)
    assert output_log(pipeline, STEPS) == reference


@pytest.mark.slow
def test_a_hot_change_copies_while_steps_run_and_pauses_only_to_switch(spark, tmp_path, reference):
    pipeline = run_with_rescales(spark, str(tmp_path / "p"), 4, {2: (5, "fixed"), 4: (8, "dynamic")}, hot=True)
    assert output_log(pipeline, STEPS) == reference


@pytest.mark.slow
def test_a_hot_change_over_steps_that_merge_the_files_it_copied_moves_each_row_once(
    spark, tmp_path, reference, monkeypatch
):
    monkeypatch.setattr(database, "COMPACT_FILES", 1)  # every step merges the traces it adds to
    pipeline = run_with_rescales(spark, str(tmp_path / "p"), 4, {2: (5, "fixed")}, hot=True)
    assert output_log(pipeline, STEPS) == reference


@pytest.mark.slow
@pytest.mark.parametrize("fault, lands_on", [("during_relayout", "old"), ("after_relayout", "new")])
def test_a_crash_during_a_layout_change_recovers_at_the_old_or_the_new_layout(
    spark, tmp_path, reference, monkeypatch, fault, lands_on
):
    root = str(tmp_path / "p")
    pipeline = Pipeline(spark, root, circuit(), workers=4)
    for step in range(3):
        submit(spark, pipeline, step)
    pipeline.run()
    old = pipeline.layout()
    monkeypatch.setenv("DBSP_FAULT", f"{fault}:3")
    monkeypatch.setenv("DBSP_FAULT_MODE", "raise")
    with pytest.raises(InjectedCrash):
        pipeline.rescale(5)  # during: one table took its new files, no checkpoint yet; after: checkpointed
    monkeypatch.delenv("DBSP_FAULT")
    recovered = Pipeline(spark, root, circuit(), workers=4)
    recovered.open()
    assert (recovered.layout() == old) == (lands_on == "old")
    assert_files_follow_owners(recovered)  # every table at the same layout: never a mix
    for step in range(3, STEPS):
        submit(spark, recovered, step)
    recovered.run()
    assert output_log(recovered, STEPS) == reference


@pytest.mark.slow
def test_traces_cut_by_their_lookup_keys_stay_cut_through_a_rescale_and_recover_from_a_crash_mid_step(
    spark, tmp_path, reference, monkeypatch
):
    monkeypatch.setattr(database, "SMALL_TRACE_ROWS", 0)
    monkeypatch.setattr(database, "CLUSTER_ROWS", 3, raising=False)  # a step's files are cut
    root = str(tmp_path / "p")
    pipeline = Pipeline(spark, root, circuit(), workers=4)
    for step in range(2):
        submit(spark, pipeline, step)
    pipeline.run()
    pipeline.rescale(5)
    assert_files_follow_owners(pipeline)
    assert join_trace_file_rows(root) == 3  # cut, and cut again where the rescale rewrote them
    monkeypatch.setenv("DBSP_FAULT", "during_state:2")
    monkeypatch.setenv("DBSP_FAULT_MODE", "raise")
    submit(spark, pipeline, 2)
    with pytest.raises(InjectedCrash):
        pipeline.run()  # a trace took its cut files, no checkpoint yet
    monkeypatch.delenv("DBSP_FAULT")
    recovered = Pipeline(spark, root, circuit(), workers=5)
    for step in range(3, STEPS):
        submit(spark, recovered, step)
    recovered.run()
    assert join_trace_file_rows(root) == 3
    assert output_log(recovered, STEPS) == reference


def join_trace_file_rows(root: str) -> int:
    """The most rows a file of the join's traces holds."""
    tables = [t for t in os.listdir(os.path.join(root, "state")) if t.endswith((".left", ".right"))]
    rows = [
        DeltaTable(os.path.join(root, "state", t)).get_add_actions(flatten=True).column("num_records") for t in tables
    ]
    return max(max(r.to_pylist()) for r in rows)


def rewrite_latest_checkpoint(root: str, **changes) -> dict:
    """Appends a copy of the latest checkpoint with ``changes``, as another engine would have written it."""
    checkpoints = DeltaTable(os.path.join(root, "_checkpoints"))
    latest = max(checkpoints.to_pyarrow_table().to_pylist(), key=lambda r: r["version"])
    row = {**latest, "version": latest["version"] + 1, **changes}
    write_deltalake(
        checkpoints, pa.Table.from_pylist([row], schema=pa.schema(checkpoints.schema().to_arrow())), mode="append"
    )
    return row


def test_a_newer_engine_takes_over_and_an_unreadable_state_format_is_refused(spark, tmp_path):
    root = str(tmp_path / "p")
    pipeline = Pipeline(spark, root, circuit(), workers=2)
    submit(spark, pipeline, 0)
    pipeline.run()
    rewrite_latest_checkpoint(root, engine_version="0.0.1", state_format=1)  # format 1 differs in keyed logs only
    submit(spark, pipeline, 1)
    assert Pipeline(spark, root, circuit(), workers=2).run() == 2
    latest = max(
        DeltaTable(os.path.join(root, "_checkpoints")).to_pyarrow_table().to_pylist(), key=lambda r: r["version"]
    )
    assert latest["engine_version"] == ENGINE_VERSION and latest["step"] == 2

    rewrite_latest_checkpoint(root, engine_version="99.0.0", state_format=STATE_FORMAT + 1)
    with pytest.raises(StateFormatError) as error:
        Pipeline(spark, root, circuit(), workers=2).run()
    message = str(error.value)
    assert f"state format {STATE_FORMAT + 1}" in message and "99.0.0" in message and ENGINE_VERSION in message
