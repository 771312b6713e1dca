"""A KLogs pipeline on the Delta state database: its sink gets, per key, what a sequential
fold gives, across restarts (a new process's view: new Pipeline objects) and a rescale;
the sink's Delta table holds each message once; the vacuum prunes the tokens of
checkpointed steps and a replay still skips the side effects done; each message of a
fan-out reaches each sink, with a token of its own; keyed-log state of the older format
is refused."""

import json
from collections import defaultdict

import pytest
from deltalake import DeltaTable

from circuits.klogs import RECORD_SCHEMA, KLog, deploy
from circuits.operators.keyed import KLogsError
from circuits.zset import from_rows
from storage.errors import StateFormatError
from storage.faults import InjectedCrash
from storage.logs import Range
from storage.pipeline import Pipeline
from storage.sinks import DeltaSink

from .test_rescale import rewrite_latest_checkpoint

LOG = "counts"
# (key, value) messages, four steps; one partition, offsets count up.
STEPS = [[("a", 1), ("b", 2), ("a", 3)], [("b", 4)], [("c", 5), ("a", 6), ("c", 7)], [("b", 8), ("a", 9)]]


def add(total, _key, value):
    return total + value, [total + value]


def circuit(uri: str):
    def pipeline():
        KLog.named(LOG).loop(0, add).sink(DeltaSink(uri))

    return deploy(pipeline, "klogs_sums", vnodes=16)


def test_sums_across_restarts_and_a_rescale_are_each_written_once(spark, tmp_path):
    root, uri = str(tmp_path / "pipeline"), str(tmp_path / "sums")
    offset = 0
    for step, messages in enumerate(STEPS):
        pipeline = Pipeline(spark, root, circuit(uri), workers=2)  # a restart before every step
        rows = [(json.dumps(k), json.dumps(v), 0, offset + i, None, 1) for i, (k, v) in enumerate(messages)]
        pipeline.submit(step, {LOG: from_rows(spark, rows, RECORD_SCHEMA)}, [Range(LOG, 0, offset, offset + len(rows))])
        offset += len(rows)
        pipeline.run()
        if step == 1:
            pipeline.rescale(3)
    expected, totals = defaultdict(list), defaultdict(int)
    for messages in STEPS:
        for key, value in messages:
            totals[key] += value
            expected[key].append(totals[key])
    got = defaultdict(list)
    for row in sorted(
        DeltaTable(uri).to_pyarrow_table().to_pylist(), key=lambda r: [int(o) for o in r["offset"].split(".")]
    ):
        got[json.loads(row["key"])].append(json.loads(row["value"]))
    assert got == expected


def test_vacuum_prunes_the_tokens_of_checkpointed_steps_and_a_replay_still_skips_side_effects(
    spark, tmp_path, monkeypatch
):
    root, seen = str(tmp_path / "pipeline"), []

    def pipeline_def():
        KLog.named(LOG).loop(0, add).sink(lambda k, v: seen.append((k, v)))

    circuit = deploy(pipeline_def, "klogs_pruned", vnodes=4)
    offset = 0

    def submit(pipeline, step):
        nonlocal offset
        rows = [(json.dumps(k), json.dumps(v), 0, offset + i, None, 1) for i, (k, v) in enumerate(STEPS[step])]
        pipeline.submit(step, {LOG: from_rows(spark, rows, RECORD_SCHEMA)}, [Range(LOG, 0, offset, offset + len(rows))])
        offset += len(rows)

    pipeline = Pipeline(spark, root, circuit)
    for step in range(3):
        submit(pipeline, step)
        pipeline.run()
    tokens = pipeline.sinks.tokens
    assert {r["step"] for r in DeltaTable(tokens.uri).to_pyarrow_table().to_pylist()} == {0, 1, 2}
    pipeline.vacuum()
    assert [r for r in DeltaTable(tokens.uri).to_pyarrow_table().to_pylist() if r["step"] < 3] == []
    submit(pipeline, 3)
    monkeypatch.setenv("DBSP_FAULT", "after_sink:3")
    monkeypatch.setenv("DBSP_FAULT_MODE", "raise")
    with pytest.raises(InjectedCrash):
        pipeline.run()  # step 3's side effects done, not checkpointed
    monkeypatch.delenv("DBSP_FAULT")
    assert Pipeline(spark, root, circuit).run() == 4  # the replay of step 3 skips its completed tokens
    totals, expected = defaultdict(int), []
    for messages in STEPS:
        for key, value in messages:
            totals[key] += value
            expected.append((key, totals[key]))
    assert sorted(seen) == sorted(expected)


