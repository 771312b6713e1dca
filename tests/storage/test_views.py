"""Sinks' current views (storage/views.py) on real Delta tables over the test Spark:
the view equals the integral of its change log, rewrites only the files its changes
touch, survives crashes at every fault point of a step, and travels back in time."""

from __future__ import annotations

import math
import tempfile
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from circuits import Circuit, from_rows
from circuits.spark import round_trips
from circuits.state import FILE
from storage import views
from storage.errors import NegativeViewError, ViewError
from storage.faults import InjectedCrash
from storage.logs import Range
from storage.pipeline import Pipeline

SCHEMA = "k bigint, v string"
SINKS = ("vs", "big")


def circuit() -> Circuit:
    """Two sinks: a projection that holds duplicates (weights above 1), and a filter (a set)."""
    c = Circuit("views")
    x = c.input("x", SCHEMA)
    x.select("v").output("vs")
    x.filter("k > 2").output("big")
    return c


def submit(spark, pipeline: Pipeline, step: int, changes: Counter) -> None:
    rows = [(*row, w) for row, w in sorted(changes.items()) if w]
    pipeline.submit(step, {"x": from_rows(spark, rows, SCHEMA)}, [Range("x", 0, step, step + 1)])


def view_rows(root: str, sink: str, version: int | None = None) -> Counter:
    table = DeltaTable(views.view_uri(root, sink), version=version).to_pyarrow_table()
    return Counter(tuple(r.values()) for r in table.to_pylist())


def log_integral(pipeline: Pipeline, sink: str, last: int) -> Counter:
    total = Counter()
    for r in pipeline.outputs.read(sink, 0, last).collect():
        total[tuple(v for k, v in r.asDict().items() if k not in ("_weight", "_step"))] += r["_weight"]
    assert all(w >= 0 for w in total.values()), f"negative totals in the log: {total}"
    return +total


def expected(inputs: Counter) -> dict[str, Counter]:
    vs, big = Counter(), Counter()
    for (k, v), w in inputs.items():
        vs[(v,)] += w
        if k > 2:
            big[(k, v)] += w
    return {"vs": +vs, "big": +big}


@pytest.fixture
def small_files(monkeypatch):
    """Files of at most about 3 rows, so that a few rows spread over many files."""
    monkeypatch.setattr(views, "FILE_ROWS", 3)


def test_plan_touches_only_the_ranges_holding_changed_vnodes_and_cuts_big_ones():
    files = [views.ViewFile("a", 0, 10), views.ViewFile("b", 100, 10), views.ViewFile("c", 200, 40)]
    assert views.ranges([0, 100, 200]) == {0: (0, 100), 100: (100, 200), 200: (200, views.VNODES)}
    assert views.ranges([7, 100]) == {7: (0, 100), 100: (100, views.VNODES)}  # the lowest covers emptied vnodes
    rewrite = views.plan(files, {150: 1, 250: 1}, target=20)
    assert rewrite.removed == ["b", "c"]  # "a" holds no changed vnode
    assert rewrite.starts[0] == 100 and len(rewrite.starts) == 1 + 3  # 41 rows of c cut in 3 pieces
    assert views.plan([], {5: 7}, target=3).starts == [0, 1365, 2730]  # an empty view: one range, cut


steps = st.lists(
    st.lists(st.tuples(st.integers(0, 5), st.sampled_from("abc"), st.booleans()), max_size=8), min_size=3, max_size=4
)


@pytest.fixture(params=["small files", "one file"])
def file_rows(request, monkeypatch):
    """Views cut in files of about 3 rows (integrated by Spark), or kept in one file
    (integrated by the run's process)."""
    if request.param == "small files":
        monkeypatch.setattr(views, "FILE_ROWS", 3)


