"""Every example view, incrementally, equals recomputation at every step (hypothesis)."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import strategies as st

from circuits.library import NexmarkGenerator, nexmark_circuit, word_count
from circuits.library.nexmark import SCHEMAS
from circuits.library.wordcount import WORDS_SCHEMA

from ..oracle import sql
from .harness import at_every_worker_count, insert_delete_steps, run_and_compare

GENERATOR = NexmarkGenerator(seed=7, inter_event_ms=3_600_000)  # an event an hour: several days


def nexmark_rows(kind: str):
    """Nexmark events of one kind, from the first few hundred events of the generator."""
    events = [row for k, row in GENERATOR.events(0, 400) if k == kind]
    return st.sampled_from(events)


def nexmark_expected(t, deltas, integrated):
    tables = {name: (SCHEMAS[name], integrated[name]) for name in SCHEMAS}
    return {
        "bids_by_category": (
            "integral",
            sql(
                "SELECT a.category, sum(b.price), count(*) FROM bids b JOIN auctions a ON b.auction = a.id "
                "GROUP BY a.category",
                tables,
            ),
        ),
        "q3": (
            "integral",
            sql(
                "SELECT p.name, p.city, p.state, a.id FROM auctions a JOIN persons p ON a.seller = p.id "
                "WHERE a.category = 10 AND p.state IN ('OR', 'ID', 'CA')",
                tables,
            ),
        ),
        "q4": (
            "integral",
            sql(
                "SELECT category, avg(final) FROM (SELECT a.id, a.category, max(b.price) AS final "
                "FROM auctions a JOIN bids b ON a.id = b.auction "
                "WHERE b.date_time BETWEEN a.date_time AND a.expires GROUP BY a.id, a.category) "
                "GROUP BY category",
                tables,
            ),
        ),
        "q15": (
            "integral",
            sql(
                "SELECT strftime(epoch_ms(date_time), '%Y-%m-%d') AS day, count(*), count(DISTINCT bidder), "
                "count(DISTINCT auction) FROM bids GROUP BY day",
                tables,
            ),
        ),
    }


@pytest.mark.slow
@at_every_worker_count(
    insert_delete_steps(
        {"persons": nexmark_rows("persons"), "auctions": nexmark_rows("auctions"), "bids": nexmark_rows("bids")},
        max_rows=8,
    )
)
def test_nexmark_views_equal_recomputation(spark, workers, steps):
    run_and_compare(spark, nexmark_circuit(), steps, workers, nexmark_expected, compiled=True)


words = st.tuples(st.sampled_from(["F", "f", "M", "m", "Dog", "dog", "DOG"]), st.integers(-3, 5))


def word_count_expected(t, deltas, integrated):
    tables = {name: (WORDS_SCHEMA, integrated[name]) for name in ("upper", "lower")}
    return {
        "totals": (
            "integral",
            sql(
                "SELECT lower(word) AS w, sum(count) FROM "
                "(SELECT * FROM upper UNION ALL SELECT * FROM lower) GROUP BY w",
                tables,
            ),
        )
    }


@pytest.mark.slow
@at_every_worker_count(insert_delete_steps({"upper": words, "lower": words}))
def test_word_count_equals_recomputation(spark, workers, steps):
    run_and_compare(spark, word_count(), steps, workers, word_count_expected, compiled=True)


def test_word_count_of_the_seed(spark):
    """The KLogs example: F 1, M 3 (upper), f 4 (lower), M 4 (upper) -> f 5, m 7."""
    from circuits import InMemoryStateStore, StepRunner, from_rows

    runner = StepRunner(word_count(), spark, InMemoryStateStore(), workers=2)
    totals = Counter()
    for upper, lower in ([("F", 1)], []), ([("M", 3)], []), ([], [("f", 4)]), ([("M", 4)], []):
        result = runner.step(
            {
                "upper": from_rows(spark, [(*r, 1) for r in upper], WORDS_SCHEMA),
                "lower": from_rows(spark, [(*r, 1) for r in lower], WORDS_SCHEMA),
            }
        ).collect_outputs()
        for *row, w in result["totals"]:
            totals[tuple(row)] += w
    assert +totals == Counter({("f", 5): 1, ("m", 7): 1})
