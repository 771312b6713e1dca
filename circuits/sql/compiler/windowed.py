"""Window functions as columns of a select list (``f(...) OVER (PARTITION BY p ORDER BY o
frame)``), compiled into :class:`circuits.operators.WindowFunctions`: one operator per
``PARTITION BY``, each adding its windows' columns to the rows; the order of tied rows
made total where a function's value depends on it (see :mod:`circuits.sql.windows`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from pyspark.sql import functions as F
from sqlglot import exp

from ..errors import SqlError, construct
from ..parse import DIALECT
from ..windows import order_dependent
from .scope import Col, Rel, _Scope

if TYPE_CHECKING:
    from .core import _Compiler


def windowed(compiler: _Compiler, rel: Rel, scope: _Scope, windows: list[exp.Window]) -> tuple[Rel, _Scope]:
    """``rel`` (a FROM's rows) with the value of each of ``windows`` beside each row (in a
    nameless column), and ``scope`` resolving each window to it."""
    if not windows:
        return rel, scope
    ties = [c.internal for c in rel.cols if c.name and not c.hidden]  # what struct(*) reads
    keys: dict[str, str] = {}  # PARTITION BY expression -> its column
    groups: dict[tuple[str, ...], list[tuple[str, str, str]]] = {}
    scalars, texts = dict(scope.scalars), {}
    for window in windows:
        if window.sql(DIALECT) in scalars:
            continue
        if any(isinstance(n, (exp.Subquery, exp.Exists)) for n in window.walk()):
            raise SqlError(f"a subquery in a window function: {construct(window)}", node=window)
        partition = [compiler.resolve(p, scope) for p in window.args.get("partition_by") or []]
        group = tuple(keys.setdefault(text, compiler.fresh()) for text in partition)
        value = compiler.fresh()
        groups.setdefault(group, []).append(
            (value, compiler.resolve(window.this, scope), _spec(compiler, window, scope, ties))
        )
        scalars[window.sql(DIALECT)] = value
        texts[value] = compiler.resolve(window, scope)
    stream = rel.stream.select(*[c.internal for c in rel.cols], *[F.expr(t).alias(k) for t, k in keys.items()])
    for group, functions in groups.items():
        stream = stream.window(group, functions)
    cols = [*rel.cols, *[Col(None, "", v) for v in texts]]
    types = {**rel.types, **compiler.types_of(rel.schema(), texts)}
    return Rel(stream.select(*[c.internal for c in cols]), cols, types), replace(scope, cols=cols, scalars=scalars)


def _spec(compiler: _Compiler, window: exp.Window, scope: _Scope, ties: list[str]) -> str:
    """``window``'s ``ORDER BY`` (its tie-break appended, if it needs one) and frame, as
    Spark SQL over internal names."""
    order = [compiler.resolve(o, scope) for o in (window.args.get("order") or exp.Order()).expressions]
    if order_dependent(window):
        order += [f"{c} ASC NULLS FIRST" for c in ties]
    frame = window.args.get("spec")
    return " ".join([f"ORDER BY {', '.join(order)}" if order else "", compiler.resolve(frame, scope) if frame else ""])
