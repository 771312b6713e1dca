"""An online shop's two topics, as its owner would write them: customers and their orders,
JSON records with dates, UTC timestamps in several ISO-8601 forms and as epoch seconds, and
prices as JSON numbers and as strings; with NULLs, orders of unknown customers, updates
(a retraction and its new row) and bad records of each kind the decoder refuses.

Each record is made from its Python row (``Decimal``, ``date``, UTC ``datetime``), the row
Spark batch SQL is given for the oracle."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal

SCHEMAS = {
    "customers": "id BIGINT, name STRING, country STRING, joined DATE",
    "orders": "id BIGINT, customer BIGINT, price DECIMAL(10,2), qty INT, ts TIMESTAMP",
}

VIEWS = """\
-- Revenue per country and day: a join, to_date over a TIMESTAMP, a DECIMAL sum.
CREATE MATERIALIZED VIEW daily_revenue AS
SELECT c.country, to_date(o.ts) AS day, sum(o.price * o.qty) AS revenue, count(*) AS orders
FROM orders o JOIN customers c ON o.customer = c.id
GROUP BY c.country, to_date(o.ts);

-- What each customer spent, 0 without orders: a LEFT JOIN with COALESCE.
CREATE MATERIALIZED VIEW spending AS
SELECT c.id, c.name, c.country, COALESCE(sum(o.price * o.qty), 0) AS spent
FROM customers c LEFT JOIN orders o ON o.customer = c.id
GROUP BY c.id, c.name, c.country;

-- The three best customers of each country (ties kept).
CREATE MATERIALIZED VIEW top_customers AS
SELECT country, id, spent, r FROM (
  SELECT country, id, spent, RANK() OVER (PARTITION BY country ORDER BY spent DESC) AS r FROM spending
) WHERE r <= 3;

-- Each customer's latest order.
CREATE MATERIALIZED VIEW latest_order AS
SELECT customer, id, ts, price FROM (
  SELECT customer, id, ts, price, ROW_NUMBER() OVER (PARTITION BY customer ORDER BY ts DESC) AS rn FROM orders
) WHERE rn = 1;

-- Customers who never ordered.
CREATE MATERIALIZED VIEW no_orders AS
SELECT c.id, c.name, c.joined FROM customers c
WHERE NOT EXISTS (SELECT 1 FROM orders o WHERE o.customer = c.id);

-- Countries with at least two buyers.
CREATE MATERIALIZED VIEW busy_countries AS
SELECT c.country, count(DISTINCT o.customer) AS buyers
FROM orders o JOIN customers c ON o.customer = c.id
GROUP BY c.country HAVING count(DISTINCT o.customer) >= 2;

-- Customers per spending tier: CASE buckets over another view.
CREATE MATERIALIZED VIEW tiers AS
SELECT tier, count(*) AS customers FROM (
  SELECT CASE WHEN spent >= 500 THEN 'gold' WHEN spent > 0 THEN 'silver' ELSE 'none' END AS tier FROM spending
) GROUP BY tier;

