"""Spark aggregates whose value the engine derives again from a group's rows (``recomputed``:
see :class:`circuits.operators.Aggregate`), and the one answer it gives where Spark's
depends on the order in which it meets the rows.

``max_by(x, y)``/``min_by(x, y)`` over rows tied on ``y`` take the greatest/least ``x``
among them (NULL least): they order by ``(y, x)``, over the rows where ``y`` is not NULL.
``collect_list``/``collect_set`` are sorted ascending (``array_sort``).  The others
(``percentile``, ``percentile_approx``, ``median``) are functions of the rows already.
The oracle (:func:`circuits.sql.batch.tie_broken`) applies the same rewrite, so Spark batch
SQL of it gives the engine's answer."""

from __future__ import annotations

import sqlglot
from sqlglot import exp

DIALECT = "spark"  # parse's, which imports this module

RECOMPUTED = (exp.ArgMax, exp.ArgMin, exp.ArrayAgg, exp.ArrayUniqueAgg, exp.Quantile, exp.ApproxQuantile, exp.Median)
"""The aggregates recomputed per touched group, as sqlglot reads them."""
_COLLECTIONS = (exp.ArrayAgg, exp.ArrayUniqueAgg)
ORDER_DEPENDENT = (exp.ArgMax, exp.ArgMin, *_COLLECTIONS)
"""The recomputed aggregates whose Spark value may depend on the order of the rows."""
_BY = "CASE WHEN _y IS NOT NULL THEN named_struct('y', _y, 'x', _x) END"


def deterministic(call: exp.Expression) -> exp.Expression:
    """``call`` (a copy; an aggregate, or ``agg(...) FILTER (WHERE p)`` whole) with the
    engine's choice among the answers Spark may give."""
    call = call.copy()
    inner = call.this if isinstance(call, exp.Filter) else call
    if isinstance(inner, (exp.ArgMax, exp.ArgMin)):
        x, y = inner.this, inner.expression
        order = sqlglot.parse_one(_BY, read=DIALECT).transform(
            lambda n: (y.copy() if n.name == "_y" else x.copy()) if isinstance(n, exp.Column) else n
        )
        inner.set("expression", order)
    if isinstance(inner, _COLLECTIONS):
        return exp.func("array_sort", call)
    return call


def with_deterministic_aggregates(tree: exp.Expression) -> exp.Expression:
    """``tree`` with every aggregate of :func:`deterministic` rewritten in place."""
    for call in list(tree.find_all(*ORDER_DEPENDENT)):
        whole = call.parent if isinstance(call.parent, exp.Filter) and call.arg_key == "this" else call
        whole.replace(deterministic(whole))
    return tree


def over_no_rows(call: exp.Expression) -> exp.Expression:
    """A recomputed aggregate's value over no rows (``call``: the aggregate, or with its
    ``FILTER``), as Spark gives it: an empty array for ``collect_list``/``collect_set``,
    else NULL."""
    inner = call.this if isinstance(call, exp.Filter) else call
    return exp.func("array") if isinstance(inner, _COLLECTIONS) else exp.null()