@pytest.mark.slow
@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(steps=steps, workers=st.sampled_from([(1, 3), (3, 2)]))
def test_the_view_is_the_integral_of_its_change_log_across_restarts(spark, file_rows, steps, workers):
    """Random inserts and deletes (a delete removes one copy of a row present): after each
    run, at two worker counts and after a restart, each view holds exactly the rows its
    change log adds up to, which are the ones recomputed in Python."""
    root, inputs = tempfile.mkdtemp(), Counter()
    pipeline = Pipeline(spark, root, circuit(), workers=workers[0], views=SINKS)
    for step, ops in enumerate(steps):
        changes = Counter()
        for k, v, insert in ops:
            present = inputs[(k, v)] + changes[(k, v)]
            if insert or present > 0:
                changes[(k, v)] += 1 if insert else -1
        inputs.update(changes)
        submit(spark, pipeline, step, changes)
        if step == 1:
            pipeline.run()
            pipeline = Pipeline(spark, root, circuit(), workers=workers[1], views=SINKS)
    pipeline.run()
    for sink in SINKS:
        assert view_rows(root, sink) == log_integral(pipeline, sink, len(steps)) == expected(inputs)[sink]
        assert views.read_view(root, sink).step == len(steps) - 1


def test_a_step_rewrites_only_the_files_its_changes_touch(spark, small_files, tmp_path):
    pipeline = Pipeline(spark, str(tmp_path), circuit(), workers=2, views=["big"])
    first = Counter({(k, f"w{k}"): 1 for k in range(3, 43)})
    submit(spark, pipeline, 0, first)
    submit(spark, pipeline, 1, Counter({(7, "w7"): -1}))
    pipeline.run(through=0)
    uri = views.view_uri(pipeline.root, "big")
    before = {f.path: f for f in views.view_files(DeltaTable(uri))}
    assert len(before) >= 8, "40 rows at 3 per file spread over many files"
    pipeline.run()
    after = {f.path for f in views.view_files(DeltaTable(uri))}
    removed, added = set(before) - after, after - set(before)
    assert len(removed) == 1 and len(added) <= 1 and pipeline.views.last_rewrite["big"] == (len(added), 1)
    (gone,) = removed  # the one file that held the deleted row
    assert (7, "w7") in {tuple(r.values()) for r in pq.read_table(f"{uri}/{gone}").to_pylist()}
    assert view_rows(pipeline.root, "big") == first - Counter({(7, "w7"): 1})
    table = DeltaTable(uri)
    protocol = table.protocol()
    assert protocol.min_reader_version == 1 and not protocol.reader_features  # no deletion vectors
    assert table.schema().to_arrow().names == ["k", "v"]  # the user's columns only
    assert table.to_pandas().shape == (39, 2)


@pytest.mark.slow
@pytest.mark.parametrize("point", ["after_output", "after_view", "during_commit", "after_commit"])
def test_a_crash_at_any_point_of_a_step_leaves_the_view_equal_to_the_committed_log(spark, tmp_path, monkeypatch, point):
    """A crash (raised at the fault point, in this process) between the output
    commit, the view's commit and the checkpoint: the next run integrates every committed
    step of the log into the view exactly once."""
    root = str(tmp_path)
    pipeline = Pipeline(spark, root, circuit(), workers=2, views=SINKS)
    data = [
        Counter({(3, "a"): 1, (4, "a"): 1, (1, "b"): 1}),
        Counter({(3, "a"): -1, (5, "c"): 2}),
        Counter({(1, "b"): -1}),
    ]
    for step, changes in enumerate(data):
        submit(spark, pipeline, step, changes)
    pipeline.run(through=0)
    # A step's points are reached at step 1; the checkpoint's, at the run's last step.
    monkeypatch.setenv("DBSP_FAULT", f"{point}:{2 if point.endswith('commit') else 1}")
    monkeypatch.setenv("DBSP_FAULT_MODE", "raise")
    with pytest.raises(InjectedCrash):
        Pipeline(spark, root, circuit(), workers=2, views=SINKS).run()
    monkeypatch.delenv("DBSP_FAULT")
    recovered = Pipeline(spark, root, circuit(), workers=2, views=SINKS)
    assert recovered.run() == 3
    total = sum(data, Counter())
    for sink in SINKS:
        assert view_rows(root, sink) == log_integral(recovered, sink, 2) == expected(total)[sink]
        steps = [int(h["dbsp.step"]) for h in DeltaTable(views.view_uri(root, sink)).history() if "dbsp.step" in h]
        assert sorted(steps) == [0, 1, 2], f"each step integrated once, got commits for steps {steps}"


