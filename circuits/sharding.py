"""Vnodes and the exchange, as Spark columns.

Every keyed row belongs to a vnode ``pmod(xxhash64(key columns), S)``.  State is
stored keyed by vnode, so it never depends on how many workers there are; a
:class:`~circuits.vnodes.Layout` assigns vnodes to workers, and :func:`exchange` routes
each row to the Spark partition (the worker) that owns its vnode.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from .vnodes import UNIT_VNODES, Layout

VNODE = "_vnode"
PART = "_part"
ROUTED = (PART, VNODE)
"""The routing columns of a keyed frame.  Every row of a keyed delta or lookup sits on the
worker owning its vnode; keys determine both columns, so joining or grouping by them as
well as the keys changes no result, and tells Spark the rows already sit where they must:
it then works within partitions instead of shuffling again."""


def vnode_of(keys: Sequence[str], vnodes: int) -> Column:
    """``pmod(xxhash64(keys), S)`` as an int column (:func:`circuits.vnodes.vnode_of_key`
    is the same of one string key, without Spark)."""
    return F.pmod(F.xxhash64(*[F.col(k) for k in keys]), F.lit(vnodes)).cast("int")


def unit_of(layout: Layout, vnode: Column) -> Column:
    """The group of vnodes that change owner together (a shard, or a run of
    :data:`UNIT_VNODES` vnodes): storage keeps each group's state in its own files, so a
    layout change rewrites only the groups whose owner changes."""
    return vnode % F.lit(layout.shards) if layout.shards else (vnode / UNIT_VNODES).cast("int")


def part_of(layout: Layout, vnode: Column) -> Column:
    """The partitioning value that sends a row of ``vnode`` to the worker that owns it."""
    salts = F.array(*[F.lit(s) for s in layout.salts])
    return F.element_at(salts, worker_of(layout, vnode) + 1)


def worker_of(layout: Layout, vnode: Column) -> Column:
    if layout.contiguous:
        # Contiguous ranges: arithmetic keeps the plan small (no per-vnode table).
        return (vnode * layout.workers / layout.vnodes).cast("int")
    return F.element_at(F.array(*[F.lit(o) for o in layout.owners]), vnode + 1)


def with_vnode(df: DataFrame, keys: Sequence[str], vnodes: int) -> DataFrame:
    return df.withColumn(VNODE, vnode_of(keys, vnodes))


def exchange(df: DataFrame, layout: Layout) -> DataFrame:
    """Routes every row (which has a :data:`VNODE` column) to the worker that owns its vnode."""
    return df.withColumn(PART, part_of(layout, F.col(VNODE))).repartition(layout.workers, PART)
