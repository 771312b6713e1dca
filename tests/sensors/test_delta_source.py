"""Delta tables as inputs, against Spark's own Delta writer on the test session's server.

The oracle: the source tables are written by Spark SQL (INSERT, UPDATE, DELETE, MERGE);
steps are cut by the division code from the tables' latest versions and read from their
change data feed; at every step each view equals Spark batch SQL of its text over the
tables ``VERSION AS OF`` the step's last versions."""

from __future__ import annotations

import shutil
from collections import Counter

import pytest
from deltalake import DeltaTable
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from circuits.sql import batch_views, compile_sql
from sensors.delta_source import DELTA, DeltaTables
from sensors.division import DivisionPolicy, cut_next
from sensors.errors import (
    ChangeFeedMissingError,
    ChangesVacuumedError,
    InputColumnsChangedError,
    TableRewrittenError,
)
from sensors.ingest import Sources
from storage.faults import InjectedCrash
from storage.logs import DivisionLog
from storage.pipeline import Pipeline

from ..circuits.harness import SQL_SCHEMAS, failing_at, logged_rows
from ..oracle import add_into, zset

VIEWS = """
CREATE MATERIALIZED VIEW joined AS SELECT a.k, a.v, b.x FROM a JOIN b ON a.k = b.k;
CREATE MATERIALIZED VIEW grouped AS
  SELECT k, count(*) AS n, sum(v) AS total, max(s) AS high FROM a GROUP BY k;
CREATE MATERIALIZED VIEW left_joined AS SELECT a.k, a.s, b.d FROM a LEFT JOIN b ON a.k = b.k AND b.x > 1;
CREATE MATERIALIZED VIEW distinct_keys AS SELECT DISTINCT k FROM b;
CREATE MATERIALIZED VIEW excepted AS SELECT k, v FROM a EXCEPT ALL SELECT k, x FROM b;
"""

COLUMNS = {"a": "k INT, v INT, s STRING", "b": "k BIGINT, x INT, d DOUBLE"}
CHANGE_FEED = "TBLPROPERTIES (delta.enableChangeDataFeed = true)"


WRITER_CONF = {"spark.sql.shuffle.partitions": "2", "spark.databricks.delta.snapshotPartitions": "1"}
"""Spark's own Delta writer on the tests' tiny tables: its UPDATE, MERGE and RESTORE jobs
shuffle into 200 partitions by default, minutes a statement on two cores."""


@pytest.fixture(scope="module", autouse=True)
def small_writes(spark):
    before = {k: spark.conf.get(k, None) for k in WRITER_CONF}
    for k, v in WRITER_CONF.items():
        spark.conf.set(k, v)
    yield
    for k, v in before.items():
        spark.conf.unset(k) if v is None else spark.conf.set(k, v)


@pytest.fixture(scope="module")
def circuit(spark):
    return compile_sql(VIEWS, SQL_SCHEMAS, spark)


def create(spark, path: str, columns: str, properties: str = CHANGE_FEED) -> str:
    """A new empty Delta table at ``path`` written by Spark; its source ``delta:<path>``."""
    spark.sql(f"CREATE TABLE delta.`{path}` ({columns}) USING delta {properties}")
    return DELTA + path


# One operation is one Spark SQL statement, so one version of its table.
_key = st.integers(0, 2)
_a_row = st.tuples(_key, st.one_of(st.integers(0, 3), st.none()), st.sampled_from(["'p'", "'q'", "NULL"]))
_b_row = st.tuples(_key, st.integers(0, 3), st.sampled_from(["1.5", "-2.0", "NULL"]))


def _values(rows) -> str:
    return ", ".join(f"({', '.join('NULL' if v is None else str(v) for v in r)})" for r in rows)


@st.composite
def operation(draw) -> tuple[str, str]:
    """(table, statement with ``{t}`` for the table): an insert, update, delete or merge."""
    table = draw(st.sampled_from(["a", "b"]))
    rows = _a_row if table == "a" else _b_row
    value = "v" if table == "a" else "x"
    kind = draw(st.sampled_from(["insert", "update", "delete", "merge"]))
    key = draw(_key)
    if kind == "insert":
        return table, f"INSERT INTO {{t}} VALUES {_values(draw(st.lists(rows, min_size=1, max_size=3)))}"
    if kind == "update":
        return table, f"UPDATE {{t}} SET {value} = coalesce({value}, 0) + 1 WHERE k = {key}"
    if kind == "delete":
        return table, f"DELETE FROM {{t}} WHERE k = {key}"
    source = _values(draw(st.lists(rows, min_size=1, max_size=2, unique_by=lambda r: r[0])))
    names = "k, v, s" if table == "a" else "k, x, d"
    return table, (
        f"MERGE INTO {{t}} t USING (SELECT * FROM VALUES {source} AS s({names})) s ON t.k = s.k "
        "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
    )


