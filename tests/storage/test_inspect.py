"""The asset checks' queries over an output log."""

import time
from collections import Counter

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from circuits.spark import round_trips
from storage import inspect
from storage.inspect import (
    count_each,
    not_a_set,
    not_a_set_rows,
    unconsolidated,
    unconsolidated_rows,
)
from storage.logs import OutputLog, output_uri

COLUMNS = "k string, v long, _weight long, _step long"
ARROW = pa.schema([("k", pa.string()), ("v", pa.int64()), ("_weight", pa.int64()), ("_step", pa.int64())])
HISTORY = [
    ("a", 1, 1, 0),
    ("b", None, 1, 0),
    ("c", 3, 2, 0),
    ("a", 1, 1, 1),
    ("b", None, -1, 1),
    ("b", None, 1, 2),
    ("d", 4, 1, 2),
    (None, None, 2, 2),
]


def test_not_a_set_integrates_the_touched_rows_over_the_whole_log(spark):
    history = spark.createDataFrame(HISTORY, COLUMNS)
    step = lambda s: history.where(history._step == s)
    # Step 1 made "a" a duplicate (weight 2); "b" (a null value) left, which is fine.
    assert not_a_set(history.where("_step <= 1"), step(1)).count() == 1
    # Step 2 touched "b" (back to 1), "d" (new) and an all-null row, twice: one bad row.
    # "c" was broken at step 0, which the check of step 0 reports; a later check reads
    # only the rows its steps touch.
    assert not_a_set(history, step(2)).count() == 1
    assert not_a_set(history.where("_step = 0"), step(0)).count() == 1


def test_unconsolidated_finds_zero_weights_and_repeated_rows_of_a_step(spark):
    changes = spark.createDataFrame([("a", 1, 1, 0), ("a", 1, 1, 0), ("b", 2, 0, 0), ("c", 3, 1, 0)], COLUMNS)
    assert unconsolidated(changes).count() == 2


def test_count_each_counts_every_query_with_one_job(spark):
    rows = spark.range(10)
    queries = {"all": rows, "odd": rows.where("id % 2 = 1"), "none": rows.where("id < 0"), "big": rows.where("id > 6")}
    with round_trips(spark) as calls:
        assert count_each(queries) == {"all": 10, "odd": 5, "none": 0, "big": 3}
    assert calls["ExecutePlan"] == 1


def test_round_trips_times_the_calls_it_counts(spark):
    seconds = Counter()
    with round_trips(spark, seconds=seconds) as calls:
        started = time.perf_counter()
        spark.conf.set("spark.sql.shuffle.partitions", "2")
        assert spark.range(3).collect()
        waited = time.perf_counter() - started
    assert set(seconds) == set(calls) == {"Config", "ExecutePlan"}
    assert all(s > 0 for s in seconds.values()) and sum(seconds.values()) <= waited


def _arrow(rows) -> pa.Table:
    return pa.Table.from_pylist([dict(zip(ARROW.names, r, strict=True)) for r in rows], schema=ARROW)


def test_the_arrow_checks_count_what_the_spark_queries_find():
    step = lambda s: [r for r in HISTORY if r[3] == s]
    assert not_a_set_rows(_arrow([r for r in HISTORY if r[3] <= 1]), _arrow(step(1))) == 1
    assert not_a_set_rows(_arrow(HISTORY), _arrow(step(2))) == 1
    assert not_a_set_rows(_arrow(step(0)), _arrow(step(0))) == 1
    assert unconsolidated_rows(_arrow([("a", 1, 1, 0), ("a", 1, 1, 0), ("b", 2, 0, 0), ("c", 3, 1, 0)])) == 2


def test_a_small_output_log_is_checked_without_spark_and_a_large_one_by_one_job(spark, tmp_path, monkeypatch):
    # Step 2 repeats "d" (unconsolidated, and "d" integrates to 2) and brings the null row to 2.
    write_deltalake(output_uri(str(tmp_path), "o"), _arrow([*HISTORY, ("d", 4, 1, 2)]))
    outputs = OutputLog(spark, str(tmp_path))
    expected = {("o", "consolidated"): 1, ("o", "is_a_set"): 2, ("p", "consolidated"): 1}
    write_deltalake(output_uri(str(tmp_path), "p"), _arrow([("x", 1, 1, 2), ("x", 1, 1, 2)]))
    # The view of "o" as of step 2, a row per copy: the log's integral, which the set
    # check reads instead of the whole log when the output has one.
    copies = [("a", 1)] * 2 + [("b", None)] + [("c", 3)] * 2 + [("d", 4)] * 2 + [(None, None)] * 2
    view = pa.Table.from_pylist([{"k": k, "v": v} for k, v in copies], schema=pa.schema(list(ARROW)[:2]))
    write_deltalake(str(tmp_path / "view"), view)
    local = inspect.LOCAL_ROWS
    for views in ({}, {"o": DeltaTable(str(tmp_path / "view"))}):
        for rows, jobs in ((local, 0), (0, 1)):
            monkeypatch.setattr(inspect, "LOCAL_ROWS", rows)
            with round_trips(spark) as calls:
                assert inspect.check_outputs(outputs, {"o": True, "p": False}, 2, 2, views) == expected
            assert calls["ExecutePlan"] == jobs
    # The view, not the log, is what the set check counted: with one copy of "d" gone, only
    # the all-null row is bad.
    write_deltalake(str(tmp_path / "view"), pa.concat_tables([view.slice(0, 6), view.slice(7)]), mode="overwrite")
    checked = inspect.check_outputs(outputs, {"o": True}, 2, 2, {"o": DeltaTable(str(tmp_path / "view"))})
    assert checked[("o", "is_a_set")] == 1


def test_dead_letters_of_steps_count_each_topics_and_give_the_first_reasons(tmp_path):
    uri = str(tmp_path / "_dead_letters")
    assert inspect.dead_letters_of_steps(uri, 0, 9, 2) == {}  # no table yet
    letters = pa.table(
        {
            "topic": ["a", "a", "a", "b"],
            "partition": [0, 0, 1, 1],
            "offset": [5, 3, 9, 1],
            "reason": ["r5", "r3", "r9", "rb"],
            "value": ["x", "y", "w", "z"],
            "_step": [1, 1, 1, 2],
        }
    )
    write_deltalake(uri, letters.slice(0, 2))
    write_deltalake(uri, letters.slice(2), mode="append")
    assert inspect.dead_letters_of_steps(uri, 1, 1, 2) == {
        "a": (3, ["partition 0 offset 3: r3", "partition 0 offset 5: r5"])
    }
    assert inspect.dead_letters_of_steps(uri, 2, 5, 2) == {"b": (1, ["partition 1 offset 1: rb"])}
