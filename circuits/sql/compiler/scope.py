"""The compiled relations (:class:`Rel`: a stream, its columns and their types) and the
scopes that resolve what a query calls a column to a relation's internal names."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

from pyspark.sql import types as T
from sqlglot import exp

from ...circuit import Stream
from ..errors import SqlError
from ..parse import DIALECT


@dataclass(frozen=True)
class Col:
    qualifier: str | None
    name: str
    internal: str
    hidden: bool = False
    """Named only with its qualifier (``t.k``), as a side's key of a ``USING`` join is:
    the unqualified name and ``*`` give the join's one column of that name."""


@dataclass
class Rel:
    """A compiled relation: its stream and its columns in order."""

    stream: Stream
    cols: list[Col]
    types: dict[str, T.DataType]
    """Each internal column's Spark type."""

    def named(self, qualifier: str | None) -> Rel:
        return Rel(self.stream, [replace(c, qualifier=qualifier) for c in self.cols], self.types)

    def renamed(self, names: list[str]) -> Rel:
        """The columns named ``names`` (a column list: ``AS t (a, b)``, ``WITH t (a, b) AS``), if any."""
        if not names:
            return self
        if len(names) != len(self.cols):
            raise SqlError(
                f"the column list ({', '.join(names)}) names {len(names)} columns of {len(self.cols)}; name each once"
            )
        return Rel(self.stream, [Col(c.qualifier, n, c.internal) for c, n in zip(self.cols, names)], self.types)

    def schema(self) -> T.StructType:
        return T.StructType([T.StructField(c.internal, self.types[c.internal]) for c in self.cols])


@dataclass
class _Scope:
    cols: list[Col]
    outer: _Scope | None = None
    aliases: dict[str, exp.Expression] = field(default_factory=dict)
    """Select-list aliases that GROUP BY and HAVING may name (Spark resolves them)."""
    scalars: dict[str, str] = field(default_factory=dict)
    """The scalar subqueries joined into the relation, the windows computed into it and the
    ``IN``/``EXISTS`` predicates marked in it (their SQL): each one's value, as Spark SQL
    over internal names."""

    def find(self, column: exp.Column) -> Col | None:
        name, table = column.name.lower(), column.table.lower()
        found = [
            c
            for c in self.cols
            if c.name.lower() == name and ((c.qualifier or "").lower() == table if table else not c.hidden)
        ]
        if len(found) > 1:
            raise SqlError(f"column {column.sql(DIALECT)} is ambiguous; qualify it with its table", node=column)
        return found[0] if found else None

    def is_local(self, expression: exp.Expression) -> bool:
        """Every column of ``expression`` is one of this scope's."""
        return all(self.find(c) is not None for c in _columns(expression))


def _found(column: exp.Column, scope: _Scope | None) -> Col | None:
    """``column`` in ``scope``, else in the nearest scope enclosing it that has it."""
    while scope is not None:
        found = scope.find(column)
        if found is not None:
            return found
        scope = scope.outer
    return None


def _star_columns(e: exp.Expression, scope: _Scope) -> list[Col] | None:
    """The columns of ``scope`` that ``e`` stands for if it is ``*`` or ``t.*`` (None if
    it is no star)."""
    column_star = isinstance(e, exp.Column) and isinstance(e.this, exp.Star)
    if not (isinstance(e, exp.Star) or column_star):
        return None
    table = e.table.lower() if column_star else ""
    # A column without a name is a scalar subquery's value, joined in: not the FROM's.
    cols = [c for c in scope.cols if c.name and ((c.qualifier or "").lower() == table if table else not c.hidden)]
    if not cols:
        raise SqlError(f"{e.sql(DIALECT)} names no table of the FROM clause", node=e)
    return cols


def _columns(e: exp.Expression) -> list[exp.Column]:
    """The columns ``e`` reads itself (not those its subqueries read)."""
    return [c for c in _outside_subqueries(e) if isinstance(c, exp.Column) and not isinstance(c.this, exp.Star)]


def _has_subquery(e: exp.Expression) -> bool:
    return any(isinstance(n, (exp.Subquery, exp.Exists)) for n in e.walk())


def _outside_subqueries(e: exp.Expression) -> Iterator[exp.Expression]:
    """The nodes of ``e`` but those inside its subqueries (their own scopes); when ``e``
    is an ``EXISTS``, its query is its subquery (``EXISTS`` holds a bare query)."""
    return e.walk(prune=lambda n: n is not e and isinstance(n, (exp.Subquery, exp.Exists, exp.Query)))


@contextmanager
def _correlation_refused(outer: _Scope | None, refusal: Callable[[str], str]) -> Iterator[None]:
    """Compiling a query without ``outer``'s columns: a column of ``outer`` it reads, found
    unknown, is refused as a correlation, with ``refusal(the column's SQL)``, rather than
    as an unknown column; any other error passes."""
    try:
        yield
    except SqlError as e:
        column = e.node if isinstance(e.node, exp.Column) else None
        if column is None or _found(column, outer) is None:
            raise
        raise SqlError(refusal(column.sql(DIALECT)), node=column) from e


def _atomic_keys(types: Mapping[str, T.DataType], what: str, fix: str, node: object = None) -> None:
    """Refuses a struct, array or map value as a key (of a group, a join, a distinct row):
    the durable store finds a key's rows by their values with pyarrow, which cannot hash or
    look up nested values."""
    for kind in types.values():
        if isinstance(kind, (T.StructType, T.ArrayType, T.MapType)):
            raise SqlError(f"not supported: a {kind.simpleString()} value as {what}; {fix}", node=node)
