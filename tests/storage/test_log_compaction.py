"""A pipeline's step-keyed logs keep few files: their old small files merge, as a
rearrangement, and every step's rows stay what they were, across a crash in the merge."""

from __future__ import annotations

import glob
import json
import os
import random

import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from deltalake import DeltaTable, write_deltalake

from circuits import from_rows
from circuits.library import word_count
from circuits.library.wordcount import WORDS_SCHEMA
from storage import database, inspect
from storage.database import compact_log
from storage.faults import InjectedCrash
from storage.logs import STEP, Range
from storage.pipeline import Pipeline
from storage.tables import dataset

from .test_storage import totals

LOG = pa.schema([("k", pa.string()), ("_weight", pa.int64()), (STEP, pa.int64())])


def _steps(uri: str, column: str = STEP) -> dict[int, list[tuple]]:
    """The log's rows by step (``column``), each as a tuple of its other columns."""
    by_step: dict[int, list[tuple]] = {}
    for row in dataset(DeltaTable(uri)).to_table().to_pylist():
        by_step.setdefault(row.pop(column), []).append(tuple(row.values()))
    return {s: sorted(rows, key=repr) for s, rows in by_step.items()}


def _last_commit(uri: str) -> list[dict]:
    newest = max(glob.glob(os.path.join(uri, "_delta_log", "*.json")))
    with open(newest) as f:
        return [json.loads(line) for line in f]


def test_a_crowded_log_merges_its_files_of_old_steps_into_one_and_every_steps_rows_stay(tmp_path):
    uri = str(tmp_path / "log")
    for step in range(20):
        rows = [
            {"k": f"w{step % 7}", "_weight": 1, STEP: step},
            {"k": "x", "_weight": -1 if step % 2 else 1, STEP: step},
        ]
        write_deltalake(uri, pa.Table.from_pylist(rows, schema=LOG), mode="append")
    before = _steps(uri)
    counts = {r: inspect.rows_of_steps(uri, *r) for r in [(0, 0), (5, 7), (16, 19), (0, 19)]}
    assert compact_log(uri, STEP, 0) == 0  # no file holds only steps before 0

    assert compact_log(uri, STEP, 18) == 18  # more than COMPACT_FILES of steps 0..17
    assert len(DeltaTable(uri).file_uris()) == 3  # steps 0..17 in one file, then 18 and 19
    assert _steps(uri) == before
    assert {r: inspect.rows_of_steps(uri, *r) for r in counts} == counts  # a range inside the merged file
    actions = [a for line in _last_commit(uri) for kind, a in line.items() if kind in ("add", "remove")]
    assert len(actions) == 19 and not any(a["dataChange"] for a in actions)  # no change for a reader of changes
    merged = ds.dataset(DeltaTable(uri).file_uris()[0]).to_table().column(STEP).to_pylist()
    assert merged == sorted(merged)
    assert compact_log(uri, STEP, 20) == 0  # three files do not crowd


def _words(seed: int, steps: int) -> list[list[tuple]]:
    rng = random.Random(seed)
    return [[(rng.choice("abcdef"), rng.randint(1, 3), rng.choice([1, 1, -1])) for _ in range(3)] for _ in range(steps)]


def _submit(spark, pipeline: Pipeline, step: int, rows: list[tuple]) -> None:
    pipeline.submit(step, {"upper": from_rows(spark, rows, WORDS_SCHEMA)}, [Range("words", 0, step, step + 1)])


def _run(spark, root: str, step: int, rows: list[tuple]) -> Pipeline:
    pipeline = Pipeline(spark, root, word_count(), workers=2)  # each run a new process's
    _submit(spark, pipeline, step, rows)
    pipeline.run()
    return pipeline


def test_a_pipeline_merges_its_logs_as_it_goes_and_a_crash_in_a_merge_loses_and_repeats_nothing(
    spark, tmp_path, monkeypatch
):
    steps = _words(7, 9)
    reference = str(tmp_path / "reference")
    unmerged = Pipeline(spark, reference, word_count(), workers=2)
    for step, rows in enumerate(steps):
        _submit(spark, unmerged, step, rows)
    unmerged.run()  # one run: no merge

    monkeypatch.setattr(database, "COMPACT_FILES", 2)  # every other run merges its logs' files
    root = str(tmp_path / "p")
    monkeypatch.setenv("DBSP_FAULT_MODE", "raise")
    monkeypatch.setenv("DBSP_FAULT", "during_log_compaction:5")  # the merged files written, not committed
    for step, rows in enumerate(steps):
        if step == 5:
            with pytest.raises(InjectedCrash):
                _run(spark, root, step, rows)
            monkeypatch.delenv("DBSP_FAULT")
        pipeline = _run(spark, root, step, rows)

    last = len(steps) - 1
    assert totals(pipeline, last) == totals(unmerged, last)
    logs = [pipeline.inputs.uri("upper"), pipeline.outputs.uri("totals"), pipeline.divisions.uri]
    for uri in [*logs, pipeline.state.checkpoints_uri]:
        assert len(DeltaTable(uri).file_uris()) <= 4, uri  # of 9 steps' files
        operations = [h.get("operation") for h in DeltaTable(uri).history()]
        assert len(operations) > len(steps), uri  # merges were committed
    for uri, column in zip(logs, [STEP, STEP, "step"], strict=True):
        assert _steps(uri, column) == _steps(uri.replace(root, reference), column), uri