def test_time_travel_reads_each_committed_step_until_vacuum_and_names_what_is_left(spark, tmp_path):
    pipeline = Pipeline(spark, str(tmp_path), circuit(), workers=1, views=["vs"])
    data = [Counter({(1, "a"): 1}), Counter({(2, "a"): 1, (3, "b"): 1}), Counter({(1, "a"): -1})]
    for step, changes in enumerate(data):
        submit(spark, pipeline, step, changes)
        pipeline.run(through=step)  # a checkpoint per step
    assert [
        Counter(tuple(r.values()) for r in views.read_view(pipeline.root, "vs", s).table.to_pylist()) for s in range(3)
    ] == [Counter({("a",): 1}), Counter({("a",): 2, ("b",): 1}), Counter({("a",): 1, ("b",): 1})]
    latest = views.read_view(pipeline.root, "vs", limit=1)
    assert (latest.step, latest.rows, latest.table.num_rows) == (2, 2, 1)
    with pytest.raises(ViewError, match=r"step 3 is not committed; the committed steps are 0\.\.2"):
        views.read_view(pipeline.root, "vs", 3)
    pipeline.vacuum()
    assert views.read_view(pipeline.root, "vs", 1).rows == 3  # pinned by a retained checkpoint
    with pytest.raises(ViewError, match=r"step 0 was removed by vacuum.*readable steps: \[1, 2\]"):
        views.read_view(pipeline.root, "vs", 0)
    with pytest.raises(ViewError, match=r"sink 'q9' has no current view .*\['vs'\]"):
        views.read_view(pipeline.root, "q9")


@pytest.mark.slow
def test_a_negative_total_is_refused_naming_the_rows_and_a_view_can_start_late(spark, tmp_path):
    root = str(tmp_path)
    pipeline = Pipeline(spark, root, circuit(), workers=2, views=["vs"])
    submit(spark, pipeline, 0, Counter({(1, "a"): 1}))
    submit(spark, pipeline, 1, Counter({(2, "zz"): -1, (3, "b"): 1}))  # retracts a row never inserted
    pipeline.run(through=0)
    with pytest.raises(NegativeViewError, match=r"view 'vs', steps 1\.\.1: .*\('zz',\) x -1.*current: false"):
        pipeline.run()
    assert view_rows(root, "vs") == Counter({("a",): 1})  # left at step 0
    # Opted out (no views), the pipeline runs on; the filtered sink's view then starts late,
    # from the whole log, in one commit.
    assert Pipeline(spark, root, circuit(), workers=2).run() == 2
    assert not DeltaTable(views.view_uri(root, "vs")).history()[0].get("dbsp.step") == "1"
    submit(spark, pipeline, 2, Counter({(4, "c"): 1}))
    late = Pipeline(spark, root, circuit(), workers=2, views=["big"])
    assert late.run() == 3
    assert view_rows(root, "big") == Counter({(3, "b"): 1, (4, "c"): 1})
    assert views.step_versions(views.view_uri(root, "big")) == {2: 1}
    with pytest.raises(ViewError, match=r"no version for step 1: it holds committed steps 2\.\.2"):
        views.read_view(root, "big", 1)


