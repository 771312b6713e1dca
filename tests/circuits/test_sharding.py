"""Vnodes and layouts (pure logic, plus one check against Spark's own hash)."""

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql import functions as F

from circuits import CircuitDefinitionError, Layout
from circuits.layouts import initial, rescale
from circuits.sharding import spark_hash_int


def test_python_murmur3_matches_spark_hash(spark):
    values = list(range(-300, 300)) + [2**31 - 1, -(2**31)]
    rows = spark.createDataFrame([(v,) for v in values], "x int").select("x", F.hash("x").alias("h")).collect()
    assert all(spark_hash_int(r.x) == r.h for r in rows)


@given(vnodes=st.integers(1, 1024), workers=st.integers(1, 64))
def test_balanced_layout_is_within_one_vnode(vnodes, workers):
    layout = Layout.balanced(vnodes, workers)
    sizes = Counter(layout.owners)
    counts = [sizes.get(w, 0) for w in range(workers)]
    assert max(counts) - min(counts) <= 1
    assert sum(counts) == vnodes


@pytest.mark.parametrize("workers", [1, 2, 3, 4, 7, 16])
def test_salts_route_each_worker_to_its_own_partition(workers):
    layout = Layout.balanced(256, workers)
    partitions = [spark_hash_int(s) % workers for s in layout._salts]
    assert partitions == list(range(workers))


@pytest.mark.parametrize(
    "layout",
    [
        Layout.balanced(256, 4),
        rescale(Layout.balanced(256, 4), 5),  # scattered ranges after a change
        rescale(initial(256, 3, "dynamic"), 7),
    ],
    ids=["balanced", "fixed 4->5", "dynamic 3->7"],
)
def test_exchange_puts_every_row_on_the_worker_that_owns_its_vnode(spark, layout):
    from circuits.sharding import PART, VNODE, exchange, with_vnode

    df = exchange(with_vnode(spark.range(2000).withColumnRenamed("id", "k"), ["k"], 256), layout)
    seen = df.select(F.spark_partition_id().alias("p"), F.col(VNODE).alias("v")).distinct().collect()
    assert {(r.v, r.p) for r in seen} == {(r.v, layout.owners[r.v]) for r in seen}
    assert len({r.v for r in seen}) == 256
    assert PART in df.columns


def test_bad_layouts_are_refused():
    with pytest.raises(CircuitDefinitionError, match="workers must be at least 1"):
        Layout.balanced(256, 0)
