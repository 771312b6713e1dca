"""Every operator, incrementally, equals recomputation at every step (hypothesis).

One circuit holds every operator as a separate output, so that one random sequence
of insert/delete steps exercises all of them at once.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import strategies as st
from pyspark.sql import functions as F

from circuits import Circuit, agg

from ..oracle import add_into, sql
from .harness import at_every_worker_count, insert_delete_steps, run_and_compare

A_SCHEMA = "k int, v int, s string"
B_SCHEMA = "k int, x int"

# Few distinct values, with nulls and a hot key, so keys collide, repeat and vanish.
keys = st.one_of(st.just(1), st.integers(0, 4), st.none())
small = st.one_of(st.integers(0, 5), st.none())
texts = st.sampled_from(["a", "b", "a b", "b c a", None])
a_rows = st.tuples(keys, small, texts)
b_rows = st.tuples(keys, small)


def kitchen_sink() -> Circuit:
    c = Circuit("operators")
    a = c.input("a", A_SCHEMA)
    b = c.input("b", B_SCHEMA)
    kv = a.select("k", "v")
    b_as_kv = b.select(k="k", v="x")
    a.filter(F.col("v") > 1).output("filter")
    a.map("k", v1=F.col("v") + 1).output("map")
    a.flat_map("word", F.split("s", " "), "k").output("flat_map")
    kv.union(b_as_kv).output("union")
    kv.minus(b_as_kv).output("minus")
    a.negate().output("negate")
    a.join(b, "k").output("join")
    a.left_join(b, "k").output("left_join")
    kv.distinct().output("distinct")
    a.group_by("k").agg(
        n=agg.count(),
        n_v=agg.count("v"),
        total=agg.sum("v"),
        mean=agg.avg("v"),
        low=agg.min("v"),
        high=agg.max("v"),
        kinds=agg.count_distinct("v"),
    ).output("aggregate")
    a.group_by("k", "s").agg(n=agg.count(), high=agg.max("v")).output("aggregate_two_keys")
    a.integrate().output("integrate")
    a.delay().output("delay")
    a.differentiate().output("differentiate")
    return c


def expected(t: int, deltas: list[dict[str, Counter]], integrated: dict[str, Counter]):
    tables = {"a": (A_SCHEMA, integrated["a"]), "b": (B_SCHEMA, integrated["b"])}
    kv_a = Counter()
    for (k, v, _), w in integrated["a"].items():
        kv_a[(k, v)] += w
    kv_b = Counter()
    for (k, x), w in integrated["b"].items():
        kv_b[(k, x)] += w
    minus = Counter(kv_a)
    add_into(minus, Counter({r: -w for r, w in kv_b.items()}))
    previous = deltas[t - 1]["a"] if t > 0 else Counter()
    change = Counter(deltas[t]["a"])
    add_into(change, Counter({r: -w for r, w in previous.items()}))
    return {
        "filter": ("integral", sql("SELECT k, v, s FROM a WHERE v > 1", tables)),
        "map": ("integral", sql("SELECT k, v + 1 FROM a", tables)),
        "flat_map": (
            "integral",
            sql("SELECT k, unnest(string_split(s, ' ')) FROM a WHERE s IS NOT NULL", tables),
        ),
        "union": ("integral", sql("SELECT k, v FROM a UNION ALL SELECT k, x FROM b", tables)),
        "minus": ("integral", minus),
        "negate": ("integral", Counter({r: -w for r, w in integrated["a"].items()})),
        "join": ("integral", sql("SELECT a.k, v, s, x FROM a JOIN b ON a.k = b.k", tables)),
        "left_join": ("integral", sql("SELECT a.k, v, s, x FROM a LEFT JOIN b ON a.k = b.k", tables)),
        "distinct": ("integral", sql("SELECT DISTINCT k, v FROM a", tables)),
        "aggregate": (
            "integral",
            sql(
                "SELECT k, count(*), count(v), sum(v), avg(v), min(v), max(v), count(DISTINCT v) FROM a GROUP BY k",
                tables,
            ),
        ),
        "aggregate_two_keys": ("integral", sql("SELECT k, s, count(*), max(v) FROM a GROUP BY k, s", tables)),
        "integrate": ("step", Counter(integrated["a"])),
        "delay": ("step", Counter(previous)),
        "differentiate": ("step", change),
    }


@pytest.mark.slow
@at_every_worker_count(insert_delete_steps({"a": a_rows, "b": b_rows}))
def test_every_operator_equals_recomputation(spark, workers, steps):
    run_and_compare(spark, kitchen_sink(), steps, workers, expected, compiled=True)


@pytest.mark.parametrize("workers", [1, 2])  # a large trace's lookup, a small one's
def test_an_extreme_stands_while_rows_hold_it_and_is_derived_again_when_they_all_go(spark, workers):
    """Group 1's max is held by two rows, then one; its min goes and is derived again from
    the values left; its max goes too; a larger value comes and the rest go; group 2's
    values are all null, then one is not."""
    a = [
        [(1, 5, "a", 2), (1, 3, "a", 1), (2, None, "b", 1)],
        [(1, 5, "a", -1)],
        [(1, 4, "a", 1), (1, 3, "a", -1)],
        [(1, 5, "a", -1), (1, 4, "a", 1)],
        [(1, 9, "a", 1), (1, 4, "a", -2), (2, 7, "b", 1)],
        [(1, 9, "a", -1)],
    ]
    run_and_compare(spark, kitchen_sink(), [{"a": rows} for rows in a], workers, expected, compiled=True)