HISTORIES = st.lists(st.lists(operation(), min_size=1, max_size=3), min_size=1, max_size=3)
"""Rounds of operations; after each round the sensor's division code cuts what it can."""

FIXED = [
    [
        ("a", "INSERT INTO {t} VALUES (1, 2, 'p'), (1, 2, 'p'), (2, NULL, NULL)"),
        ("b", "INSERT INTO {t} VALUES (1, 3, 1.5)"),
    ],
    [("a", "UPDATE {t} SET v = v + 1 WHERE k = 1"), ("b", "DELETE FROM {t} WHERE k = 1")],
    [
        (
            "b",
            "MERGE INTO {t} t USING (SELECT 2 AS k, 2 AS x, -2.0 AS d) s ON t.k = s.k "
            "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *",
        ),
        ("a", "DELETE FROM {t} WHERE k = 2"),
    ],
]
"""Duplicates, NULLs, an update of both copies, a delete of a joined key, a merge."""


def run_history(spark, circuit, tmp_path, workers: int, history, restart_round: int | None, max_versions: int):
    """Applies ``history`` round by round; after each, cuts steps of at most
    ``max_versions`` versions until none is due and runs each, comparing every view with
    Spark batch SQL over the tables as of the step's versions.  At ``restart_round`` the
    pipeline dies after a step's output, and a new one recovers it with the tables moved
    away (a replay reads the input log, never a table)."""
    paths = {h: str(tmp_path / "tables" / h) for h in COLUMNS}
    sources = Sources(tables=DeltaTables({h: create(spark, paths[h], c) for h, c in COLUMNS.items()}))
    root = str(tmp_path / "pipeline")
    pipeline = Pipeline(spark, root, circuit, workers=workers)
    policy = DivisionPolicy(max_versions, 0)
    integrals = {name: Counter() for name in circuit.outputs}
    for i, operations in enumerate(history):
        for handle, statement in operations:
            spark.sql(statement.format(t=f"delta.`{paths[handle]}`"))
        while (cut := cut_next(pipeline.divisions, sources, policy)).step is not None:
            assert sum(r.end - r.start for r in cut.ranges) <= max_versions
            if i == restart_round:
                pipeline = recovered(spark, circuit, root, workers, sources, cut.step, paths, tmp_path)
                restart_round = None
            else:
                pipeline.run_steps(sources.read, cut.step, cut.step)
            versions = {h: next(r.end for r in cut.ranges if r.source == DELTA + p) - 1 for h, p in paths.items()}
            as_of = {h: as_of_version(spark, h, p, versions[h]) for h, p in paths.items()}
            for name, df in batch_views(spark, VIEWS, as_of).items():
                add_into(integrals[name], zset(logged_rows(pipeline, name, cut.step)))
                want = zset((*row, 1) for row in df.collect())
                assert integrals[name] == want, (
                    f"step {cut.step} (versions {versions}), workers={workers}, view {name!r}:\n"
                    f"  missing: {dict(want - integrals[name])}\n  extra:   {dict(integrals[name] - want)}"
                )


def as_of_version(spark, handle: str, path: str, version: int):
    """Table ``handle`` at ``path`` as of ``version`` by Spark's time travel (-1: before
    its first version, when no step has taken one)."""
    if version < 0:
        return spark.createDataFrame([], SQL_SCHEMAS[handle])
    return spark.read.format("delta").option("versionAsOf", version).load(path)


def recovered(spark, circuit, root, workers, sources, step, paths, tmp_path) -> Pipeline:
    """Runs ``step`` into a crash after its output, then a new pipeline recovers it while
    the source tables are away."""
    with failing_at("after_output", step), pytest.raises(InjectedCrash):
        Pipeline(spark, root, circuit, workers=workers).run_steps(sources.read, step, step)
    away = tmp_path / "away"
    shutil.move(str(tmp_path / "tables"), away)
    try:
        pipeline = Pipeline(spark, root, circuit, workers=workers)
        assert list(pipeline.recover(sources.read).ran) == [step]
    finally:
        shutil.move(str(away), str(tmp_path / "tables"))
    return pipeline


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
@settings(max_examples=2, deadline=None, suppress_health_check=list(HealthCheck))
@example(history=FIXED, restart_round=1, max_versions=1)
@given(history=HISTORIES, restart_round=st.one_of(st.none(), st.integers(0, 2)), max_versions=st.integers(1, 4))
def test_views_over_delta_tables_equal_spark_batch_sql_as_of_each_step(
    spark, circuit, tmp_path_factory, workers, history, restart_round, max_versions
):
    """Every view equals Spark batch SQL of its text over the source tables as of each
    step's versions, at 1 and 2 workers, across a crash and recovery."""
    run_history(spark, circuit, tmp_path_factory.mktemp("delta"), workers, history, restart_round, max_versions)


