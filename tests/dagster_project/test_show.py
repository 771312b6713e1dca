"""``dbsp show``: a sink's current view printed as a table, time travel, and its errors;
a sink with ``current: false`` keeps no view."""

import os
import re

import pytest
import yaml

from circuits import from_rows
from circuits.library.wordcount import WORDS_SCHEMA
from dagster_project.cli import main
from dagster_project.config import load_project
from dagster_project.factory import open_pipeline
from dagster_project.resources import build_resources
from storage.logs import DEAD_LETTER_SCHEMA, Range

DEAD = ("t.upper", 0, 7, "not JSON", "{F")
STEPS = [{"upper": [("F", 1, 1), ("M", 3, 1)]}, {"lower": [("m", 4, 1), ("dog", 2, 1)]}]


def settings(root: str, spark: dict) -> dict:
    pipeline = {"circuit": "circuits.library:word_count", "sources": {"upper": "t.upper", "lower": "t.lower"}}
    return {
        "pipelines": [
            {"name": "wc", **pipeline, "sinks": ["totals"]},
            {"name": "wcoff", **pipeline, "sinks": [{"name": "totals", "current": False}]},
        ],
        # The test session's Spark: the default (the embedded server on port 15002) would
        # start a server that outlives the tests.
        "resources": {"store": {"root": root}, "kafka": {"bootstrap_servers": "localhost:1"}, "spark": spark},
    }


@pytest.fixture(scope="module")
def stores(spark, spark_resource, tmp_path_factory):
    """A configuration of two word-count pipelines (one opted out), each run for two steps
    through the pipelines Dagster would open (checkpoints after each step)."""
    tmp_path = tmp_path_factory.mktemp("show")
    path = tmp_path / "dbsp.yaml"
    path.write_text(yaml.safe_dump(settings(str(tmp_path / "store"), spark_resource)))
    project = load_project(str(path))
    resources = build_resources(project)
    for spec in project.pipelines:
        pipeline = open_pipeline(spec, resources["spark"], resources["store"])
        for step, rows in enumerate(STEPS):
            inputs = {name: from_rows(spark, r, WORDS_SCHEMA) for name, r in rows.items()}
            # A record of step 0 that could not be decoded (persisted with the input, as a step's read does).
            pipeline.inputs.persist(
                step, inputs, spark.createDataFrame([DEAD] if step == 0 else [], DEAD_LETTER_SCHEMA)
            )
            pipeline.submit(step, inputs, [Range("words", 0, step, step + 1)])
            pipeline.run(through=step)
    return str(path), resources["store"]


@pytest.fixture
def config(stores, tmp_path, monkeypatch):
    monkeypatch.setenv("DBSP_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home" / "dagster"))
    return stores


def show(config, capsys, *args) -> tuple[int, str]:
    code = main(["--config", config[0], "show", *args])
    out = capsys.readouterr()
    return code, out.out + out.err


def test_show_prints_the_view_now_and_as_of_a_step(config, capsys):
    code, out = show(config, capsys, "totals", "--pipeline", "wc")
    assert code == 0 and "wc/totals as of step 1" in out and "3 rows" in out
    assert "dog" in out and " 7 " in out  # m: 3 + 4
    code, out = show(config, capsys, "totals", "--step", "0", "--limit", "1")
    assert code == 0 and "as of step 0" in out and "1 of 2 rows" in out and "dog" not in out


@pytest.mark.parametrize(
    "args, named",
    [
        (["q9"], ["'q9' is not a sink of pipeline 'wc'", "['totals']"]),
        (["totals", "--step", "5"], ["step 5 is not committed", "committed steps are 0..1"]),
        (["totals", "--pipeline", "wcoff"], ["current: false", "set current: true"]),
        (["totals", "--limit", "-1"], ["--limit -1"]),
    ],
)
def test_show_names_what_exists_when_asked_for_what_does_not(config, capsys, args, named):
    code, out = show(config, capsys, *args)
    assert code == 2
    for text in named:
        assert text in out


def test_a_sink_with_current_false_keeps_only_its_change_log(config):
    root = config[1].pipeline_root("wcoff")
    assert os.path.isdir(os.path.join(root, "outputs", "totals"))
    assert not os.path.exists(os.path.join(root, "views"))
    assert os.path.isdir(os.path.join(config[1].pipeline_root("wc"), "views", "totals"))


def test_config_may_follow_the_command(config, capsys, tmp_path):
    code = main(["show", "totals", "--pipeline", "wc", "--config", config[0]])
    out = capsys.readouterr()
    assert code == 0 and "wc/totals as of step 1" in out.out, out.err
    # The Dagster home the command prepared: the UI shows no welcome dialog on it.
    assert (tmp_path / "home" / "dagster" / ".nux" / "nux.yaml").exists()


@pytest.mark.parametrize("command", ["demo", "rescale", "show"])
def test_every_option_has_help(capsys, command):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    options = capsys.readouterr().out.split("options:")[1]
    for entry in re.split(r"\n  (?=-)", options.strip()):
        # An entry without help is only the option's names and its metavar (upper case).
        assert any(not w.startswith("-") and not w.isupper() for w in entry.split()), entry


@pytest.mark.slow
def test_status_counts_the_dead_letters(config, capsys):
    code = main(["status", "--pipeline", "wc", "--config", config[0]])
    out = capsys.readouterr().out
    assert code == 0 and "committed through step 1" in out
    [line] = [line for line in out.splitlines() if line.startswith("dead letters")]
    assert line.startswith("dead letters (input records that could not be decoded): 1; each with its topic"), line
    assert line.endswith(os.path.join(config[1].pipeline_root("wc"), "_dead_letters")), line


def test_show_prints_the_rows_sorted_by_the_views_columns(config, capsys):
    code, out = show(config, capsys, "totals", "--pipeline", "wc")
    rows = [line.split("│")[1].strip() for line in out.splitlines() if line.count("│") > 2]
    assert code == 0 and rows == ["dog", "f", "m"], out
    code, out = show(config, capsys, "totals", "--pipeline", "wc", "--limit", "1")
    assert "│ dog " in out and "1 of 3 rows" in out, out
