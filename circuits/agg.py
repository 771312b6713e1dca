"""Aggregates for :meth:`circuits.GroupedStream.agg`: ``agg.sum("price")`` and friends."""

from __future__ import annotations

from .operators.nonlinear import Agg


def count(column: str | None = None) -> Agg:
    """``count(*)`` without a column, ``count(column)`` (non-null values) with one."""
    return Agg("count", column)


def sum(column: str) -> Agg:
    return Agg("sum", column)


def avg(column: str) -> Agg:
    return Agg("avg", column)


def min(column: str) -> Agg:
    return Agg("min", column)


def max(column: str) -> Agg:
    return Agg("max", column)


def count_distinct(column: str) -> Agg:
    return Agg("count_distinct", column)
