"""Window functions in a query that groups, rewritten as windows over the groups' rows.

Spark computes ``SELECT k, sum(x), rank() OVER (ORDER BY sum(x)) FROM t GROUP BY k`` in
this order: the aggregate (and ``HAVING``), then the windows over its rows, then
``QUALIFY``, ``DISTINCT`` and ``ORDER BY``.  So such a query is rewritten, before it is
compiled, as a query over its aggregate::

    SELECT g0 AS k, a0, rank() OVER (ORDER BY a0)
    FROM (SELECT k AS g0, sum(x) AS a0 FROM t GROUP BY k)

each aggregate call (``GROUPING()`` too) and each grouping expression outside them read
from the subquery, which is maintained as any ``GROUP BY`` is (grouping sets included:
they are expanded afterwards), and the windows as any window over a relation is.
"""

from __future__ import annotations

from collections.abc import Iterator

from sqlglot import exp

from .errors import SqlError
from .grouping import _grouping_sets, _is_grouping, _key, _unqualified

_CLAUSES = ("expressions", "qualify", "order")
"""The parts of a query that are computed after its aggregate."""


def windows_over_groups(query: exp.Expression) -> exp.Expression:
    """``query`` with each ``SELECT`` that groups and computes window functions (or
    filters with ``QUALIFY``) rewritten over its groups (innermost first)."""
    for select in reversed(list(query.find_all(exp.Select))):
        if (_has_windows(select) or select.args.get("qualify")) and _groups(select):
            over = _over_groups(select)
            if select is query:
                query = over
            else:
                select.replace(over)
    return query


def _has_windows(select: exp.Select) -> bool:
    return any(isinstance(n, exp.Window) for e in _after_aggregate(select) for n in _outside_subqueries(e))


def _groups(select: exp.Select) -> bool:
    having = select.args.get("having")
    parts = [*_after_aggregate(select), *([having] if having else [])]
    return select.args.get("group") is not None or any(True for e in parts for _ in _calls(e))


def _after_aggregate(select: exp.Select) -> list[exp.Expression]:
    parts = []
    for arg in _CLAUSES:
        value = select.args.get(arg)
        parts.extend(value if isinstance(value, list) else [value] if value is not None else [])
    return parts


def groups_columns(select: exp.Select) -> tuple[list[exp.Expression], list[exp.Expression]]:
    """What a window over ``select``'s groups reads of each group, as the columns of the
    subquery it is rewritten over, in their order: the grouping expressions, then the
    aggregate calls (each once).  A window whose value depends on the order of tied rows
    takes them in this order after its own (see :mod:`circuits.sql.windows`)."""
    keys = _grouping_sets(select)[0] if select.args.get("group") else []
    calls: dict[str, exp.Expression] = {}
    for e in _after_aggregate(select):
        for call in _calls(e):
            calls.setdefault(_key(call), call)
    return keys, list(calls.values())


def over_groups(window: exp.Window) -> exp.Select | None:
    """The query whose groups ``window`` runs over, if it is in one that groups."""
    select = window.find_ancestor(exp.Select)
    return select if select is not None and _groups(select) else None


def _over_groups(select: exp.Select) -> exp.Select:
    inner = select.copy()
    for arg in ("qualify", "order", "limit", "distinct", "with_"):
        inner.set(arg, None)
    keys, found = groups_columns(select)
    grouped = {_key(k): (k, f"_dbsp_g{i}") for i, k in enumerate(keys)}
    calls = {_key(c): (c, f"_dbsp_a{i}") for i, c in enumerate(found)}
    inner.set(
        "expressions",
        [exp.alias_(e.copy(), name, quoted=True) for e, name in [*grouped.values(), *calls.values()]],
    )
    outer = select.copy()
    outer.set("group", None)
    outer.set("having", None)
    outer.set("where", None)
    outer.set("joins", None)
    groups = exp.Subquery(this=inner, alias=exp.TableAlias(this=exp.to_identifier("_dbsp_groups")))
    outer.set("from_", exp.From(this=groups))
    aliases = {e.alias.lower() for e in select.expressions if isinstance(e, exp.Alias)}
    items = [_read_from_groups(e, grouped, calls, aliases) for e in outer.expressions]
    outer.set("expressions", [_named(item, e) for item, e in zip(items, select.expressions, strict=True)])
    for arg in ("qualify", "order"):
        if outer.args.get(arg) is not None:
            outer.set(arg, _read_from_groups(outer.args[arg], grouped, calls, aliases))
    return outer


