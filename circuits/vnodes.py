"""Vnodes and layouts without Spark: the hashes and the :class:`Layout` class.

Every keyed row belongs to a vnode ``pmod(xxhash64(key columns), S)``; a :class:`Layout`
assigns vnodes to workers.  This module holds what needs no Spark, so the source gateway
(which loads no PySpark) places its sources with the very hash and layouts the pipeline
uses; the Spark columns that compute and route vnodes are in :mod:`circuits.sharding`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property

from .errors import CircuitDefinitionError

DEFAULT_VNODES = 256
UNIT_VNODES = 4

_MASK32 = 0xFFFFFFFF
_MASK64 = (1 << 64) - 1
_P1, _P2, _P3, _P4, _P5 = (
    11400714785074694791,
    14029467366897019727,
    1609587929392839161,
    9650029242287828579,
    2870177450012600261,
)
SPARK_SEED = 42
"""The seed of Spark's ``xxhash64`` and ``hash``."""


def _rotl32(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _MASK32


def spark_hash_int(value: int, seed: int = SPARK_SEED) -> int:
    """Spark's ``Murmur3Hash`` of one int column (what ``hash(col)`` and hash partitioning use)."""
    k1 = (value & _MASK32) * 0xCC9E2D51 & _MASK32
    k1 = _rotl32(k1, 15) * 0x1B873593 & _MASK32
    h1 = seed ^ k1
    h1 = (_rotl32(h1, 13) * 5 + 0xE6546B64) & _MASK32
    h1 ^= 4
    h1 ^= h1 >> 16
    h1 = h1 * 0x85EBCA6B & _MASK32
    h1 ^= h1 >> 13
    h1 = h1 * 0xC2B2AE35 & _MASK32
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 & 0x80000000 else h1


def _rotl64(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _MASK64


def _round(acc: int, lane: int) -> int:
    return _rotl64((acc + lane * _P2) & _MASK64, 31) * _P1 & _MASK64


def _lane(data: bytes, i: int, width: int = 8) -> int:
    return int.from_bytes(data[i : i + width], "little")


def xxhash64(data: bytes, seed: int = SPARK_SEED) -> int:
    """XXH64 of ``data`` as a signed 64-bit int: Spark's ``xxhash64`` of a string column is
    this of its UTF-8 bytes (so a key lands on the same vnode here as in the pipeline)."""
    n, i = len(data), 0
    if n >= 32:
        acc = [(seed + _P1 + _P2) & _MASK64, (seed + _P2) & _MASK64, seed & _MASK64, (seed - _P1) & _MASK64]
        while i + 32 <= n:
            acc = [_round(a, _lane(data, i + 8 * j)) for j, a in enumerate(acc)]
            i += 32
        h = (_rotl64(acc[0], 1) + _rotl64(acc[1], 7) + _rotl64(acc[2], 12) + _rotl64(acc[3], 18)) & _MASK64
        for a in acc:
            h = ((h ^ _round(0, a)) * _P1 + _P4) & _MASK64
    else:
        h = (seed + _P5) & _MASK64
    h = (h + n) & _MASK64
    while i + 8 <= n:
        h = (_rotl64(h ^ _round(0, _lane(data, i)), 27) * _P1 + _P4) & _MASK64
        i += 8
    if i + 4 <= n:
        h = (_rotl64(h ^ (_lane(data, i, 4) * _P1 & _MASK64), 23) * _P2 + _P3) & _MASK64
        i += 4
    while i < n:
        h = _rotl64(h ^ (data[i] * _P5 & _MASK64), 11) * _P1 & _MASK64
        i += 1
    h ^= h >> 33
    h = h * _P2 & _MASK64
    h ^= h >> 29
    h = h * _P3 & _MASK64
    h ^= h >> 32
    return h - (1 << 64) if h >> 63 else h


def vnode_of_key(key: str, vnodes: int = DEFAULT_VNODES) -> int:
    """``pmod(xxhash64(K), S)`` of one string key, as :func:`circuits.sharding.vnode_of`
    computes it in Spark (Python's ``%`` is ``pmod``)."""
    return xxhash64(key.encode()) % vnodes


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
    def salts(self) -> tuple[int, ...]:
        """Per worker ``w``, the smallest int ``x`` that Spark's hash partitioner sends to
        partition ``w`` (``pmod(murmur3(x), W) == w``): partitioning by it is exact."""
        salts: dict[int, int] = {}
        x = 0
        while len(salts) < self.workers:
            salts.setdefault(spark_hash_int(x) % self.workers, x)
            x += 1
        return tuple(salts[w] for w in range(self.workers))

    @cached_property
    def contiguous(self) -> bool:
        """Whether the workers own contiguous ranges of vnodes, as :meth:`balanced` gives."""
        return self.owners == Layout.balanced(self.vnodes, self.workers).owners
