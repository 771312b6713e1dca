"""Nexmark views over the streams of :mod:`circuits.library.nexmark`."""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from .. import agg
from ..circuit import Circuit, Stream
from ..sql import compile_sql, standalone_sql
from .nexmark import SCHEMAS

NEXMARK_SQL = Path(__file__).with_name("nexmark.sql")
"""The demo's four views as a file of SQL views (the circuits below, written in SQL)."""

RECOMPUTE_SQL = standalone_sql(NEXMARK_SQL.read_text(), str(NEXMARK_SQL))
"""Each view of :data:`NEXMARK_SQL` as one Spark SQL query over tables named after the
inputs: what a batch job recomputes from scratch (the benchmarks' peer)."""


def bids_by_category(auctions: Stream, bids: Stream) -> Stream:
    """Revenue and number of bids per auction category (join + aggregate).

    ``SELECT a.category, sum(b.price) revenue, count(*) bids
    FROM bids b JOIN auctions a ON b.auction = a.id GROUP BY a.category``
    """
    categories = auctions.select(auction="id", category="category")
    priced = bids.select("auction", "price").join(categories, "auction")
    return priced.group_by("category").agg(revenue=agg.sum("price"), bids=agg.count())


def q3(persons: Stream, auctions: Stream) -> Stream:
    """Nexmark q3, local item suggestion: sellers in OR, ID or CA of auctions in category 10.

    ``SELECT p.name, p.city, p.state, a.id FROM auctions a JOIN persons p ON a.seller = p.id
    WHERE a.category = 10 AND p.state IN ('OR', 'ID', 'CA')``
    """
    sellers = persons.filter(F.col("state").isin("OR", "ID", "CA")).select(
        seller="id", name="name", city="city", state="state"
    )
    offered = auctions.filter(F.col("category") == 10).select("seller", "id")
    return offered.join(sellers, "seller").select("name", "city", "state", "id")


def q4(auctions: Stream, bids: Stream) -> Stream:
    """Nexmark q4, average closing price per category: a join and two chained aggregations.

    ``SELECT category, avg(final) FROM (SELECT a.id, a.category, max(b.price) final
    FROM auctions a JOIN bids b ON a.id = b.auction
    WHERE b.date_time BETWEEN a.date_time AND a.expires GROUP BY a.id, a.category)
    GROUP BY category``
    """
    opened = auctions.select(auction="id", category="category", opened="date_time", expires="expires")
    in_time = (
        bids.select("auction", "price", "date_time")
        .join(opened, "auction")
        .filter(F.col("date_time").between(F.col("opened"), F.col("expires")))
    )
    finals = in_time.group_by("auction", "category").agg(final=agg.max("price"))
    return finals.group_by("category").agg(avg_final=agg.avg("final"))


def q15(bids: Stream) -> Stream:
    """A q15-style count-distinct: per day, bids, distinct bidders and distinct auctions.

    ``SELECT day, count(*), count(DISTINCT bidder), count(DISTINCT auction) FROM bids GROUP BY day``
    """
    daily = bids.select(
        F.date_format(F.timestamp_millis(F.col("date_time")), "yyyy-MM-dd").alias("day"), "bidder", "auction"
    )
    return daily.group_by("day").agg(
        total_bids=agg.count(),
        total_bidders=agg.count_distinct("bidder"),
        total_auctions=agg.count_distinct("auction"),
    )


def nexmark_circuit(
    name: str = "nexmark", queries: tuple[str, ...] = ("bids_by_category", "q3", "q4", "q15")
) -> Circuit:
    """A circuit over the three Nexmark inputs with the chosen views as outputs."""
    circuit = Circuit(name)
    inputs = {input_name: circuit.input(input_name, schema) for input_name, schema in SCHEMAS.items()}
    persons, auctions, bids = inputs["persons"], inputs["auctions"], inputs["bids"]
    views = {
        "bids_by_category": lambda: bids_by_category(auctions, bids),
        "q3": lambda: q3(persons, auctions),
        "q4": lambda: q4(auctions, bids),
        "q15": lambda: q15(bids),
    }
    for query in queries:
        views[query]().output(query)
    return circuit


def revenue_circuit() -> Circuit:
    """The three Nexmark inputs with one view, ``bids_by_category``: a small pipeline to run end to end."""
    return nexmark_circuit("revenue", ("bids_by_category",))


def nexmark_sql_circuit(spark: SparkSession, name: str = "nexmark_sql") -> Circuit:
    """The views of :data:`NEXMARK_SQL` compiled over the three Nexmark inputs."""
    return compile_sql(NEXMARK_SQL.read_text(), SCHEMAS, spark, name=name, file=str(NEXMARK_SQL))
