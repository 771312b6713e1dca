"""A ``sql:`` pipeline compiled again in a new process (each run under ``dagster dev`` is
one) takes Spark's answers from the compile before it: the same circuit, no round trip to
Spark; changed SQL is analysed by Spark again."""

import json

import pytest

from circuits.spark import round_trips
from dagster_project.config import home

from .test_sql_pipeline import VIEWS, load, sql_settings


def compiled(tmp_path, spark, text: str = VIEWS):
    """The pipeline's circuit, loaded and compiled as a new run process does, and the
    round trips to Spark that took."""
    with round_trips(spark) as calls:
        circuit = load(tmp_path, sql_settings(tmp_path, text)).pipelines[0].circuit_for(spark)
    return circuit, calls


@pytest.fixture
def dbsp_home(tmp_path, monkeypatch):
    monkeypatch.setenv("DBSP_HOME", str(tmp_path / "home"))


def test_a_second_compile_of_the_views_asks_spark_nothing(tmp_path, spark, dbsp_home):
    first, asked = compiled(tmp_path, spark)
    assert asked["AnalyzePlan"] > 0
    again, calls = compiled(tmp_path, spark)
    assert calls == {}
    assert again.fingerprint() == first.fingerprint()


def test_changed_sql_is_analysed_by_spark_again(tmp_path, spark, dbsp_home, monkeypatch):
    first, _ = compiled(tmp_path, spark)
    averaged = VIEWS.replace("sum(price)", "avg(price)")  # a bigint sum, a double average
    changed, calls = compiled(tmp_path, spark, averaged)
    assert calls["AnalyzePlan"] > 0
    monkeypatch.setenv("DBSP_HOME", str(tmp_path / "another"))
    fresh, _ = compiled(tmp_path, spark, averaged)
    assert changed.fingerprint() == fresh.fingerprint() != first.fingerprint()
    monkeypatch.setenv("DBSP_HOME", str(tmp_path / "home"))
    again, calls = compiled(tmp_path, spark)  # the first SQL's answers are kept beside the changed SQL's
    assert calls == {} and again.fingerprint() == first.fingerprint()


def test_answers_of_another_spark_version_are_not_used(tmp_path, spark, dbsp_home):
    compiled(tmp_path, spark)
    path = home("sql", "sqlp.analyses.json")
    kept = json.loads(open(path).read())
    open(path, "w").write(json.dumps({**kept, "spark": "0.0.1"}))
    _, calls = compiled(tmp_path, spark)
    assert calls["AnalyzePlan"] > 0
    _, calls = compiled(tmp_path, spark)  # the answers of the version that runs replaced them
    assert calls == {}