def _named(item: exp.Expression, original: exp.Expression) -> exp.Expression:
    """``item`` under the name Spark gives ``original`` (a query reading the rewritten one
    names its columns so), where the rewrite changed it."""
    if isinstance(item, exp.Alias) or not original.alias_or_name or item.sql("spark") == original.sql("spark"):
        return item
    return exp.alias_(item, original.alias_or_name, quoted=True)


def _read_from_groups(
    e: exp.Expression,
    grouped: dict[str, tuple[exp.Expression, str]],
    calls: dict[str, tuple[exp.Expression, str]],
    aliases: set[str],
) -> exp.Expression:
    """``e`` reading each aggregate call and grouping expression (outside calls and
    subqueries) from the subquery; a column that is neither (nor a select-list alias, which
    ``QUALIFY`` and ``ORDER BY`` may name) is refused, as Spark refuses it."""

    def read(n: exp.Expression) -> exp.Expression:
        if isinstance(n, (exp.Subquery, exp.Query)):
            return n
        if _is_call(n) and _key(n) in calls:
            return exp.column(calls[_key(n)][1], quoted=True)
        found = _grouping(n, grouped)
        if found is not None:
            return exp.column(found, quoted=True)
        if isinstance(n, exp.Column) and (n.table or n.name.lower() not in aliases):
            raise SqlError(
                f"{n.sql('spark')} beside window functions in a query with GROUP BY or aggregates is neither "
                "grouped nor inside an aggregate; group by it or aggregate it",
                node=n,
            )
        return n

    return _replace_top_down(e, read)


def _replace_top_down(e: exp.Expression, read) -> exp.Expression:
    """``e`` with each node ``read`` changes replaced, and ``read`` not applied inside it."""
    new = read(e)
    if new is not e:
        return new
    for arg, value in list(e.args.items()):
        if isinstance(value, exp.Expression):
            e.set(arg, _replace_top_down(value, read))
        elif isinstance(value, list):
            e.set(arg, [_replace_top_down(v, read) if isinstance(v, exp.Expression) else v for v in value])
    return e


def _grouping(n: exp.Expression, grouped: dict[str, tuple[exp.Expression, str]]) -> str | None:
    """The subquery's column of the grouping expression ``n`` is: the same text, or the same
    without qualifiers when only one grouping expression has that."""
    if not isinstance(n, exp.Condition) or isinstance(n, exp.Literal):
        return None  # an identifier (an alias's name) or a constant
    if _key(n) in grouped:
        return grouped[_key(n)][1]
    found = [name for k, name in grouped.values() if _unqualified(k) == _unqualified(n)]
    return found[0] if len(found) == 1 else None


def _is_call(n: exp.Expression) -> bool:
    """``n`` calls an aggregate (``GROUPING`` included), with its ``FILTER`` if it has one."""
    if isinstance(n, exp.Filter):
        return isinstance(n.this, exp.AggFunc)
    return (isinstance(n, exp.AggFunc) or _is_grouping(n)) and not isinstance(n.parent, exp.Filter)


def _calls(e: exp.Expression) -> Iterator[exp.Expression]:
    """The outermost aggregate calls of ``e``, outside subqueries: a window's own function
    is none (``sum(sum(x)) OVER ()`` calls ``sum(x)``)."""
    if isinstance(e, (exp.Subquery, exp.Query)):
        return
    if _is_call(e):
        yield e
        return
    if isinstance(e, exp.Window):
        function = e.this
        while isinstance(function, (exp.IgnoreNulls, exp.RespectNulls)):
            function = function.this
        frame = [v for k, v in e.args.items() if k != "this"]
        for child in [*function.iter_expressions(), *_flattened(frame)]:
            yield from _calls(child)
        return
    for child in e.iter_expressions():
        yield from _calls(child)


def _flattened(values: list) -> list[exp.Expression]:
    return [e for v in values for e in (v if isinstance(v, list) else [v]) if isinstance(e, exp.Expression)]


def _outside_subqueries(e: exp.Expression) -> Iterator[exp.Expression]:
    return e.walk(prune=lambda n: isinstance(n, (exp.Subquery, exp.Query)) and n is not e)
