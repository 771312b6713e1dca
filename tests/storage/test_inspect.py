"""The asset checks' queries over an output log."""

import time
from collections import Counter

from circuits.spark import round_trips
from storage.inspect import count_each, not_a_set, unconsolidated

COLUMNS = "k string, v long, _weight long, _step long"


def test_not_a_set_integrates_the_touched_rows_over_the_whole_log(spark):
    history = spark.createDataFrame(
        [("a", 1, 1, 0), ("b", None, 1, 0), ("c", 3, 2, 0), ("a", 1, 1, 1), ("b", None, -1, 1), ("b", None, 1, 2), ("d", 4, 1, 2), (None, None, 2, 2)],
        COLUMNS,
    )
    step = lambda s: history.where(history._step == s)  # noqa: E731
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
