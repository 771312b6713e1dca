"""``dbsp klogs-demo``: the KLogs paper's word count through Dagster prints the KLogs paper's four lines,
in one step or a step per message, and a crash between the sink's side effect and the
checkpoint prints none of them twice."""

import os
from collections import Counter

import pytest
import yaml
from dagster import instance_for_test
from deltalake import DeltaTable

from circuits.klogs import DEAD_LETTERS
from circuits.library.klogs_wordcount import SEED_MESSAGES, UPPER
from dagster_project import cli
from dagster_project.config import parse_project
from dagster_project.klogs_demo import SINK, Demo, demo_project
from storage.logs import DEAD_LETTERS as DEAD_LETTERS_TABLE
from storage.pipeline import status

SEED_LINES = [
    '{"type":"OUT","name":"f","count totals":1}',
    '{"type":"OUT","name":"m","count totals":3}',
    '{"type":"OUT","name":"f","count totals":5}',
    '{"type":"OUT","name":"m","count totals":7}',
]


@pytest.fixture
def settings(tmp_path, monkeypatch, spark, spark_resource, broker) -> dict:
    monkeypatch.setenv("DBSP_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home" / "dagster"))
    return {
        "pipelines": [],
        "resources": {
            "spark": spark_resource,
            "kafka": {"bootstrap_servers": broker.bootstrap},
            "store": {"root": str(tmp_path / "store")},
        },
    }


@pytest.mark.slow
@pytest.mark.parametrize("one_step", [True, False], ids=["one step", "a step per message"])
def test_the_demo_prints_the_seed_lines(settings, tmp_path, capfd, one_step):
    path = tmp_path / "dbsp.yaml"
    path.write_text(yaml.safe_dump(settings))
    assert cli.main(["--config", str(path), "klogs-demo", *(["--one-step"] if one_step else [])]) == 0
    lines = capfd.readouterr().out.splitlines()
    assert lines == SEED_LINES  # the producer's order: in one step, by the records' timestamps


@pytest.mark.slow
def test_a_crash_after_the_sink_prints_no_line_twice(settings, monkeypatch, capfd):
    with instance_for_test() as instance:
        crash_and_recover(Demo(demo_project(parse_project(settings, "test"), "crash"), instance), monkeypatch, capfd)


def crash_and_recover(demo: Demo, monkeypatch, capfd) -> None:
    assert SINK in demo.spec.build_circuit().sinks and DEAD_LETTERS in demo.spec.sink_names
    demo.produce(SEED_MESSAGES)
    monkeypatch.setenv("DBSP_FAULT", "after_sink:0")
    monkeypatch.setenv("DBSP_FAULT_MODE", "raise")
    [crashed] = demo.advance()
    assert not crashed.success and "InjectedCrash" in str(crashed.all_events)
    assert status(demo.root).committed_step == 0  # printed, not checkpointed
    monkeypatch.delenv("DBSP_FAULT")
    [outcome] = demo.advance()  # the sensor asks for step 0 again; its replay skips the printed tokens
    assert outcome.success and status(demo.root).committed_step == 1
    assert Counter(capfd.readouterr().out.splitlines()) == Counter(SEED_LINES)


@pytest.mark.slow
def test_a_retraction_or_malformed_record_in_a_keyed_log_is_a_dead_letter(settings, capfd):
    with instance_for_test() as instance:
        demo = Demo(demo_project(parse_project(settings, "test"), "bad"), instance)
        upper = demo.source.topics[UPPER]
        client = demo.source.client()
        client.produce(upper, [b'{"_weight": -1}', b"not json"], keys=[b'"F"', b'"F"'])
        demo.produce(SEED_MESSAGES)
        outcomes = demo.advance() + demo.advance()  # six records: two steps of at most four
        assert len(outcomes) == 2 and all(o.success for o in outcomes)
        dead = DeltaTable(os.path.join(demo.root, DEAD_LETTERS_TABLE)).to_pyarrow_table().to_pylist()
        reasons = sorted((d["topic"], d["offset"], d["reason"].split(":")[0]) for d in dead)
        assert [(t, r) for t, _, r in reasons] == [(upper, "retraction"), (upper, "undecodable value")]
        lines = capfd.readouterr().out.splitlines()  # nothing else lost: every message counted
        assert len(lines) == 4 and {SEED_LINES[2], SEED_LINES[3]} <= set(lines)