def test_an_unserialisable_state_fails_the_step_with_the_klogs_error(spark, tmp_path):
    def pipeline_def():
        KLog.named(LOG).loop(0, lambda s, k, v: ({s}, [])).sink(print)

    pipeline = Pipeline(spark, str(tmp_path / "pipeline"), deploy(pipeline_def, "klogs_bad_state", vnodes=4))
    rows = [('"k"', "1", 0, 0, None, 1)]
    pipeline.submit(0, {LOG: from_rows(spark, rows, RECORD_SCHEMA)}, [Range(LOG, 0, 0, 1)])
    with pytest.raises(KLogsError, match='^stage loop_1: the state of key "k" is a set, not JSON-serialisable'):
        pipeline.run()


DOCS = "docs"
# (doc, text) messages, two steps: words repeat within a text and across texts.
DOC_STEPS = [[("doc1", "a a b"), ("doc2", "b c a")], [("doc3", "c c c a")]]


def word_counts(sink) -> None:
    KLog.named(DOCS).partition(lambda doc, text: text.split()).loop(0, lambda n, word, _: (n + 1, [n + 1])).sink(sink)


def counted_words(steps) -> dict[str, list[int]]:
    """What a sequential run, one message and one word at a time, emits per word."""
    counts = defaultdict(list)
    for messages in steps:
        for _, text in messages:
            for word in text.split():
                counts[word].append(len(counts[word]) + 1)
    return dict(counts)


def submit_docs(spark, pipeline: Pipeline, step: int, steps, first: int) -> int:
    rows = [(json.dumps(k), json.dumps(v), 0, first + i, None, 1) for i, (k, v) in enumerate(steps[step])]
    pipeline.submit(step, {DOCS: from_rows(spark, rows, RECORD_SCHEMA)}, [Range(DOCS, 0, first, first + len(rows))])
    return first + len(rows)


def run_docs(spark, root: str, circuit, steps, monkeypatch, crash: str | None) -> None:
    """Runs ``steps``, each by a new Pipeline; with ``crash`` (a fault point), step 0 crashes there first."""
    first = 0
    for step in range(len(steps)):
        pipeline = Pipeline(spark, root, circuit)
        first = submit_docs(spark, pipeline, step, steps, first)
        if crash and step == 0:
            monkeypatch.setenv("DBSP_FAULT", f"{crash}:0")
            monkeypatch.setenv("DBSP_FAULT_MODE", "raise")
            with pytest.raises(InjectedCrash):
                pipeline.run()
            monkeypatch.delenv("DBSP_FAULT")
            pipeline = Pipeline(spark, root, circuit)
        assert pipeline.run() == step + 1


@pytest.mark.slow
@pytest.mark.parametrize("crash", [None, "after_sink"])
@pytest.mark.parametrize("kind", ["function", "delta"])
def test_a_fan_out_reaches_each_sink_whole_with_one_token_per_message(spark, tmp_path, monkeypatch, kind, crash):
    """Copies of a message that land on one key, and their loop's outputs, each get a token
    of their own (a token shared by two messages lets a sink skip one of them)."""
    root, uri, seen = str(tmp_path / "pipeline"), str(tmp_path / "counts"), []
    sink = DeltaSink(uri) if kind == "delta" else lambda word, n: seen.append((word, n))
    run_docs(
        spark, root, deploy(lambda: word_counts(sink), f"word_counts_{kind}", vnodes=4), DOC_STEPS, monkeypatch, crash
    )
    if kind == "delta":
        by_position = lambda r: (r["step"], [int(o) for o in r["offset"].split(".")])
        rows = sorted(DeltaTable(uri).to_pyarrow_table().to_pylist(), key=by_position)
        seen = [(json.loads(r["key"]), json.loads(r["value"])) for r in rows]
    else:
        rows = [
            r for r in DeltaTable(str(tmp_path / "pipeline" / "_tokens")).to_pyarrow_table().to_pylist() if r["key"]
        ]
    got = defaultdict(list)
    for word, n in seen:
        got[word].append(n)
    assert got == counted_words(DOC_STEPS)
    assert len({(r["stage"], r["key"], r["offset"]) for r in rows}) == len(rows) == len(seen)


def test_a_keyed_log_state_of_format_1_is_refused_naming_the_formats(spark, tmp_path, monkeypatch):
    """Format 1 gave copies of a message one position: a replayed step would find no tokens of its messages."""
    root = str(tmp_path / "pipeline")
    circuit = deploy(lambda: word_counts(print), "word_counts_old", vnodes=4)
    run_docs(spark, root, circuit, DOC_STEPS[:1], monkeypatch, None)
    rewrite_latest_checkpoint(root, engine_version="0.1.0", state_format=1)
    with pytest.raises(
        StateFormatError, match=r"state format 1, written by engine 0\.1\.0; .* reads state format 2 only"
    ):
        Pipeline(spark, root, circuit).run()
