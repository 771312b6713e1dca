"""The demo's views compiled from SQL give the hand-built circuits' outputs, step by step."""

from __future__ import annotations

import pytest

from circuits import InMemoryStateStore, StepRunner, from_rows
from circuits.library import nexmark_circuit
from circuits.library.nexmark_queries import nexmark_sql_circuit

from ..oracle import zset
from .harness import SQL_WORKERS, at_every_worker_count, insert_delete_steps
from .test_views import nexmark_rows


@pytest.fixture(scope="module")
def compiled(spark):
    return nexmark_sql_circuit(spark)


@pytest.mark.slow
@at_every_worker_count(
    insert_delete_steps(
        {"persons": nexmark_rows("persons"), "auctions": nexmark_rows("auctions"), "bids": nexmark_rows("bids")},
        max_rows=8,
    ),
    max_examples=2,
    workers=SQL_WORKERS,
)
def test_sql_demo_equals_hand_built_circuits(spark, compiled, workers, steps):
    hand_built = nexmark_circuit()
    assert set(compiled.outputs) == set(hand_built.outputs)
    # An error while planning names the SQL view (file and line) that declared the operator.
    assert compiled.nodes[-1].site.endswith("nexmark.sql:27 (view q15)")
    runners = [StepRunner(c, spark, InMemoryStateStore(), workers=workers) for c in (hand_built, compiled)]
    for t, step in enumerate(steps):
        inputs = {name: from_rows(spark, rows, hand_built.inputs[name]) for name, rows in step.items() if rows}
        want, got = (runner.step(inputs).collect_outputs() for runner in runners)
        for name in hand_built.outputs:
            assert zset(got[name]) == zset(want[name]), f"step {t}, workers={workers}, view {name}"


def test_the_standalone_queries_of_the_demo_file_equal_its_views_in_batch(spark):
    """RECOMPUTE_SQL (the benchmarks' batch peer) is the file's text, temporary views inlined."""
    from circuits.library.nexmark import SCHEMAS, nexmark_records
    from circuits.library.nexmark_queries import NEXMARK_SQL, RECOMPUTE_SQL
    from circuits.sql import batch_views

    records = nexmark_records(0, 2_000)
    tables = {h: spark.createDataFrame([tuple(r.values()) for r in rows], SCHEMAS[h]) for h, rows in records.items()}
    views = batch_views(spark, NEXMARK_SQL.read_text(), tables)
    assert set(RECOMPUTE_SQL) == set(views) == {"bids_by_category", "q3", "q4", "q15"}
    assert "WITH `finals` AS (" in RECOMPUTE_SQL["q4"]
    for name, frame in views.items():
        want = sorted(frame.collect())
        assert want and sorted(spark.sql(RECOMPUTE_SQL[name]).collect()) == want, name