@pytest.mark.slow
def test_a_table_without_the_change_feed_is_refused_before_a_step_is_cut(spark, tmp_path):
    source = create(spark, str(tmp_path / "plain"), COLUMNS["a"], properties="")
    spark.sql(f"INSERT INTO delta.`{tmp_path / 'plain'}` VALUES (1, 1, 'p')")
    pipeline_root = str(tmp_path / "pipeline")
    with pytest.raises(ChangeFeedMissingError) as raised:
        cut_next(DivisionLog(pipeline_root), Sources(tables=DeltaTables({"a": source})), DivisionPolicy(10, 0))
    message = str(raised.value)
    assert str(tmp_path / "plain") in message and "delta.enableChangeDataFeed" in message
    assert "ALTER TABLE" in message and "SET TBLPROPERTIES" in message
    assert DivisionLog(pipeline_root).next_step() == 0  # nothing recorded


@pytest.mark.slow
@pytest.mark.parametrize(
    "rewrite, named",
    [
        ("INSERT OVERWRITE {t} VALUES (9, 9, 'z')", "version 2 was overwritten"),
        ("RESTORE TABLE {t} TO VERSION AS OF 0", "version 2 was restored to version 0"),
    ],
)
def test_an_overwritten_or_restored_table_is_refused_naming_it(spark, tmp_path, rewrite, named):
    path = str(tmp_path / "a")
    sources = Sources(tables=DeltaTables({"a": create(spark, path, COLUMNS["a"])}))
    divisions = DivisionLog(str(tmp_path / "pipeline"))
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (1, 1, 'p')")
    assert cut_next(divisions, sources, DivisionPolicy(10, 0)).step == 0
    spark.sql(rewrite.format(t=f"delta.`{path}`"))
    with pytest.raises(TableRewrittenError) as raised:
        cut_next(divisions, sources, DivisionPolicy(10, 0))
    assert path in str(raised.value) and named in str(raised.value)
    assert divisions.next_step() == 1


@pytest.mark.slow
def test_a_column_of_another_type_than_the_pipeline_reads_is_refused(spark, circuit, tmp_path):
    path = str(tmp_path / "a")
    tables = {
        "a": create(spark, path, "k INT, v BIGINT, s STRING"),
        "b": create(spark, str(tmp_path / "b"), COLUMNS["b"]),
    }
    sources = Sources(tables=DeltaTables(tables))
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (1, 1, 'p')")
    pipeline = Pipeline(spark, str(tmp_path / "pipeline"), circuit)
    assert cut_next(pipeline.divisions, sources, DivisionPolicy(10, 0)).step == 0
    with pytest.raises(InputColumnsChangedError) as raised:
        pipeline.run_steps(sources.read, 0, 0)
    message = str(raised.value)
    assert path in message and "column 'v'" in message and "reads as int" in message and "bigint there" in message
    assert not pipeline.inputs.persisted(0)


@pytest.mark.slow
def test_versions_whose_files_were_vacuumed_are_refused_naming_them_and_the_retention(spark, circuit, tmp_path):
    path = str(tmp_path / "a")
    tables = {"a": create(spark, path, COLUMNS["a"]), "b": create(spark, str(tmp_path / "b"), COLUMNS["b"])}
    sources = Sources(tables=DeltaTables(tables))
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (1, 1, 'p')")
    spark.sql(f"DELETE FROM delta.`{path}` WHERE k = 1")
    DeltaTable(path).vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)  # version 1's file
    pipeline = Pipeline(spark, str(tmp_path / "pipeline"), circuit)
    assert cut_next(pipeline.divisions, sources, DivisionPolicy(10, 0)).step == 0
    with pytest.raises(ChangesVacuumedError) as raised:
        pipeline.run_steps(sources.read, 0, 0)
    message = str(raised.value)
    assert path in message and "versions 0.." in message
    assert "delta.deletedFileRetentionDuration" in message and "delta.logRetentionDuration" in message
    assert not pipeline.inputs.persisted(0)
