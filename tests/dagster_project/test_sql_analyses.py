"""A ``sql:`` pipeline compiled again in a new process (each run under ``dagster dev`` is
one) takes Spark's answers from the compile before it: the same circuit, no analysis by
Spark; changed SQL, another Spark version or ANSI mode are analysed by Spark again."""

import pytest

import circuits.sql
from circuits.spark import round_trips

from .test_sql_pipeline import VIEWS, load, sql_settings


def compiled(tmp_path, spark, text: str = VIEWS):
    """The pipeline's circuit, loaded and compiled as a new run process does, and the
    round trips to Spark that took."""
    with round_trips(spark) as calls:
        circuit = load(tmp_path, sql_settings(tmp_path, text)).pipelines[0].circuit_for(spark)
    return circuit, calls


def asked_analyses(calls) -> int:
    """Round trips that analysed or ran something (reading the settings is a Config call)."""
    return calls["ExecutePlan"] + calls["AnalyzePlan"]


@pytest.fixture
def dbsp_home(tmp_path, monkeypatch):
    monkeypatch.setenv("DBSP_HOME", str(tmp_path / "home"))


def test_a_second_compile_of_the_views_asks_spark_nothing(tmp_path, spark, dbsp_home):
    first, asked = compiled(tmp_path, spark)
    assert asked["AnalyzePlan"] > 0
    again, calls = compiled(tmp_path, spark)
    assert not asked_analyses(calls)
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
    assert not asked_analyses(calls) and again.fingerprint() == first.fingerprint()


def test_answers_of_another_spark_version_are_not_used(tmp_path, spark, dbsp_home, monkeypatch):
    compiled(tmp_path, spark)
    with monkeypatch.context() as m:
        m.setattr(type(spark), "version", property(lambda _: "0.0.1"))
        _, calls = compiled(tmp_path, spark)
    assert asked_analyses(calls)
    _, calls = compiled(tmp_path, spark)  # the answers of both versions are kept
    assert not asked_analyses(calls)


def test_answers_given_in_another_ansi_mode_are_not_used(tmp_path, spark, dbsp_home):
    compiled(tmp_path, spark)
    spark.conf.set("spark.sql.ansi.enabled", "false")  # '1' + 1 is a double, not a bigint
    try:
        _, calls = compiled(tmp_path, spark)
    finally:
        spark.conf.unset("spark.sql.ansi.enabled")
    assert asked_analyses(calls)
    _, calls = compiled(tmp_path, spark)  # the answers of both modes are kept
    assert not asked_analyses(calls)


def test_a_load_in_a_session_compiles_the_views_once(tmp_path, spark, dbsp_home, monkeypatch):
    """The load checks the views by compiling them in the active session; the run takes
    that circuit instead of compiling the file a second time."""
    compile_sql, calls = circuits.sql.compile_sql, []

    def counted(*args, **kwargs):
        calls.append(kwargs.get("file"))
        return compile_sql(*args, **kwargs)

    monkeypatch.setattr(circuits.sql, "compile_sql", counted)
    spec = load(tmp_path, sql_settings(tmp_path)).pipelines[0]
    assert spec.circuit_for(spark) is spec.circuit_for(spark)
    assert calls == [spec.sql]
