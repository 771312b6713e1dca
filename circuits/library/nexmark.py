"""A deterministic, seeded Nexmark event generator.

Nexmark models an online auction: people register, open auctions in categories,
and bid.  Events come in the standard proportion person:auction:bid = 1:3:46.  Event
``i`` depends only on ``(seed, i)``, so any split of the sequence into steps yields the
same events.  Times are epoch milliseconds (UTC).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession

from ..sql.parse import ddl_columns
from ..zset import from_rows

PERSON_SCHEMA = "id bigint, name string, email string, city string, state string, date_time bigint"
AUCTION_SCHEMA = (
    "id bigint, item_name string, initial_bid bigint, reserve bigint, date_time bigint, expires bigint, "
    "seller bigint, category bigint"
)
BID_SCHEMA = "auction bigint, bidder bigint, price bigint, channel string, date_time bigint"
SCHEMAS = {"persons": PERSON_SCHEMA, "auctions": AUCTION_SCHEMA, "bids": BID_SCHEMA}
COLUMNS = {name: ddl_columns(ddl) for name, ddl in SCHEMAS.items()}

PROPORTION = 50  # events per cycle: 1 person, 3 auctions, 46 bids
PERSONS_PER_CYCLE, AUCTIONS_PER_CYCLE = 1, 3
BIDS_PER_CYCLE = PROPORTION - PERSONS_PER_CYCLE - AUCTIONS_PER_CYCLE
FIRST_ID = 1000
FIRST_CATEGORY, CATEGORIES = 10, 5
STATES = ("AZ", "CA", "ID", "OR", "WA", "WY")
CITIES = ("Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend", "Redmond", "Seattle", "Kent")
FIRST_NAMES = ("Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter", "Walter")
LAST_NAMES = ("Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones", "Noris")
CHANNELS = ("Google", "Facebook", "Baidu", "Apple")
HOT_RATIO = 4  # one bid in HOT_RATIO goes to a hot (recent) auction or by a hot bidder


@dataclass(frozen=True)
class NexmarkGenerator:
    seed: int = 0
    start_ms: int = 1_700_000_000_000
    inter_event_ms: int = 100

    def event(self, i: int) -> tuple[str, tuple]:
        """Event ``i``: ``("persons" | "auctions" | "bids", row)``."""
        rng = random.Random(self.seed * 1_000_003 + i)
        cycle, offset = divmod(i, PROPORTION)
        now = self.start_ms + i * self.inter_event_ms
        if offset < PERSONS_PER_CYCLE:
            return "persons", self._person(rng, FIRST_ID + cycle, now)
        if offset < PERSONS_PER_CYCLE + AUCTIONS_PER_CYCLE:
            auction_id = FIRST_ID + cycle * AUCTIONS_PER_CYCLE + offset - PERSONS_PER_CYCLE
            return "auctions", self._auction(rng, auction_id, cycle, now)
        return "bids", self._bid(rng, cycle, now)

    def events(self, start: int, count: int) -> Iterator[tuple[str, tuple]]:
        return (self.event(i) for i in range(start, start + count))

    def index(self, date_time: int) -> int:
        """The index of the event at ``date_time``."""
        return (date_time - self.start_ms) // self.inter_event_ms

    def _person(self, rng: random.Random, person_id: int, now: int) -> tuple:
        name = f"{rng.choice(FIRST_NAMES)} {rng.choice(LAST_NAMES)}"
        email = f"{name.split()[0].lower()}{person_id}@example.com"
        return (person_id, name, email, rng.choice(CITIES), rng.choice(STATES), now)

    def _auction(self, rng: random.Random, auction_id: int, cycle: int, now: int) -> tuple:
        seller = FIRST_ID + (cycle if rng.randrange(HOT_RATIO) else rng.randrange(cycle + 1))
        initial = rng.randrange(1, 1000)
        return (
            auction_id,
            f"item-{auction_id}",
            initial,
            initial + rng.randrange(0, 2000),
            now,
            now + rng.randrange(1, 20) * self.inter_event_ms * PROPORTION,
            seller,
            FIRST_CATEGORY + rng.randrange(CATEGORIES),
        )

    def _bid(self, rng: random.Random, cycle: int, now: int) -> tuple:
        last_auction = FIRST_ID + cycle * AUCTIONS_PER_CYCLE + AUCTIONS_PER_CYCLE - 1
        if rng.randrange(HOT_RATIO):
            auction = last_auction - rng.randrange(min(AUCTIONS_PER_CYCLE * 2, last_auction - FIRST_ID + 1))
        else:
            auction = FIRST_ID + rng.randrange(last_auction - FIRST_ID + 1)
        bidder = FIRST_ID + (cycle if not rng.randrange(HOT_RATIO) else rng.randrange(cycle + 1))
        return (auction, bidder, rng.randrange(1, 10_000), rng.choice(CHANNELS), now)


def nexmark_records(start: int, count: int, seed: int = 0) -> dict[str, list[dict]]:
    """Events ``start..start+count`` as JSON-ready records per input (what a producer sends)."""
    records: dict[str, list[dict]] = {name: [] for name in SCHEMAS}
    for kind, row in NexmarkGenerator(seed=seed).events(start, count):
        records[kind].append(dict(zip(COLUMNS[kind], row)))
    return records


def nexmark_inputs(spark: SparkSession, events: list[tuple[str, tuple]], weight: int = 1) -> dict[str, DataFrame]:
    """Z-sets of ``events`` (each with ``weight``) per input: persons, auctions, bids."""
    rows: dict[str, list[tuple]] = {name: [] for name in SCHEMAS}
    for kind, row in events:
        rows[kind].append((*row, weight))
    return {name: from_rows(spark, rows[name], schema) for name, schema in SCHEMAS.items()}


# The demo's Delta tables, upserted by one MERGE each per batch: the key each MERGE matches on.
KEYS = {"persons": "id", "auctions": "id", "bids": "date_time"}  # a bid's time is its event's, unique
UPSERT, DELETE = "upsert", "delete"


def nexmark_changes(start: int, count: int, seed: int = 0) -> dict[str, list[tuple[str, tuple]]]:
    """The changes a batch of events ``start..start+count`` makes to the demo's Delta tables,
    ``(UPSERT | DELETE, row)`` per table, at most one per key: each new event inserted, and
    for every 100 events one earlier person moved to another city and state, one earlier
    auction moved to another category, and one earlier bid retracted (deleted).  The last
    cycle of events before ``start`` is never changed, so :meth:`NexmarkGenerator.index`
    of the latest ``date_time`` in the tables always tells where the sequence goes on."""
    generator = NexmarkGenerator(seed=seed)
    batch: dict[str, dict] = {name: {} for name in SCHEMAS}

    def put(name: str, change: str, row: tuple) -> None:
        batch[name][row[COLUMNS[name].index(KEYS[name])]] = (change, row)

    cycles = start // PROPORTION - 1  # the cycles before the last one started
    rng = random.Random(seed * 1_000_003 - start - 1)  # never an event's own stream
    for _ in range(count // 100 if cycles > 0 else 0):
        cycle = rng.randrange(cycles)
        _, person = generator.event(cycle * PROPORTION)
        put("persons", UPSERT, (*person[:3], rng.choice(CITIES), rng.choice(STATES), person[5]))
        _, auction = generator.event(cycle * PROPORTION + PERSONS_PER_CYCLE + rng.randrange(AUCTIONS_PER_CYCLE))
        put("auctions", UPSERT, (*auction[:7], FIRST_CATEGORY + rng.randrange(CATEGORIES)))
        _, bid = generator.event(
            cycle * PROPORTION + PERSONS_PER_CYCLE + AUCTIONS_PER_CYCLE + rng.randrange(BIDS_PER_CYCLE)
        )
        put("bids", DELETE, bid)
    for kind, row in generator.events(start, count):
        put(kind, UPSERT, row)
    return {name: list(changes.values()) for name, changes in batch.items()}
