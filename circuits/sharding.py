"""Vnodes, layouts and the exchange.

Every keyed row belongs to a vnode ``pmod(xxhash64(key columns), S)``.  State is
stored keyed by vnode, so it never depends on how many workers there are; a
:class:`Layout` assigns vnodes to workers, and :func:`exchange` routes each row to
the Spark partition (the worker) that owns its vnode.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from .errors import CircuitDefinitionError

VNODE = "_vnode"
PART = "_part"
ROUTED = (PART, VNODE)
"""The routing columns of a keyed frame.  Every row of a keyed delta or lookup sits on the
worker owning its vnode; keys determine both columns, so joining or grouping by them as
well as the keys changes no result, and tells Spark the rows already sit where they must:
it then works within partitions instead of shuffling again."""
DEFAULT_VNODES = 256
UNIT_VNODES = 4

_MASK = 0xFFFFFFFF


def vnode_of(keys: Sequence[str], vnodes: int) -> Column:
    """``pmod(xxhash64(keys), S)`` as an int column."""
    return F.pmod(F.xxhash64(*[F.col(k) for k in keys]), F.lit(vnodes)).cast("int")


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _MASK


def spark_hash_int(value: int, seed: int = 42) -> int:
    """Spark's ``Murmur3Hash`` of one int column (what ``hash(col)`` and hash partitioning use)."""
    k1 = (value & _MASK) * 0xCC9E2D51 & _MASK
    k1 = _rotl(k1, 15) * 0x1B873593 & _MASK
    h1 = seed ^ k1
    h1 = (_rotl(h1, 13) * 5 + 0xE6546B64) & _MASK
    h1 ^= 4
    h1 ^= h1 >> 16
    h1 = h1 * 0x85EBCA6B & _MASK
    h1 ^= h1 >> 13
    h1 = h1 * 0xC2B2AE35 & _MASK
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 & 0x80000000 else h1


@dataclass(frozen=True)
class Layout:
    """The assignment of ``S`` vnodes to ``W`` workers: ``owners[v]`` is vnode ``v``'s worker.

    ``shards`` is set by the dynamic strategy (:mod:`circuits.layouts`): vnode ``v`` then
    belongs to shard ``v % shards``, and every vnode of a shard has the shard's owner.
    """

    owners: tuple[int, ...]
    workers: int
    shards: int = 0
    k: float = 0.0

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise CircuitDefinitionError(f"workers must be at least 1, got {self.workers}")
        if not self.owners or any(not 0 <= o < self.workers for o in self.owners):
            raise CircuitDefinitionError("every vnode must be owned by a worker in 0..workers-1")

    @classmethod
    def balanced(cls, vnodes: int, workers: int) -> Layout:
        """Contiguous ranges of vnodes, sizes differing by at most one."""
        if vnodes < 1:
            raise CircuitDefinitionError(f"vnodes must be at least 1, got {vnodes}")
        if workers < 1:
            raise CircuitDefinitionError(f"workers must be at least 1, got {workers}")
        return cls(tuple(v * workers // vnodes for v in range(vnodes)), workers)

    @property
    def vnodes(self) -> int:
        return len(self.owners)

    def unit_of(self, vnode: Column) -> Column:
        """The group of vnodes that change owner together (a shard, or a run of
        :data:`UNIT_VNODES` vnodes): storage keeps each group's state in its own files, so a
        layout change rewrites only the groups whose owner changes."""
        return vnode % F.lit(self.shards) if self.shards else (vnode / UNIT_VNODES).cast("int")

    def to_json(self) -> str:
        return json.dumps({"workers": self.workers, "owners": list(self.owners), "shards": self.shards, "k": self.k})

    @classmethod
    def from_json(cls, text: str) -> Layout:
        data = json.loads(text)
        return cls(tuple(data["owners"]), data["workers"], data.get("shards", 0), data.get("k", 0.0))

    def describe(self) -> str:
        """``"256 vnodes over 2 workers: 0-127:w0 128-255:w1"`` (runs of vnodes per worker)."""
        runs, start = [], 0
        for v in range(1, self.vnodes + 1):
            if v == self.vnodes or self.owners[v] != self.owners[start]:
                runs.append(f"{start}-{v - 1}:w{self.owners[start]}")
                start = v
        strategy = f"dynamic, {self.shards} shards, k={self.k:g}" if self.shards else "fixed"
        return f"{self.vnodes} vnodes over {self.workers} workers ({strategy}): {' '.join(runs)}"

    @cached_property
    def _salts(self) -> tuple[int, ...]:
        # Spark's hash partitioner sends an int x to partition pmod(murmur3(x), W). For each
        # worker w we pick the smallest x landing on w, so partitioning by that x is exact.
        salts: dict[int, int] = {}
        x = 0
        while len(salts) < self.workers:
            salts.setdefault(spark_hash_int(x) % self.workers, x)
            x += 1
        return tuple(salts[w] for w in range(self.workers))

    def part_of(self, vnode: Column) -> Column:
        """The partitioning value that sends a row of ``vnode`` to the worker that owns it."""
        salts = F.array(*[F.lit(s) for s in self._salts])
        return F.element_at(salts, self.worker_of(vnode) + 1)

    @cached_property
    def _contiguous(self) -> bool:
        return self.owners == Layout.balanced(self.vnodes, self.workers).owners

    def worker_of(self, vnode: Column) -> Column:
        if self._contiguous:
            # Contiguous ranges: arithmetic keeps the plan small (no per-vnode table).
            return (vnode * self.workers / self.vnodes).cast("int")
        return F.element_at(F.array(*[F.lit(o) for o in self.owners]), vnode + 1)


def with_vnode(df: DataFrame, keys: Sequence[str], vnodes: int) -> DataFrame:
    return df.withColumn(VNODE, vnode_of(keys, vnodes))


def exchange(df: DataFrame, layout: Layout) -> DataFrame:
    """Routes every row (which has a :data:`VNODE` column) to the worker that owns its vnode."""
    return df.withColumn(PART, layout.part_of(F.col(VNODE))).repartition(layout.workers, PART)
