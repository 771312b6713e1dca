"""Vnodes and layouts (pure logic, plus one check against Spark's own hash)."""

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql import functions as F

from circuits import CircuitDefinitionError, Layout
from circuits.layouts import initial, rescale
from circuits.sharding import vnode_of
from circuits.vnodes import spark_hash_int, vnode_of_key, xxhash64


def test_python_murmur3_matches_spark_hash(spark):
    values = list(range(-300, 300)) + [2**31 - 1, -(2**31)]
    rows = spark.createDataFrame([(v,) for v in values], "x int").select("x", F.hash("x").alias("h")).collect()
    assert all(spark_hash_int(r.x) == r.h for r in rows)


def test_xxhash64_and_vnodes_are_sparks():
    # Values from Spark's F.xxhash64 and F.pmod(F.xxhash64(k), 256) on the same strings.
    assert xxhash64(b"") == -7444071767201028348 and vnode_of_key("") == 4
    assert xxhash64(b"a") == -8582455328737087284 and vnode_of_key("a") == 204
    assert xxhash64(b"abc") == 1423657621850124518 and vnode_of_key("abc") == 230
    assert xxhash64(b"file-0001.log") == -5279074386861647070 and vnode_of_key("file-0001.log") == 34
    assert xxhash64(b"", 0) & (2**64 - 1) == 0xEF46DB3751D8E999  # the reference vector
    long_key = "source/" + "q" * 60  # the 32-byte stripes
    assert vnode_of_key(long_key) == xxhash64(long_key.encode()) % 256


def test_vnode_of_key_is_sparks_vnode_of(spark):
    keys = ["", "a", "file-0001.log", "source/" + "q" * 60, "é-ü"]
    rows = spark.createDataFrame([(k,) for k in keys], "k string").select("k", vnode_of(["k"], 256).alias("v"))
    assert {r.k: r.v for r in rows.collect()} == {k: vnode_of_key(k) for k in keys}


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
    partitions = [spark_hash_int(s) % workers for s in layout.salts]
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
