"""``ORDER BY ... LIMIT`` and ranking windows bounded by ``<= k``: top-k queries, and the
sort keys a view's ``ORDER BY`` reads that its select list does not show."""

from __future__ import annotations

from dataclasses import replace

from pyspark.sql import functions as F
from pyspark.sql import types as T
from sqlglot import exp

from ... import operators as ops
from ..errors import SqlError, construct
from ..parse import DIALECT, RANKING_FUNCTIONS, one_row, rank_bound
from .scope import Col, Rel, _has_subquery, _Scope


class _Ordering:
    """The top-k part of :class:`~.core._Compiler`."""

    def limited(self, node: exp.Query, rel: Rel, hidden: list[exp.Expression]) -> Rel:
        """A query's ``ORDER BY o LIMIT k`` (the parser allows it on a view's own query
        only, and ``LIMIT k`` alone over rows all alike): a global top-k of its rows, ties
        taken in the order of all their columns.
        An item of ``o`` that is a position or reads only the select list's names is
        computed over the select list's columns; the ``hidden`` others (of
        :func:`_hidden_sorts`) were added to the select list as its last columns, dropped
        after."""
        shown = rel.cols[: len(rel.cols) - len(hidden)]
        scope, added = _Scope([Col(None, c.name, c.internal) for c in shown]), iter(rel.cols[len(shown) :])
        order = []
        # Without ORDER BY the rows are all alike (see constant_rows): any column orders them.
        items = node.args["order"].expressions if node.args.get("order") else [exp.Ordered(this=exp.Literal.number(1))]
        for item in items:
            e = item.this
            if _is_position(e):
                position = int(e.name)
                if not 1 <= position <= len(shown):
                    raise SqlError(f"ORDER BY {position}: the select list has {len(shown)} items", node=e)
                e = exp.column(shown[position - 1].name)
            elif any(e is h for h in hidden):
                order.append((next(added).internal, item))
                continue
            unqualified = e.transform(lambda n: exp.column(n.name) if isinstance(n, exp.Column) else n)
            order.append((self.resolve(unqualified, scope), item))
        k = int(node.args["limit"].expression.name)
        ranked = self.top_k(rel, [], order, k, "row_number", None)
        return Rel(ranked.stream.select(*[c.internal for c in shown]), shown, ranked.types)

    def ranked(self, rel: Rel, scope: _Scope, window: exp.Window) -> tuple[Rel, _Scope]:
        """``rel`` (a FROM's rows) kept where ``window`` (a ranking function, bounded by
        ``<= k`` in the enclosing query: see :func:`~circuits.sql.parse.rank_bound`)
        ranks them at most ``k``, with the rank beside them; ``scope`` resolving the window
        to it.  Ties of ``ROW_NUMBER`` are taken in the order of the rows' columns."""
        if _has_subquery(window):
            raise SqlError(f"a subquery in a window's PARTITION BY or ORDER BY: {construct(window)}", node=window)
        partition = [self.resolve(p, scope) for p in window.args.get("partition_by") or []]
        order = [(self.resolve(o.this, scope), o) for o in window.args["order"].expressions]
        rank = self.fresh()
        ranking = RANKING_FUNCTIONS[type(window.this)]
        ranked = self.top_k(rel, partition, order, rank_bound(window), ranking, rank)
        ranked.types[rank] = T.IntegerType()
        scalars = {**scope.scalars, window.sql(DIALECT): rank}
        return ranked, replace(scope, cols=ranked.cols, scalars=scalars)

    def top_k(
        self,
        rel: Rel,
        partition: list[str],
        order: list[tuple[str, exp.Ordered]],
        k: int,
        ranking: str,
        rank: str | None,
    ) -> Rel:
        """``rel``'s rows ranked at most ``k`` per value of ``partition`` under ``order``
        (Spark SQL texts over its columns, each with its ``ORDER BY`` item), with the rank in
        the nameless column ``rank`` if one is named.  The expressions are computed into
        columns after ``rel``'s own, so ties are taken in the order of ``rel``'s columns."""
        keys = {self.fresh(): text for text in partition}
        sorts = {self.fresh(): text for text, _ in order}
        stream = rel.stream.select(
            *[c.internal for c in rel.cols], *[F.expr(text).alias(c) for c, text in {**keys, **sorts}.items()]
        )
        by = [
            ops.SortKey(c, bool(item.args.get("desc")), item.args.get("nulls_first"))
            for c, (_, item) in zip(sorts, order)
        ]
        stream = stream.top_k(list(keys), by, k, ranking, rank)
        cols = [*rel.cols, *([Col(None, "", rank)] if rank else [])]
        return Rel(stream.select(*[c.internal for c in cols]), cols, dict(rel.types))


def _select_names(query: exp.Select) -> set[tuple[str, str]]:
    """The (qualifier, name) pairs by which an ``ORDER BY`` of ``query`` reads its select
    list, as written: an alias as ``("", alias)``, a column item also by its qualifier (a
    star's columns are not written out)."""
    names = set()
    for e in query.expressions:
        if isinstance(e, exp.Alias):
            names.add(("", e.alias.lower()))
        elif isinstance(e, exp.Column) and not isinstance(e.this, exp.Star):
            names |= {("", e.name.lower()), (e.table.lower(), e.name.lower())}
    return names


def _shown_sort(e: exp.Expression, names: set[tuple[str, str]]) -> bool:
    """Whether the ``ORDER BY`` item ``e`` is computed over the select list (else over the
    query's input, as a hidden column): a position, or no aggregate that reads only ``names``."""
    return (
        _is_position(e)
        or not any(isinstance(n, exp.AggFunc) for n in e.walk())
        and all((c.table.lower(), c.name.lower()) in names for c in e.find_all(exp.Column))
    )


def _hidden_sorts(query: exp.Query) -> list[exp.Expression]:
    """The items of a view's ``ORDER BY ... LIMIT`` that read what its select list does not
    show (an aggregate, a column it does not select or selects under an alias), which Spark
    computes over the query's input: each becomes a select item of its own, dropped after
    the top-k (see :meth:`_Compiler.limited`).  A set operation's order reads only its output."""
    order = query.args.get("order")
    if not isinstance(query, exp.Select) or query.args.get("limit") is None or order is None or one_row(query):
        return []
    names = _select_names(query)
    return [o.this for o in order.expressions if not _shown_sort(o.this, names)]


def _is_position(e: exp.Expression) -> bool:
    """``e`` is an ``ORDER BY`` position (``ORDER BY 2``)."""
    return isinstance(e, exp.Literal) and not e.is_string


def _with_items(query: exp.Select, items: list[exp.Expression]) -> exp.Select:
    """``query`` with ``items`` added to its select list, each under a name of its own."""
    if not items:
        return query
    added = [exp.alias_(e.copy(), f"_dbsp_sort{i}") for i, e in enumerate(items)]
    return query.copy().select(*added, append=True, copy=False)