def test_a_small_views_update_makes_no_spark_round_trip(spark, tmp_path):
    """Views that stay one small file (a small step's, as the demo's) are integrated by
    this process: their update makes no round trip to Spark (it ran a write job)."""
    root, inputs = str(tmp_path), Counter({(1, "a"): 2, (3, "b"): 1, (4, "b"): 1, (5, None): 1})
    pipeline = Pipeline(spark, root, circuit(), workers=2)
    submit(spark, pipeline, 0, inputs)
    submit(spark, pipeline, 1, Counter({(1, "a"): -1, (3, "b"): -1, (6, "c"): 1}))
    pipeline.run()
    current = views.CurrentViews(spark, root, SINKS)
    with round_trips(spark) as calls:
        current.update(1)
    assert not calls
    inputs.update({(1, "a"): -1, (3, "b"): -1, (6, "c"): 1})
    for sink in SINKS:
        assert view_rows(root, sink) == log_integral(pipeline, sink, 1) == expected(inputs)[sink]
        (file,) = views.view_files(DeltaTable(views.view_uri(root, sink)))
        assert file.start == 0 and file.rows == sum(expected(inputs)[sink].values())


def test_integrating_in_the_process_gives_the_rows_spark_gives(spark):
    """The process's integration of a one-file view (:func:`views.integrated_rows`) against
    Spark's (:func:`views.integrated`): copies, rows that cancel, negative totals set
    aside, NULLs, and the floating-point values Spark groups together (-0.0 and 0.0, NaN)."""
    nan = float("nan")
    old = [("a", 1.0), ("a", 1.0), ("b", None), ("c", 0.0), (None, nan), ("d", 2.5)]
    changes = [("a", 1.0, -1), ("b", None, -1), ("c", -0.0, 2), (None, nan, 1), ("e", 3.0, -2), ("d", 2.5, 1)]
    schema = "k string, x double"
    kept, aside = views.integrated_rows(
        pa.table({"k": [r[0] for r in old], "x": [r[1] for r in old]}),
        ["k", "x"],
        pa.table({"k": [r[0] for r in changes], "x": [r[1] for r in changes], "_weight": [r[2] for r in changes]}),
    )
    by_spark = views.integrated(
        spark.createDataFrame(old, schema),
        ["k", "x"],
        spark.createDataFrame(changes, f"{schema}, _weight long"),
        [0],
        2,
    ).collect()

    def counted(rows) -> Counter:
        return Counter(tuple("NaN" if isinstance(v, float) and math.isnan(v) else v for v in row) for row in rows)

    assert counted((r["k"], r["x"]) for r in by_spark if r[FILE] == 0) == counted(
        tuple(r.values()) for r in kept.to_pylist()
    )
    assert counted((r["k"], r["x"]) for r in by_spark if r[FILE] == views.NEGATIVE) == counted(
        tuple(r.values()) for r in aside.to_pylist()
    )
    assert counted(tuple(r.values()) for r in kept.to_pylist()) == Counter(
        {("a", 1.0): 1, ("c", 0.0): 3, (None, "NaN"): 2, ("d", 2.5): 2}
    )


def test_each_view_is_a_table_of_the_session_catalog_with_time_travel(spark, tmp_path):
    schema = f"p{tmp_path.name[-8:].replace('-', '_')}"
    pipeline = Pipeline(spark, str(tmp_path), circuit(), views=SINKS, catalog=schema)
    submit(spark, pipeline, 0, Counter({(1, "a"): 1, (3, "b"): 2}))
    pipeline.run(through=0)
    submit(spark, pipeline, 1, Counter({(3, "b"): -1, (4, "c"): 1}))
    pipeline.run(through=1)
    for sink in SINKS:
        uri = views.view_uri(str(tmp_path), sink)
        latest = DeltaTable(uri).version()
        assert Counter(tuple(r) for r in spark.sql(f"SELECT * FROM {schema}.{sink}").collect()) == view_rows(
            str(tmp_path), sink
        )
        before = spark.sql(f"SELECT * FROM {schema}.{sink} VERSION AS OF {latest - 1}").collect()
        assert Counter(tuple(r) for r in before) == view_rows(str(tmp_path), sink, latest - 1)
