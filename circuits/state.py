"""The state-store interface that stateful operators keep their traces behind.

A trace is a Z-set stored with a :data:`~circuits.sharding.VNODE` column, so that a
step can read just the vnodes and keys its delta touches.  A step never writes a
trace in place: operators *stage* deltas, the runner fuses every output and staged
delta of the step into one DataFrame that the store :meth:`~StateStore.materialize`\\ s
with one Spark job, and the store then :meth:`~StateStore.apply`\\ s the deltas.

The durable implementation lives in ``storage`` (Delta Lake);
:class:`InMemoryStateStore` here serves unit tests.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from .zset import add, consolidate

DEST = "_dest"
FILE = "_file"
"""A column of a state delta that splits its rows into files (it is not stored): rows
with different values never share a file, so each file holds one worker's vnodes."""


def pack(parts: dict[str, DataFrame]) -> DataFrame:
    """All ``parts`` as one DataFrame: a destination number and one struct column per part,
    so that one Spark job computes them all and runs shared shuffles once."""
    return add(*branches(parts), allow_missing=True)


def branches(parts: dict[str, DataFrame]) -> list[DataFrame]:
    """The terms of :func:`pack`: part ``i`` as its destination number ``i`` (column
    :data:`DEST`) and its rows as one struct column (:func:`part_column`)."""
    return [df.select(F.lit(i).alias(DEST), F.struct("*").alias(part_column(i))) for i, df in enumerate(parts.values())]


def packed_columns(count: int) -> list[str]:
    """The columns of :func:`pack` over ``count`` parts."""
    return [DEST, *map(part_column, range(count))]


def part_column(i: int) -> str:
    """The struct column of part ``i`` in :func:`pack`."""
    return f"_d{i}"


def unpack(packed: DataFrame, names: list[str]) -> dict[str, DataFrame]:
    """The inverse of :func:`pack`."""
    return {name: packed.where(F.col(DEST) == i).select(f"{part_column(i)}.*") for i, name in enumerate(names)}


class StateStore(ABC):
    """Where a circuit's traces live between steps."""

    @abstractmethod
    def scan(self, table: str) -> DataFrame | None:
        """The trace ``table`` as of the last applied step (not necessarily consolidated), or None."""

    def prunes(self, table: str) -> bool:
        """Whether a lookup into trace ``table`` is worth naming its keys to :meth:`scan_keys`
        (which costs the lookup a Spark job collecting them): the store can then leave out
        the parts of the trace that cannot hold them.  Known without a job, or False."""
        return False

    def scan_keys(self, table: str, keys: Mapping[str, pa.Array]) -> DataFrame | None:
        """The part of trace ``table`` that may hold a row whose every column named in
        ``keys`` has one of the values listed for it (a null listed: a null may match).
        Every such row is in it; other rows may be.  None: no trace."""
        return self.scan(table)

    def looked_up_by(self, table: str, keys: Sequence[str]) -> None:
        """Trace ``table`` is looked up by ``keys`` (a step's lookups say so before it is
        materialized): a store may lay the trace's large writes out by them, so that the
        files a lookup's few keys fall in are few (see :meth:`scan_keys`).  Ignored by default."""
        return None

    def is_small(self, table: str) -> bool:
        """Whether trace ``table`` is small enough for a lookup to shuffle it whole to the
        step's keys, within the step's job, rather than filter it by a broadcast of the
        keys, which costs a Spark job of its own before the step's.  Known without a job,
        or False."""
        return False

    @abstractmethod
    def materialize(self, parts: dict[str, DataFrame], rows: int | None = None) -> dict[str, DataFrame]:
        """Runs the step's single job over every destination and returns each one's stored result.

        Names are ``output:<handle>`` for outputs and ``state:<table>`` for state deltas.
        ``rows``, when known, is the step's number of input rows: a store may write a
        large step's destinations in another way than a small one's.
        """

    @abstractmethod
    def apply(self, deltas: dict[str, DataFrame]) -> None:
        """Adds each delta (a view over the materialized result) to its trace."""

    @abstractmethod
    def get_meta(self, key: str) -> str | None:
        """A string recorded with the state (such as the circuit fingerprint)."""

    @abstractmethod
    def set_meta(self, key: str, value: str) -> None: ...


class InMemoryStateStore(StateStore):
    """Traces as lists of checkpointed Spark DataFrames, consolidated every few steps.

    Lives in the executors' block managers of one SparkSession; nothing survives the
    process.  For tests of the engine only: ``small_traces`` says which way lookups read
    every trace (see :meth:`StateStore.is_small`), so that tests can cover both.
    """

    def __init__(self, compact_every: int = 8, partitions: int = 2, small_traces: bool = False) -> None:
        self._parts: dict[str, list[DataFrame]] = {}
        self._meta: dict[str, str] = {}
        self._compact_every = compact_every
        self._partitions = partitions
        self._small_traces = small_traces

    def is_small(self, table: str) -> bool:
        return self._small_traces

    def scan(self, table: str) -> DataFrame | None:
        parts = self._parts.get(table)
        return add(*parts) if parts else None

    def materialize(self, parts: dict[str, DataFrame], rows: int | None = None) -> dict[str, DataFrame]:
        # The packed union has a partition per branch and worker; later scans would pay a
        # task for each, so merge them (without a shuffle) first.
        parts = {name: df.drop(FILE) for name, df in parts.items()}
        stored = pack(parts).coalesce(self._partitions).localCheckpoint(eager=True)
        return unpack(stored, list(parts))

    def apply(self, deltas: dict[str, DataFrame]) -> None:
        for table, delta in deltas.items():
            parts = self._parts.setdefault(table, [])
            parts.append(delta)
            if len(parts) > self._compact_every:
                self._parts[table] = [consolidate(self.scan(table)).localCheckpoint(eager=True)]

    def get_meta(self, key: str) -> str | None:
        return self._meta.get(key)

    def set_meta(self, key: str, value: str) -> None:
        self._meta[key] = value