-- The average price per hour.
CREATE MATERIALIZED VIEW hourly AS
SELECT date_trunc('HOUR', ts) AS hour, avg(price) AS avg_price, count(*) AS orders
FROM orders GROUP BY date_trunc('HOUR', ts);
"""

COUNTRIES = ["de", "fr", "us", None]
START = datetime(2024, 2, 28, 22, 0, tzinfo=UTC)
BAD = {
    "orders": [
        {"id": 9001, "customer": 1, "price": "12.345", "qty": 1, "ts": "2024-03-01T00:00:00Z"},
        {"id": 9002, "customer": 1, "price": 1.5, "qty": 1, "ts": "yesterday"},
        {"id": 9003, "customer": 1, "price": 100000000, "qty": 1, "ts": 0},
        {"id": 9004, "customer": 1, "price": 1, "qty": 1.5, "ts": 0},
    ],
    "customers": [{"id": 9005, "name": "x", "country": "de", "joined": "2024-02-30"}],
}
"""A record of each kind the decoder refuses: more digits than the scale, a date that is
no date, a price past the precision, a fraction for an INT, a day that does not exist."""


def _timestamp(moment: datetime, rng: random.Random) -> object:
    """``moment`` in one of the JSON forms a TIMESTAMP takes."""
    form = rng.randrange(4)
    if form == 0:
        return moment.isoformat().replace("+00:00", "Z")
    if form == 1:
        return moment.astimezone(timezone(timedelta(hours=rng.choice([-5, 1, 9])))).isoformat()
    if form == 2:
        return moment.replace(tzinfo=None).isoformat(sep=" ")  # no offset: UTC, the session time zone
    # Epoch seconds: a float's repr keeps the six digits of a second (16 significant digits).
    return float(Decimal((moment - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)).scaleb(-6))


@dataclass
class Shop:
    """The records sent so far (``rows``: their Python rows with weights, per topic)."""

    seed: int = 1
    rows: dict[str, list[tuple]] = field(default_factory=lambda: {"customers": [], "orders": []})
    customers: int = 0
    orders: int = 0

    def step(self, customers: int, orders: int, updates: int) -> dict[str, list[dict]]:
        """The records of a step: new customers, new orders, and ``updates`` orders changed
        (the old row retracted, the new one inserted)."""
        rng = random.Random(self.seed * 1000 + self.orders)
        records: dict[str, list[dict]] = {"customers": [], "orders": []}
        for _ in range(customers):
            i = self.customers
            self.customers += 1
            joined = None if i % 7 == 3 else date(2020, 1, 1) + timedelta(days=rng.randrange(1500))
            row = (i, f"customer {i}", COUNTRIES[i % len(COUNTRIES)], joined)
            self._add(records, "customers", row, joined=None if joined is None else joined.isoformat())
        live = [r for r, w in self._present("orders").items() for _ in range(w)]
        for old in rng.sample(live, min(updates, len(live))):
            self._add(records, "orders", old, weight=-1, ts=self._ts_of(old, rng), price=_price(old[2]))
            new = (*old[:2], (old[2] or 0) + Decimal("1.01"), *old[3:])
            self._add(records, "orders", new, ts=self._ts_of(new, rng), price=_price(new[2]))
        for _ in range(orders):
            i = self.orders
            self.orders += 1
            price = None if i % 11 == 5 else Decimal(rng.randrange(1, 100_000)) / 100
            moment = START + timedelta(seconds=rng.randrange(0, 3 * 86_400), microseconds=rng.randrange(1_000_000))
            row = (1000 + i, rng.randrange(self.customers + 2), price, rng.randrange(1, 5), moment.replace(tzinfo=None))
            self._add(records, "orders", row, price=_price(price, i % 2 == 0), ts=_timestamp(moment, rng))
        return records

    def _ts_of(self, row: tuple, rng: random.Random) -> object:
        return _timestamp(row[4].replace(tzinfo=UTC), rng)

    def _add(self, records: dict, topic: str, row: tuple, weight: int = 1, **forms) -> None:
        names = [c.split()[0] for c in SCHEMAS[topic].split(", ")]
        record = dict(zip(names, row)) | forms
        if weight != 1:
            record["_weight"] = weight
        records[topic].append(record)
        self.rows[topic].append((*row, weight))

    def _present(self, topic: str) -> dict[tuple, int]:
        present: dict[tuple, int] = {}
        for *row, w in self.rows[topic]:
            present[tuple(row)] = present.get(tuple(row), 0) + w
        return {r: w for r, w in present.items() if w > 0}

    def tables(self) -> dict[str, list[tuple]]:
        """Each topic's rows so far, each as many times as its weight (the oracle's input)."""
        return {t: [r for r, w in self._present(t).items() for _ in range(w)] for t in self.rows}


def _price(price: Decimal | None, number: bool = False) -> object:
    """``price`` as a JSON string, or as a JSON number: a float's repr of a decimal of at most
    15 digits is those digits."""
    if price is None:
        return None
    return float(price) if number else str(price)
