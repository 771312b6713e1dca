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


def sum_distinct(column: str) -> Agg:
    return Agg("sum_distinct", column)


def avg_distinct(column: str) -> Agg:
    return Agg("avg_distinct", column)


def var_samp(column: str) -> Agg:
    """The sample variance of the values as doubles (null below two values)."""
    return Agg("var_samp", column)


def var_pop(column: str) -> Agg:
    return Agg("var_pop", column)


def stddev_samp(column: str) -> Agg:
    return Agg("stddev_samp", column)


def stddev_pop(column: str) -> Agg:
    return Agg("stddev_pop", column)


def recomputed(call: str, *reads: str) -> Agg:
    """Any Spark aggregate, ``call`` (Spark SQL over the columns ``reads``), evaluated by
    Spark over each touched group's rows: ``recomputed("max_by(name, price)", "name", "price")``.
    Its value must be a function of the group's rows alone (not of the order Spark meets them in)."""
    return Agg("recomputed", call=call, reads=tuple(reads))
