"""SQL views compiled into one circuit.

Each query becomes a DAG of the engine's incremental operators; every scalar expression
stays Spark SQL text (evaluated by Spark, with Spark's semantics), its column names
rewritten to the compiler's own.  Every relation's columns get fresh names (``c0``,
``c1``, ...), so that self-joins, joins of same-named columns and correlated subqueries
never clash; a scope maps what the SQL calls a column (qualifier and name) to them.
Spark analyses each view's text over empty tables of the inputs' schemas: a name or type
error is reported before anything runs, and the view's output takes Spark's column names
and types.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

from pyspark.errors import AnalysisException
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from sqlglot import exp

from .. import operators as ops
from ..circuit import Circuit, Source, Stream
from ..zset import parse_schema
from .aggregates import RECOMPUTED, deterministic, over_no_rows
from .analyses import Analyses
from .decimals import exact_average
from .errors import SqlError
from .parse import (
    AGGREGATES,
    DIALECT,
    RANKING_FUNCTIONS,
    View,
    is_top_k,
    one_row,
    parse_views,
    rank_bound,
    read_tables,
    window_call,
)
from .parse import conjuncts as _conjuncts
from .windows import windowed

_JOIN_SIDES = {"": "inner", "LEFT": "left", "RIGHT": "right", "FULL": "full"}


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


def compile_sql(
    text: str,
    schemas: Mapping[str, T.StructType | str],
    spark: SparkSession,
    *,
    name: str = "sql",
    file: str = "<sql>",
    analyses: Analyses | None = None,
) -> Circuit:
    """The circuit of a file of views (see :mod:`circuits.sql.parse`): one input per table
    the views read (``schemas``: table name -> schema), one output per materialized view.
    Raises :class:`SqlError` naming the file, line and view of anything that does not load.
    Spark's analysis leaves the tables it read (empty, with their schemas) as temporary
    views of the ``spark`` session: compile in the session that runs the steps, not one
    whose temporary views of those names hold data.  ``analyses``: Spark's answers kept
    from an earlier compile (see :mod:`circuits.sql.analyses`), saved with the new ones."""
    views = parse_views(text, file)
    schemas = {k.lower(): parse_schema(v) for k, v in schemas.items()}
    compiler = _Compiler(Circuit(name), schemas, spark, analyses or Analyses())
    for view in views:
        compiler.view(view)
    compiler.analyses.save()
    compiler.circuit.declaring = None
    if not compiler.circuit.outputs:
        raise _no_output(file)
    return compiler.circuit


def compile_errors(
    text: str, schemas: Mapping[str, T.StructType | str], spark: SparkSession, file: str
) -> list[SqlError]:
    """The error of every view of ``text`` that does not compile (:func:`compile_sql` raises
    the first), each naming the file, line and view; a view that reads one of them is not
    compiled (its error would be that one's).  Spark analyses each view afresh."""
    views = parse_views(text, file)
    compiler = _Compiler(Circuit("check"), {k.lower(): parse_schema(v) for k, v in schemas.items()}, spark, Analyses())
    errors, failed = [], set()
    for view in views:
        if read_tables(view.query) & failed:
            failed.add(view.name.lower())
            continue
        try:
            compiler.view(view)
        except SqlError as e:
            errors.append(e)
            failed.add(view.name.lower())
    if not any(v.materialized for v in views):
        errors.append(_no_output(file))
    return errors


def _no_output(file: str) -> SqlError:
    return SqlError(f"{file}: no CREATE MATERIALIZED VIEW; a views file needs at least one")


class _Compiler:
    def __init__(
        self, circuit: Circuit, schemas: dict[str, T.StructType], spark: SparkSession, analyses: Analyses
    ) -> None:
        self.circuit = circuit
        self.schemas = schemas
        self.spark = spark
        self.analyses = analyses
        self.inputs: dict[str, Stream] = {}
        self.views: dict[str, Rel] = {}
        self.ctes: list[dict[str, Rel]] = []
        self.count = 0
        self._registered: set[str] = set()
        self.current: View | None = None
        """The view being compiled: its expressions are remembered as its (see :meth:`remember`)."""

    def fresh(self) -> str:
        self.count += 1
        return f"c{self.count}"

    # views
    def view(self, view: View) -> None:
        self.circuit.declaring = f"{view.file}:{view.line} (view {view.name})"
        self.current = view
        try:
            output = self._analyse(view)
            rel = self.query(_negations_pushed(view.query), None)
        except SqlError as e:
            raise view.error(str(e), _line(e.node) or e.line) from e
        if len(rel.cols) != len(output.fields):
            raise view.error(f"the view has {len(rel.cols)} columns where Spark sees {len(output.fields)}")
        types = {f.name: _output_type(f.dataType, rel.types[c.internal]) for c, f in zip(rel.cols, output.fields)}
        stream = rel.stream.select(
            *[F.col(c.internal).cast(types[f.name]).alias(f.name) for c, f in zip(rel.cols, output.fields)]
        )
        self.views[view.name.lower()] = Rel(stream, [Col(None, f.name, f.name) for f in output.fields], types)
        if view.materialized:
            self.circuit.output(view.name, stream)

    def _analyse(self, view: View) -> T.StructType:
        """Spark's schema of the view, over empty tables of the inputs' and earlier views'
        schemas: unknown names and type errors surface here."""
        tables = {t: self._table_schema(t) for t in sorted(read_tables(view.query))}
        tables = {t: s for t, s in tables.items() if s is not None}
        question = ("view", view.text, {t: s.jsonValue() for t, s in tables.items()})
        schema = self.analyses.answer(question, lambda: self._ask_view(view, tables))
        names = [f.name.lower() for f in schema.fields]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise SqlError(f"the view has several columns named {duplicates}; give them distinct aliases")
        return schema

    def _table_schema(self, table: str) -> T.StructType | None:
        """The schema of an input or an earlier view (None: a name the query defines)."""
        view = self.views.get(table)
        return view.schema() if view is not None else self.schemas.get(table)

    def _ask_view(self, view: View, tables: dict[str, T.StructType]) -> T.StructType:
        """Spark's analysis of ``view`` over empty temporary views of ``tables``."""
        for table, schema in tables.items():
            if table not in self._registered:
                self.spark.createDataFrame([], schema).createOrReplaceTempView(table)
                self._registered.add(table)
        try:
            return self.spark.sql(view.text).schema
        except AnalysisException as e:
            reason = str(e).strip().splitlines()[0]
            at = re.search(r"; line (\d+) pos \d+", reason)  # in the view's text
            line = view.line_in_file(int(at.group(1))) if at else None
            raise SqlError(f"Spark cannot analyse the query: {reason}", line=line) from e

    # queries
    def query(self, node: exp.Expression, outer: _Scope | None) -> Rel:
        if isinstance(node, exp.Subquery):
            return self.query(node.this, outer)
        limit, sorts = node.args.get("limit"), _hidden_sorts(node)
        with self.common_tables(node, outer):
            if isinstance(node, exp.Select):
                rel = self.select(_with_items(node, sorts), outer)
            elif isinstance(node, (exp.Union, exp.Except, exp.Intersect)):
                rel = self.set_operation(node, outer)
            else:
                raise SqlError(f"not supported: {type(node).__name__} ({node.sql(DIALECT)[:60]})")
        return rel if limit is None or one_row(node) else self.limited(node, rel, sorts)

    # top-k
    def limited(self, node: exp.Query, rel: Rel, hidden: list[exp.Expression]) -> Rel:
        """A query's ``ORDER BY o LIMIT k`` (the parser allows it on a view's own query
        only): a global top-k of its rows, ties taken in the order of all their columns.
        An item of ``o`` that is a position or reads only the select list's names is
        computed over the select list's columns; the ``hidden`` others (of
        :func:`_hidden_sorts`) were added to the select list as its last columns, dropped
        after."""
        shown = rel.cols[: len(rel.cols) - len(hidden)]
        scope, added = _Scope([Col(None, c.name, c.internal) for c in shown]), iter(rel.cols[len(shown) :])
        order = []
        for item in node.args["order"].expressions:
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
            raise SqlError(
                f"a subquery in a window's PARTITION BY or ORDER BY: {window.sql(DIALECT)[:80]}", node=window
            )
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

    @contextmanager
    def common_tables(self, node: exp.Expression, outer: _Scope | None) -> Iterator[None]:
        """The CTEs of ``node``'s ``WITH``, readable by name while compiling ``node``."""
        with_ = node.args.get("with_")
        self.ctes.append({})
        try:
            for cte in with_.expressions if with_ else []:
                self.ctes[-1][cte.alias_or_name.lower()] = (
                    self.query(cte.this, outer).named(None).renamed(cte.alias_column_names)
                )
            yield
        finally:
            self.ctes.pop()

    def set_operation(self, node: exp.SetOperation, outer: _Scope | None) -> Rel:
        left = self.query(node.this, outer)
        right = self.query(node.expression, outer)
        if len(left.cols) != len(right.cols):
            raise SqlError(f"{node.key.upper()} of {len(left.cols)} and {len(right.cols)} columns")
        common = self.types_of(
            T.StructType([*left.schema().fields, *right.schema().fields]),
            {lc.internal: f"coalesce({lc.internal}, {rc.internal})" for lc, rc in zip(left.cols, right.cols)},
        )
        left_stream = left.stream.select(*[F.col(c).cast(t).alias(c) for c, t in common.items()])
        right_stream = right.stream.select(
            *[F.col(rc.internal).cast(common[lc.internal]).alias(lc.internal) for lc, rc in zip(left.cols, right.cols)]
        )
        distinct = node.args.get("distinct") is not False
        if distinct or not isinstance(node, exp.Union):
            _atomic_keys(common, f"a column of {node.key.upper()}", "select its fields instead", node)
        if isinstance(node, exp.Union):
            stream = left_stream.union(right_stream)
            stream = stream.distinct() if distinct else stream
        else:
            kind = f"{node.key}{'' if distinct else '_all'}"
            stream = left_stream.set_operation(right_stream, kind)
        return Rel(stream, [Col(None, c.name, c.internal) for c in left.cols], common)

    def select(self, node: exp.Select, outer: _Scope | None) -> Rel:
        if node.args.get("from_") is None:
            raise SqlError("SELECT without FROM is not supported; read a table")
        # Over groups, a predicate's rows would be the groups': not marked (see with_marks).
        for e in [*(node.expressions if _is_aggregate(node) else []), node.args.get("having")]:
            for predicate in _predicate_subqueries(e) if e is not None else []:
                raise SqlError(
                    f"{_kind_of(predicate)} subquery in HAVING or beside aggregates is not supported: "
                    f"{predicate.sql(DIALECT)[:80]}; test it in WHERE, or aggregate in a subquery in FROM "
                    "and test it in the query that reads it",
                    node=predicate,
                )
        rel = self.from_(node, outer)
        scope = _Scope(rel.cols, outer, {e.alias.lower(): e.this for e in node.expressions if isinstance(e, exp.Alias)})
        where = node.args.get("where")
        if where is not None:
            rel = self.where(rel, scope, where.this)
        qualify = node.args.get("qualify")
        over = [*node.expressions, *([qualify.this] if qualify else [])]
        windows = [w for e in over for w in _outside_subqueries(e) if isinstance(w, exp.Window)]
        for window in filter(is_top_k, windows):
            rel, scope = self.ranked(rel, scope, window)
        rel, scope = windowed(self, rel, scope, [w for w in windows if not is_top_k(w)])
        if qualify is not None:
            rel = self.where(rel, scope, qualify.this)
        if _is_aggregate(node):
            rel, scope, items = self.aggregate(node, rel, scope)
        else:
            if node.args.get("having") is not None:
                raise SqlError("HAVING without GROUP BY or aggregates")
            rel, scope = self.with_marks(rel, scope, node.expressions)
            rel, scope = self.with_scalars(rel, scope, node.expressions, scope)
            items = self.items(node, scope)
        rel = self.project(rel, items)
        if not node.args.get("distinct"):
            return rel
        _atomic_keys(
            {c.internal: rel.types[c.internal] for c in rel.cols},
            "a column of SELECT DISTINCT",
            "select its fields instead",
            node,
        )
        return Rel(rel.stream.distinct(), rel.cols, rel.types)

    def items(self, node: exp.Select, scope: _Scope) -> list[tuple[str, str]]:
        """The select list as (name, Spark SQL over internal names), stars expanded."""
        items = []
        for e in node.expressions:
            cols = _star_columns(e, scope)
            if cols is not None:
                items += [(c.name, c.internal) for c in cols]
            else:
                items.append((e.alias_or_name, self.resolve(e.unalias(), scope)))
        return items

    def project(self, rel: Rel, items: list[tuple[str, str]]) -> Rel:
        cols = [Col(None, name, self.fresh()) for name, _ in items]
        stream = rel.stream.select(*[F.expr(text).alias(c.internal) for (_, text), c in zip(items, cols)])
        return Rel(stream, cols, self.types_of(rel.schema(), {c.internal: text for (_, text), c in zip(items, cols)}))

    def types_of(
        self, schema: T.StructType, exprs: dict[str, str], *, aggregates: bool = False
    ) -> dict[str, T.DataType]:
        """The Spark types of the named expressions over columns of ``schema`` (one
        analysis by Spark, of an empty relation; ``aggregates``: they aggregate it)."""

        def ask() -> T.StructType:
            empty, columns = self.spark.createDataFrame([], schema), [F.expr(e).alias(n) for n, e in exprs.items()]
            return (empty.agg(*columns) if aggregates else empty.select(*columns)).schema

        try:
            question = "aggregate types" if aggregates else "types"
            analysed = self.analyses.answer((question, schema.jsonValue(), exprs), ask)
            return {f.name: f.dataType for f in analysed.fields}
        except AnalysisException as e:
            raise SqlError(f"Spark cannot analyse {list(exprs.values())}: {str(e).strip().splitlines()[0]}") from e

    # FROM and joins
    def from_(self, node: exp.Select, outer: _Scope | None) -> Rel:
        where = node.args.get("where")
        # ``FROM a, b WHERE a.k = b.k`` keys the join by the WHERE's equalities: as a join
        # with no key it would be a cross product read whole on every change.  The WHERE
        # is still applied whole after the joins, so taking them here changes no result.
        implied = [c for c in _factored(_conjuncts(where.this if where else None)) if not _has_subquery(c)]
        rel = self.source(node.args["from_"].this, outer)
        for join in node.args.get("joins") or []:
            rel = self.join(rel, self.source(join.this, outer), join, implied)
        return rel

    def source(self, node: exp.Expression, outer: _Scope | None) -> Rel:
        if isinstance(node, exp.Table):
            base = self.table(node.name.lower())
            qualifier = node.alias_or_name
        elif isinstance(node, exp.Subquery):
            base = self.derived(node.this, outer)
            qualifier = node.alias or None
        else:
            raise SqlError(f"not supported in FROM: {node.sql(DIALECT)[:60]}", node=node)
        base = base.renamed(node.alias_column_names)
        cols = [Col(qualifier, c.name, self.fresh()) for c in base.cols]
        stream = base.stream.select(*[F.col(b.internal).alias(c.internal) for b, c in zip(base.cols, cols)])
        return Rel(stream, cols, {c.internal: base.types[b.internal] for b, c in zip(base.cols, cols)})

    def derived(self, query: exp.Expression, outer: _Scope | None) -> Rel:
        """A subquery in FROM.  It reads its own tables only: one that reads a column of an
        enclosing query is a lateral join, whose correlation no operator here keeps."""
        return self.alone(
            query,
            outer,
            "a subquery in FROM",
            "(a lateral join)",
            "correlate the enclosing subquery itself, in its WHERE",
        )

    def alone(self, query: exp.Expression, outer: _Scope | None, construct: str, kind: str, fix: str) -> Rel:
        """``query`` compiled without the columns of the queries enclosing it (``outer``): a
        column of theirs that it reads is refused as a correlation of ``construct``, not as
        an unknown column."""
        with _correlation_refused(
            outer, lambda c: f"{construct} reads {c} of an enclosing query {kind}: not supported; {fix}"
        ):
            return self.query(query, None)

    def table(self, name: str) -> Rel:
        for ctes in reversed(self.ctes):
            if name in ctes:
                return ctes[name]
        if name in self.views:
            return self.views[name]
        if name not in self.schemas:
            known = sorted([*self.schemas, *self.views])
            raise SqlError(f"unknown table {name!r}; the inputs and views are {known}")
        if name not in self.inputs:
            self.inputs[name] = self.circuit.input(name, self.schemas[name])
        schema = self.schemas[name]
        return Rel(
            self.inputs[name], [Col(None, f.name, f.name) for f in schema.fields], {f.name: f.dataType for f in schema}
        )

    def join(self, left: Rel, right: Rel, node: exp.Join, implied: list[exp.Expression]) -> Rel:
        """``left`` joined with ``right`` as ``node`` says; an inner join without ``ON`` is
        keyed by the equalities between the two sides among ``implied`` (the WHERE's conjuncts)."""
        if node.method and node.method.upper() != "NATURAL":
            raise SqlError(f"not supported: {node.method} join; write the condition with ON", node=node)
        kind, side = (node.kind or "").upper(), (node.side or "").upper()
        condition = node.args.get("on")
        if kind in ("SEMI", "ANTI"):
            how = f"left_{kind.lower()}"
        elif kind in ("", "INNER", "CROSS", "OUTER"):
            how = _JOIN_SIDES[side]
        else:
            raise SqlError(f"not supported: {kind} JOIN", node=node)
        using = [u.name for u in node.args.get("using") or []]
        if node.method or using:
            return self.using_join(left, right, using if using else _common_names(left, right), how)
        both = _Scope([*left.cols, *right.cols])
        pairs, rest = _split_equalities(_factored(_conjuncts(condition)), _Scope(left.cols), _Scope(right.cols))
        if condition is None and how == "inner":
            pairs = _split_equalities(implied, _Scope(left.cols), _Scope(right.cols))[0]
        pairs = [(self.resolve(a, both), self.resolve(b, both)) for a, b in pairs]
        residual = self.resolve(exp.and_(*rest), both) if rest else None
        return self.keyed_join(left, right, pairs, residual, how)

    def using_join(self, left: Rel, right: Rel, names: list[str], how: str) -> Rel:
        """``left JOIN right USING (names)`` (``NATURAL``: the names both sides have), as
        Spark resolves it: joined on the equality of each side's column of each name, its
        columns are one per name first (the left side's; the right's for a right join; for
        a full join, the one that is not NULL), then each side's others.  Each side's own
        column stays readable by its qualified name (``t.k``), NULL where it had no match."""
        keys = [(_using_column(left, n, "left"), _using_column(right, n, "right")) for n in names]
        joined = self.keyed_join(left, right, [(lc.internal, rc.internal) for lc, rc in keys], None, how)
        merged = {
            "right": [(rc.name, rc.internal) for _, rc in keys],
            "full": [(lc.name, f"coalesce({lc.internal}, {rc.internal})") for lc, rc in keys],
        }.get(how, [(lc.name, lc.internal) for lc, _ in keys])
        shared = {c.internal for pair in keys for c in pair}
        kept = [replace(c, hidden=True) if c.internal in shared else c for c in joined.cols]
        cols = [Col(None, name, self.fresh()) for name, _ in merged]
        exprs = {c.internal: text for c, (_, text) in zip(cols, merged)}
        stream = joined.stream.select(*[F.expr(t).alias(c) for c, t in exprs.items()], *[c.internal for c in kept])
        types = {**joined.types, **self.types_of(joined.schema(), exprs)}
        return Rel(stream, [*cols, *kept], types)

    def keyed_join(self, left: Rel, right: Rel, pairs: list[tuple[str, str]], residual: str | None, how: str) -> Rel:
        """``left ⋈ right`` on ``left_key = right_key`` for each pair (Spark SQL texts) and
        ``residual``; a join with no equality is keyed by a constant (one key: the whole
        relations are read on every change)."""
        pairs = pairs or [("0", "0")]
        keys = [self.fresh() for _ in pairs]
        # Equal keys must hash alike (to one vnode): both sides' keys take their common type.
        both = T.StructType([*left.schema().fields, *right.schema().fields])
        common = self.types_of(both, {k: f"coalesce({a}, {b})" for (a, b), k in zip(pairs, keys)})
        _atomic_keys(common, "a join key", "join on its fields instead")
        left_stream = left.stream.select(
            *[c.internal for c in left.cols], *[F.expr(a).cast(common[k]).alias(k) for (a, _), k in zip(pairs, keys)]
        )
        right_stream = right.stream.select(
            *[c.internal for c in right.cols], *[F.expr(b).cast(common[k]).alias(k) for (_, b), k in zip(pairs, keys)]
        )
        cols = left.cols if how in ("left_semi", "left_anti") else [*left.cols, *right.cols]
        if how == "inner":
            joined = left_stream.join(right_stream, keys)
            joined = joined.filter(F.expr(residual)) if residual else joined
        else:
            joined = left_stream.keyed_join(right_stream, keys, how, residual)
        return Rel(joined.select(*[c.internal for c in cols]), cols, {**left.types, **right.types})

    # WHERE and subqueries
    def where(self, rel: Rel, scope: _Scope, condition: exp.Expression) -> Rel:
        plain, subqueries, checked = [], [], []
        for c in _conjuncts(condition):
            inner = c.this if isinstance(c, exp.Not) else c
            if isinstance(inner, exp.Exists) or (isinstance(inner, exp.In) and inner.args.get("query")):
                subqueries.append((inner, isinstance(c, exp.Not)))
                continue
            (checked if _scalar_subqueries(c) or _predicate_subqueries(c) else plain).append(c)
        if plain:
            rel = Rel(rel.stream.filter(F.expr(self.resolve(exp.and_(*plain), scope))), rel.cols, rel.types)
        for predicate, negated in subqueries:
            rel = self.semi_join(rel, scope, predicate, negated)
        if checked:
            marked, with_marks = self.with_marks(rel, scope, checked)
            joined, with_values = self.with_scalars(marked, with_marks, checked, with_marks)
            kept = joined.stream.filter(F.expr(self.resolve(exp.and_(*checked), with_values)))
            rel = Rel(kept.select(*[c.internal for c in rel.cols]), rel.cols, rel.types)
        return rel

    def with_marks(self, rel: Rel, scope: _Scope, expressions: list[exp.Expression]) -> tuple[Rel, _Scope]:
        """``rel`` with the truth of each ``EXISTS (q)``, ``x IN (q)`` and ``NOT (x IN (q))``
        of ``expressions`` beside each row (one under ``OR``, ``NOT`` or ``CASE``, or in a
        select list), and ``scope`` resolving each to it.  As Spark rewrites them (an
        existence join each), a mark is TRUE or FALSE, never NULL: TRUE on the rows of the
        semi join with ``q`` (of the null-aware anti join for ``NOT IN``), FALSE on the rest,
        so ``x IN (q)`` is FALSE where SQL's three values would say unknown."""
        marks = dict(scope.scalars)
        for e in expressions:
            for predicate in _predicate_subqueries(e):
                negation = _negation(predicate) if isinstance(predicate, exp.In) else None
                marked = negation or predicate
                if marked.sql(DIALECT) in marks:
                    continue
                holds = self.semi_join(rel, replace(scope, cols=rel.cols), predicate, negation is not None)
                mark, cols = self.fresh(), [c.internal for c in rel.cols]
                parts = [(holds.stream, "true"), (rel.stream.minus(holds.stream), "false")]
                streams = [stream.select(*cols, F.expr(truth).alias(mark)) for stream, truth in parts]
                types = {**rel.types, mark: T.BooleanType()}
                rel = Rel(streams[0].union(streams[1]), [*rel.cols, Col(None, "", mark)], types)
                marks[marked.sql(DIALECT)] = mark
        return rel, replace(scope, cols=rel.cols, scalars=marks)

    def with_scalars(
        self, rel: Rel, scope: _Scope, expressions: list[exp.Expression], correlate: _Scope | None
    ) -> tuple[Rel, _Scope]:
        """``rel`` with the value of each scalar subquery of ``expressions`` beside each row,
        and ``scope`` resolving those subqueries to their values.  They may read the columns
        of ``correlate`` (None: no outer column)."""
        scalars = dict(scope.scalars)
        for e in expressions:
            for subquery in _scalar_subqueries(e):
                if subquery.sql(DIALECT) not in scalars:
                    rel, scalars[subquery.sql(DIALECT)] = self.scalar(rel, subquery, correlate)
        return rel, replace(scope, cols=rel.cols, scalars=scalars)

    def scalar(self, rel: Rel, subquery: exp.Subquery, correlate: _Scope | None) -> tuple[Rel, str]:
        """A scalar subquery ``(q)`` joined to ``rel``, and its value (Spark SQL).

        Spark fails when ``q`` gives more than one row, so only an aggregate is taken.
        Uncorrelated and without ``GROUP BY``, it has exactly one row (a global aggregate),
        joined to every row on a constant key.  Correlated by equalities ``outer = inner``
        (and grouped by nothing or by the inner sides), it is the aggregate grouped by the
        inner sides, left-joined on them; a row without a group gets the aggregate over no
        rows (``count`` 0, the others NULL), as in Spark, or NULL when ``q`` has a GROUP BY."""
        query = subquery.this
        _check_scalar(subquery)
        outer = correlate or _Scope([])
        with self.common_tables(query, outer):
            inner = self.from_(query, outer)
            inner_scope = _Scope(inner.cols, outer)
            where = query.args.get("where")
            conjuncts = _conjuncts(where.this if where else None)
            local = [c for c in conjuncts if inner_scope.is_local(c)]
            pairs, rest = _split_equalities([c for c in conjuncts if c not in local], outer, inner_scope)
            if rest:
                raise SqlError(
                    f"a scalar subquery correlated by {rest[0].sql(DIALECT)[:60]} is not supported"
                    f"{' in HAVING or beside aggregates' if correlate is None else ''}: {subquery.sql(DIALECT)[:80]}; "
                    "correlate it by equalities outer = inner only, in WHERE or a select list without aggregates",
                    node=rest[0],
                )
            if local:
                inner = self.where(inner, inner_scope, exp.and_(*local))
            keys = [i for _, i in pairs]
            item = _scalar_item(subquery, keys)
            shaped = query.copy()
            shaped.set("where", None)
            shaped.set("group", exp.Group(expressions=[k.copy() for k in keys]) if keys else None)
            shaped.set("expressions", [*[k.copy() for k in keys], item.copy(), exp.true()])
            grouped, _, items = self.aggregate(shaped, inner, inner_scope)
            values = self.project(grouped, items)
        on = [(self.resolve(o, outer), c.internal) for (o, _), c in zip(pairs, values.cols)]
        joined = self.keyed_join(rel, values, on, None, "left" if pairs else "inner")
        # Nameless: the values are no column of the FROM (``*`` leaves them out).
        hidden = [Col(None, "", c.internal) for c in values.cols]
        value, marker = values.cols[-2].internal, values.cols[-1].internal
        if pairs:
            empty = "NULL" if _group_by(query) else _over_no_rows(item)
            value = f"CASE WHEN {marker} IS NULL THEN {empty} ELSE {value} END"
        return Rel(joined.stream, [*rel.cols, *hidden], joined.types), value

    def semi_join(self, rel: Rel, scope: _Scope, predicate: exp.Expression, negated: bool) -> Rel:
        """``[NOT] EXISTS (q)`` and ``x [NOT] IN (q)`` as a semi (anti) join of ``rel`` with
        ``q``, keyed by the equalities that correlate ``q`` with ``rel``.  ``NOT IN`` is
        null-aware, as in SQL: a row is kept only if no ``q`` value equals it or is unknown."""
        query = predicate.this if isinstance(predicate, exp.Exists) else predicate.args["query"].this
        inner, pairs, residual = self.correlated(query, scope, _kind_of(predicate))
        if isinstance(predicate, exp.In):
            single = len(query.expressions) == 1 if isinstance(query, exp.Select) else len(inner.cols) == 1
            if isinstance(predicate.this, exp.Tuple) or not single:
                raise SqlError("IN (subquery) of several columns is not supported", node=predicate)
            value = (self.resolve(predicate.this, scope), inner.cols[-1].internal)
            if negated:
                residual = _and(residual, f"coalesce(({value[0]}) = ({value[1]}), true)")
            else:
                pairs = [*pairs, value]
        return self.keyed_join(rel, inner, pairs, residual, "left_anti" if negated else "left_semi")

    def correlated(
        self, query: exp.Expression, outer: _Scope, kind: str
    ) -> tuple[Rel, list[tuple[str, str]], str | None]:
        """A ``kind`` (EXISTS, IN) subquery's relation (its select list last, for IN), and
        the key pairs (outer, inner) and residual condition of its WHERE conjuncts that
        read ``outer``.  Only a plain ``SELECT ... FROM ... WHERE`` may read ``outer``."""
        shape = _shape(query)
        if shape:
            fix = (
                "correlate a subquery without GROUP BY, aggregates, DISTINCT, WITH or set operations "
                "(EXISTS asks only whether a row exists), or compare with a scalar subquery: x = (SELECT max(y) ...)"
            )
            return self.alone(query, outer, f"{kind} subquery with {shape}", "(a correlation)", fix), [], None
        rel = self.from_(query, outer)
        scope = _Scope(rel.cols, outer)
        local, correlated = [], []
        for c in _conjuncts(query.args["where"].this if query.args.get("where") else None):
            (local if scope.is_local(c) else correlated).append(c)
        if local:
            rel = self.where(rel, scope, exp.and_(*local))
        pairs, rest = _split_equalities(correlated, outer, _Scope(rel.cols))
        both = _Scope([*outer.cols, *rel.cols], outer.outer)
        pairs = [(self.resolve(o, both), self.resolve(i, both)) for o, i in pairs]
        residual = self.resolve(exp.and_(*rest), both) if rest else None
        name, text = self.items(query, scope)[-1]
        value = Col(None, name, self.fresh())
        stream = rel.stream.select(*[c.internal for c in rel.cols], F.expr(text).alias(value.internal))
        types = {**rel.types, **self.types_of(rel.schema(), {value.internal: text})}
        return Rel(stream, [*rel.cols, value], types), pairs, residual

    # aggregates
    def aggregate(self, node: exp.Select, rel: Rel, scope: _Scope) -> tuple[Rel, _Scope, list[tuple[str, str]]]:
        """``GROUP BY`` (or a global aggregate): the group keys and each aggregate's argument
        projected, grouped, and the select list and HAVING rewritten over the result."""
        keys = [self.resolve(self._group_expression(g, node, scope), scope) for g in _group_by(node)]
        calls: dict[str, tuple[str, exp.Expression]] = {}
        for e in [*node.expressions, node.args.get("having")]:
            for call in _aggregate_calls(e) if e else []:
                if _has_subquery(call):
                    raise SqlError(
                        f"a subquery inside an aggregate is not supported: {call.sql(DIALECT)[:80]}", node=call
                    )
                calls.setdefault(self.resolve(call, scope), (self.fresh(), call))
        key_cols = [self.fresh() for _ in keys]
        grouped, values = self.grouped(rel, scope, dict(zip(key_cols, keys)), calls)
        having = node.args.get("having")
        # Scalar subqueries of HAVING and the select list join the groups: uncorrelated only.
        refusal = (
            "a scalar subquery in HAVING or beside aggregates reads {} of the enclosing query: not supported; "
            "correlate it in WHERE or in a select list without aggregates"
        )
        with _correlation_refused(scope, refusal.format):
            grouped, with_values = self.with_scalars(
                grouped, _Scope(grouped.cols), [e for e in [having, *node.expressions] if e is not None], None
            )
        scope = replace(scope, scalars=with_values.scalars)
        replacements = {**dict(zip(keys, key_cols)), **values}

        def over_groups(e: exp.Expression) -> str:
            resolved = exp.maybe_parse(self.resolve(e, scope), dialect=DIALECT)
            return resolved.transform(
                lambda n: (
                    exp.paren(exp.maybe_parse(replacements[n.sql(DIALECT)], dialect=DIALECT))
                    if n.sql(DIALECT) in replacements
                    else n
                )
            ).sql(DIALECT)

        def rewrite(e: exp.Expression) -> str:
            self.remember(e, over_groups)
            return over_groups(e)

        having = node.args.get("having")
        if having is not None:
            grouped = Rel(grouped.stream.filter(F.expr(rewrite(having.this))), grouped.cols, grouped.types)
        items = []
        for e in node.expressions:
            if isinstance(e, exp.Star) or (isinstance(e, exp.Column) and isinstance(e.this, exp.Star)):
                raise SqlError("SELECT * with GROUP BY; list the columns", node=e)
            items.append((e.alias_or_name, rewrite(e.unalias())))
        return grouped, _Scope(grouped.cols), items

    def grouped(
        self, rel: Rel, scope: _Scope, keys: dict[str, str], calls: dict[str, tuple[str, exp.Expression]]
    ) -> tuple[Rel, dict[str, str]]:
        """``rel`` grouped by ``keys`` (column -> Spark SQL; none: one global group, also
        over no rows) with the aggregate ``calls`` (Spark SQL -> column, call), and each
        call's value over the groups' columns (Spark SQL)."""
        schema = rel.schema()
        recomputed = {text: self.recomputed_call(call, scope) for text, (_, call) in calls.items() if _recomputed(call)}
        engine = {
            text: self.aggregate_argument(call, scope, schema)
            for text, (_, call) in calls.items()
            if text not in recomputed
        }
        arguments: dict[str, str] = {}
        for argument in [a for _, a in engine.values()] + [t for _, texts in recomputed.values() for t in texts]:
            if argument is not None:
                arguments.setdefault(argument, self.fresh())
        projected = {**(keys or {self.fresh(): "0"}), **{c: text for text, c in arguments.items()}}
        types = self.types_of(schema, projected)
        _atomic_keys({k: types[k] for k in keys}, "a GROUP BY key", "group by its fields instead")
        aggs: dict[str, ops.Agg] = {}
        values = {}
        for text, (out, call) in calls.items():
            if text in recomputed:
                template, texts = recomputed[text]
                reads = tuple(dict.fromkeys(arguments[t] for t in texts))
                aggs[out] = ops.Agg("recomputed", call=_placed(template, [arguments[t] for t in texts]), reads=reads)
                values[text] = _or_over_no_rows(out, call)
                continue
            kind, argument = engine[text]
            column = None if argument is None else arguments[argument]
            values[text] = self.aggregate_value(out, ops.Agg(kind, column), types, aggs)
        if not aggs:  # GROUP BY without aggregates: a count keeps each group while it has rows
            aggs[self.fresh()] = ops.Agg("count", None)
        types.update(self.recomputed_types(aggs, projected, types))
        types.update({out: _aggregate_type(a, types) for out, a in aggs.items() if a.kind != "recomputed"})
        stream = rel.stream.select(*[F.expr(text).alias(c) for c, text in projected.items()])
        stream = stream.group_by(*list(projected)[: len(keys) or 1]).agg(**aggs)
        if not keys:
            zeros = tuple(out for out, a in aggs.items() if a.kind in ("count", "count_distinct"))
            stream = stream.select(*aggs).default_row(*zeros)
        cols = [Col(None, c, c) for c in [*keys, *aggs]]
        return Rel(stream, cols, types), values

    def aggregate_argument(self, call: exp.Expression, scope: _Scope, schema: T.StructType) -> tuple[str, str | None]:
        """The engine's aggregate for a SQL aggregate call, and its argument as Spark SQL
        over ``scope`` (None for ``count(*)``; ``schema``: the columns' types).  ``count`` of
        several values (``count(a, b)``, ``t.*`` expanded) counts, as Spark does, the rows
        where none is NULL; ``count(DISTINCT ...)`` of several values or of a struct counts
        their :func:`_canonical` text.
        ``agg(x) FILTER (WHERE p)`` skips the rows where ``p`` is not true: it is
        ``agg(CASE WHEN p THEN x END)``, as every aggregate here ignores NULLs (``count(*)``'s
        value is 1), so over no passing row it gives what ``agg`` gives over none."""
        if isinstance(call, exp.Filter):
            kind, argument = self.aggregate_argument(call.this, scope, schema)
            passing = self.resolve(call.expression.this, scope)
            return kind, f"CASE WHEN {passing} THEN {argument or 1} END"
        kind, values = _aggregate_kind(call)
        if values is None:
            return kind, None
        texts = [text for v in values for text in self.expanded(v, scope)]
        if kind == "count_distinct":
            return kind, self.distinct_value(call, texts, schema)
        if len(texts) == 1 and kind in _SUMS:
            return kind, self.numeric(call, texts[0], schema)
        if len(texts) == 1:
            return kind, texts[0]
        return kind, f"CASE WHEN {_all_present(texts)} THEN 1 END"

    def recomputed_types(
        self, aggs: dict[str, ops.Agg], projected: dict[str, str], types: dict[str, T.DataType]
    ) -> dict[str, T.DataType]:
        """The types of the recomputed aggregates of ``aggs`` over the ``projected`` columns
        (of ``types``), each nested one made :func:`_nullable` in its call (``aggs`` updated):
        the store reads every nested value back so, and Spark casts no nullable value to a
        non-nullable type."""
        calls = {out: a.call for out, a in aggs.items() if a.kind == "recomputed"}
        if not calls:
            return {}
        schema = T.StructType([T.StructField(c, types[c]) for c in projected])
        found = self.types_of(schema, calls, aggregates=True)
        for out, kind in found.items():
            if _nullable(kind) != kind:
                found[out] = _nullable(kind)
                aggs[out] = replace(aggs[out], call=f"CAST({calls[out]} AS {found[out].simpleString()})")
        return found

    def recomputed_call(self, call: exp.Expression, scope: _Scope) -> tuple[exp.Expression, list[str]]:
        """A recomputed aggregate ``call`` (its ``FILTER`` too, which Spark evaluates itself)
        made :func:`~circuits.sql.aggregates.deterministic`, over placeholders (see
        :func:`_placed`) for its arguments that read columns; and those arguments, as Spark
        SQL over ``scope``, in the placeholders' order."""
        call = call.copy()
        texts: list[str] = []

        def placeholder(e: exp.Expression) -> exp.Expression:
            texts.append(self.resolve(e, scope))
            return exp.column(f"{_PLACEHOLDER}{len(texts) - 1}")

        inner = call.this if isinstance(call, exp.Filter) else call
        for key, value in list(inner.args.items()):
            if isinstance(value, exp.Expression) and _columns(value):
                inner.set(key, placeholder(value))
        if isinstance(call, exp.Filter):
            call.expression.set("this", placeholder(call.expression.this))
        return deterministic(call), texts

    def numeric(self, call: exp.Expression, text: str, schema: T.StructType) -> str:
        """A ``sum`` or ``avg`` argument as the aggregate reads it: a string cast to a double,
        as Spark casts it (in the projection before the aggregate, so that a value that does
        not cast fails on its own row, see :mod:`circuits.records`), remembered as ``call``."""
        if not isinstance(self.types_of(schema, {"_0": text})["_0"], T.StringType):
            return text
        cast = f"CAST({text} AS DOUBLE)"
        self.remember_as(call, cast)
        return cast

    def distinct_value(self, call: exp.Expression, texts: list[str], schema: T.StructType) -> str:
        """What ``count(DISTINCT ...)`` of ``texts`` (Spark SQL over ``schema``) counts the
        distinct non-NULL values of.  One atomic value is itself.  Several values (``count(
        DISTINCT a, b)``: the rows where none is NULL) and a struct (``count(DISTINCT (a, b))``:
        the rows where it is not NULL, its fields may be) are their :func:`_canonical` text:
        a struct as the state's key is one the Delta store cannot index by (pyarrow has no
        ``unique`` of structs)."""
        types = list(self.types_of(schema, {f"_{i}": t for i, t in enumerate(texts)}).values())
        if len(texts) > 1:
            return f"CASE WHEN {_all_present(texts)} THEN {_canonical(call, list(zip(texts, types)))} END"
        (text,), (kind,) = texts, types
        if isinstance(kind, (T.ArrayType, T.MapType)):
            raise _no_canonical(call, kind)
        if not isinstance(kind, T.StructType):
            return text
        fields = [(f"({text}).`{f.name.replace('`', '``')}`", f.dataType) for f in kind.fields]
        return f"CASE WHEN ({text}) IS NOT NULL THEN {_canonical(call, fields)} END"

    def expanded(self, e: exp.Expression, scope: _Scope) -> list[str]:
        """``e`` as Spark SQL over ``scope``: a star as the columns it stands for."""
        cols = _star_columns(e, scope)
        return [self.resolve(e, scope)] if cols is None else [c.internal for c in cols]

    def aggregate_value(self, out: str, a: ops.Agg, types: dict[str, T.DataType], aggs: dict[str, ops.Agg]) -> str:
        """Adds the engine's aggregates for SQL's ``a`` to ``aggs`` (``out``: the column of
        the first) and returns its value over them.  Over a decimal ``decimal(p, s)``, as in
        Spark: ``sum`` is a ``decimal(p + 10, s)``, and ``avg`` is that sum divided by the
        count of values, rounded once to ``decimal(p + 4, s + 4)`` (see :mod:`.decimals`)."""
        argument = types.get(a.column) if a.column else None
        if a.kind not in _SUMS or not isinstance(argument, T.DecimalType):
            aggs[out] = a
            return out
        total_kind, count_kind = _SUMS[a.kind]
        aggs[out] = ops.Agg(total_kind, a.column)
        p, s = argument.precision, argument.scale
        total = f"CAST({out} AS DECIMAL({min(38, p + 10)}, {s}))"
        if a.kind == total_kind:
            return total
        count = self.fresh()
        aggs[count] = ops.Agg(count_kind, a.column)
        return exact_average(total, count, s, min(38, p + 4), min(38, s + 4))

    def _group_expression(self, g: exp.Expression, node: exp.Select, scope: _Scope) -> exp.Expression:
        """A GROUP BY item: an ordinal or a select-list alias stands for its expression."""
        if isinstance(g, exp.Literal) and not g.is_string:
            position = int(g.name)
            if not 1 <= position <= len(node.expressions):
                raise SqlError(f"GROUP BY {position}: the select list has {len(node.expressions)} items", node=g)
            return node.expressions[position - 1].unalias()
        return g

    # expressions
    def remember(self, e: exp.Expression, text: Callable[[exp.Expression], str]) -> None:
        """Records, for each call and operator of ``e`` (outside its subqueries), where the
        view wrote it, by ``text(it)``: its Spark SQL as evaluated (see
        :attr:`circuits.circuit.Circuit.sources`)."""
        for n in _outside_subqueries(e):
            if isinstance(n, (exp.Func, exp.Binary, exp.Unary)) and not isinstance(n, (exp.Paren, exp.Alias)):
                self.remember_as(n, text(n))

    def remember_as(self, e: exp.Expression, text: str) -> None:
        """Records that the Spark SQL ``text`` evaluates ``e``, as the view wrote it."""
        view = self.current
        if view is not None:
            self.circuit.sources.setdefault(
                text, Source(view.name, view.file, _line(e) or view.line, _written(view.text, e))
            )

    def resolve(self, e: exp.Expression, scope: _Scope) -> str:
        """``e`` as Spark SQL over internal column names."""
        text = self._resolved(e, scope)
        self.remember(e, lambda n: self._resolved(n, scope))
        return text

    def _resolved(self, e: exp.Expression, scope: _Scope) -> str:

        def rename(n: exp.Expression) -> exp.Expression:
            if (
                isinstance(n, (exp.Subquery, exp.Window, exp.Exists, exp.In, exp.Not))
                and n.sql(DIALECT) in scope.scalars
            ):
                return exp.paren(exp.maybe_parse(scope.scalars[n.sql(DIALECT)], dialect=DIALECT), copy=False)
            if not isinstance(n, exp.Column) or isinstance(n.this, exp.Star):
                return n
            found = _found(n, scope)
            if found is not None:
                return exp.column(found.internal)
            alias = scope.aliases.get(n.name.lower()) if not n.table else None
            if alias is not None:
                return exp.maybe_parse(self.resolve(alias, scope), dialect=DIALECT)
            raise SqlError(f"unknown column {n.sql(DIALECT)}", node=n)

        return e.copy().transform(rename).sql(DIALECT)


def _written(text: str, node: exp.Expression) -> str:
    """``node`` as written in ``text`` (its Spark SQL, found there ignoring case and
    spaces), else as sqlglot writes it."""
    target = "".join(node.sql(DIALECT).split()).lower()
    at = [i for i, c in enumerate(text) if not c.isspace()]
    found = "".join(text[i] for i in at).lower().find(target) if target else -1
    if found < 0:
        return node.sql(DIALECT)
    return text[at[found] : at[found + len(target) - 1] + 1]


def _line(node: object) -> int | None:
    """The line of ``node``'s first name in the file (the view's text is parsed at its
    place in the file), or None."""
    if not isinstance(node, exp.Expression):
        return None
    lines = [i.meta["line"] for i in node.walk() if isinstance(i, exp.Identifier) and "line" in i.meta]
    return min(lines, default=None)


def _using_column(rel: Rel, name: str, side: str) -> Col:
    """The one column of ``rel`` that the unqualified ``name`` of a ``USING`` join names."""
    found = [c for c in rel.cols if c.name.lower() == name.lower() and not c.hidden]
    if len(found) != 1:
        raise SqlError(f"USING ({name}): the {side} side has {len(found)} columns of that name; it needs one")
    return found[0]


def _common_names(left: Rel, right: Rel) -> list[str]:
    """The column names a ``NATURAL`` join joins on: those of both sides, in the left's order."""
    names = {c.name.lower() for c in right.cols if c.name and not c.hidden}
    return [c.name for c in left.cols if c.name and not c.hidden and c.name.lower() in names]


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


def _predicate_subqueries(e: exp.Expression) -> list[exp.Expression]:
    """The ``EXISTS (q)`` and ``x IN (q)`` of ``e`` (outside its subqueries)."""
    return [
        n
        for n in _outside_subqueries(e)
        if isinstance(n, exp.Exists) or (isinstance(n, exp.In) and n.args.get("query"))
    ]


def _negations_pushed(query: exp.Expression) -> exp.Expression:
    """``query`` with each ``NOT`` above an ``IN``/``EXISTS`` subquery pushed down to it
    (De Morgan's laws, which hold in SQL's three values), as Spark's optimizer does before
    it rewrites the subqueries: where the ``NOT`` lands decides whether ``x IN (q)`` is
    taken as the existence of an equal value or ``NOT (x IN (q))`` as the null-aware
    absence of one (:meth:`_Compiler.with_marks`)."""

    def push(n: exp.Expression) -> exp.Expression:
        if not isinstance(n, exp.Not) or not _predicate_subqueries(n):
            return n
        inner = n.this.unnest()
        if isinstance(inner, exp.Not):
            return _negations_pushed(inner.this.unnest())
        if isinstance(inner, (exp.And, exp.Or)):
            join = exp.or_ if isinstance(inner, exp.And) else exp.and_
            return _negations_pushed(exp.paren(join(exp.not_(inner.this), exp.not_(inner.expression))))
        return exp.not_(inner) if inner is not n.this else n

    return query.transform(push)  # a replaced node's children are not visited: hence the recursion


def _negation(predicate: exp.Expression) -> exp.Not | None:
    """The ``NOT`` applied to ``predicate`` (through parentheses), if any."""
    node = predicate.parent
    while isinstance(node, exp.Paren):
        node = node.parent
    return node if isinstance(node, exp.Not) else None


def _scalar_subqueries(e: exp.Expression) -> list[exp.Subquery]:
    """The scalar subqueries ``(SELECT ...)`` of ``e`` (outside its subqueries)."""
    return [
        n
        for n in _outside_subqueries(e)
        if isinstance(n, exp.Subquery) and not (isinstance(n.parent, exp.In) and n.arg_key == "query")
    ]


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


def _shape(query: exp.Expression) -> str | None:
    """What of a predicate subquery makes it compile on its own, without the columns of
    its enclosing query (None: it is a plain ``SELECT ... FROM ... WHERE``)."""
    if isinstance(query, exp.Subquery):  # x IN ((SELECT ...))
        return _shape(query.this) or "parentheses"
    if not isinstance(query, exp.Select):
        return query.key.upper()  # UNION, EXCEPT, INTERSECT
    labels = (("group", "GROUP BY"), ("distinct", "DISTINCT"), ("with_", "WITH"))
    names = [label for arg, label in labels if query.args.get(arg)]
    if not names and _is_aggregate(query):
        names = ["aggregates"]
    return " and ".join(names) or None


def _kind_of(predicate: exp.Expression) -> str:
    return "EXISTS" if isinstance(predicate, exp.Exists) else "IN"


def _check_scalar(subquery: exp.Subquery) -> None:
    """Refuses a scalar subquery that may give several rows, or whose shape is not compiled."""
    query, text = subquery.this, subquery.sql(DIALECT)[:80]
    if not isinstance(query, exp.Select) or not _is_aggregate(query) or query.args.get("distinct"):
        raise SqlError(
            f"a scalar subquery that is not an aggregate: {text}; Spark fails when it gives several rows, so "
            "write it as an aggregate (max, sum, ...) or join with it in FROM",
            node=subquery,
        )
    if query.args.get("having") or len(query.expressions) != 1 or _has_subquery(query.expressions[0]):
        raise SqlError(
            f"not supported: a scalar subquery with HAVING, several columns or a subquery in its select list: "
            f"{text}; join with it in FROM",
            node=subquery,
        )


def _scalar_item(subquery: exp.Subquery, keys: list[exp.Expression]) -> exp.Expression:
    """The scalar subquery's one value, checked: its columns outside aggregates are
    correlation keys, and it is grouped by nothing or by exactly those keys."""
    query, text = subquery.this, subquery.sql(DIALECT)[:80]
    key_texts = sorted(k.sql(DIALECT) for k in keys)
    group = _group_by(query)
    if group and sorted(g.sql(DIALECT) for g in group) != key_texts:
        raise SqlError(
            f"a scalar subquery grouped by other columns than it correlates on may give several rows: {text}; "
            "group it by the inner columns of its equalities outer = inner, or not at all",
            node=subquery,
        )
    item = query.expressions[0].unalias()
    for column in _columns(item.transform(lambda n: exp.null() if _is_call(n) else n)):
        if column.sql(DIALECT) not in key_texts:
            raise SqlError(
                f"a scalar subquery's value reads {column.sql(DIALECT)} outside an aggregate: {text}; "
                "aggregate it, or join with the subquery in FROM",
                node=column,
            )
    return item


def _over_no_rows(item: exp.Expression) -> str:
    """An aggregate expression's value over no rows (``count`` 0, other aggregates NULL)."""
    return item.transform(
        lambda n: (
            exp.Literal.number(0)
            if AGGREGATES.get(type(n.this if isinstance(n, exp.Filter) else n)) == "count"
            else over_no_rows(n)
            if _is_call(n)
            else n
        )
    ).sql(DIALECT)


def _split_equalities(
    conjuncts: list[exp.Expression], left: _Scope, right: _Scope
) -> tuple[list[tuple[exp.Expression, exp.Expression]], list[exp.Expression]]:
    """The conjuncts ``l = r`` with ``l`` over ``left``'s columns only and ``r`` over
    ``right``'s (either way round), as (l, r) pairs; and the others."""
    pairs, rest = [], []
    for c in conjuncts:
        if isinstance(c, exp.EQ) and _columns(c.this) and _columns(c.expression):
            a, b = c.this, c.expression
            if left.is_local(a) and right.is_local(b) and not right.is_local(a):
                pairs.append((a, b))
                continue
            if left.is_local(b) and right.is_local(a) and not right.is_local(b):
                pairs.append((b, a))
                continue
        rest.append(c)
    return pairs, rest


def _factored(conjuncts: list[exp.Expression]) -> list[exp.Expression]:
    """``conjuncts`` with each disjunction written as the conjuncts common to all its
    branches and the disjunction of what remains of each: ``(a AND b) OR (a AND c)`` is
    ``a AND (b OR c)`` (so also in SQL's three-valued logic) and ``(a AND b) OR a`` is
    ``a``.  An equality repeated in every branch so becomes a join key, as Spark's
    optimizer makes it, not a residual over a join keyed by a constant."""
    factored = []
    for c in conjuncts:
        branches = [_conjuncts(b) for b in _disjuncts(c)]
        texts = [{_canonical_text(x) for x in b} for b in branches]
        common = {_canonical_text(x): x for x in branches[0] if all(_canonical_text(x) in t for t in texts)}
        if len(branches) < 2 or not common:
            factored.append(c)
            continue
        factored.extend(common.values())
        rests = [[x for x in b if _canonical_text(x) not in common] for b in branches]
        if all(rests):
            factored.append(exp.or_(*[exp.and_(*r) for r in rests]))
    return factored


def _canonical_text(e: exp.Expression) -> str:
    """``e``'s SQL, the same for ``a = b`` and ``b = a``."""
    if isinstance(e, exp.EQ):
        return " = ".join(sorted(side.sql(DIALECT) for side in (e.this, e.expression)))
    return e.sql(DIALECT)


def _disjuncts(condition: exp.Expression) -> list[exp.Expression]:
    if isinstance(condition, exp.Or):
        return [*_disjuncts(condition.this), *_disjuncts(condition.expression)]
    if isinstance(condition, exp.Paren):
        return _disjuncts(condition.this)
    return [condition]


def _and(a: str | None, b: str) -> str:
    return b if a is None else f"({a}) AND ({b})"


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


def _is_aggregate(query: exp.Select) -> bool:
    """``query`` groups: it has a GROUP BY, or an aggregate in its select list or HAVING."""
    return query.args.get("group") is not None or any(
        isinstance(n, exp.AggFunc) and not window_call(n)
        for e in [*query.expressions, query.args.get("having")]
        if e is not None
        for n in _outside_subqueries(e)
    )


def _all_present(texts: list[str]) -> str:
    return " AND ".join(f"({t}) IS NOT NULL" for t in texts)


def _canonical(call: exp.Expression, values: list[tuple[str, T.DataType]]) -> str:
    """A text of ``values`` (Spark SQL, each with its type) equal for two rows exactly where
    Spark's grouping takes them for equal: each value as ``N`` if NULL, else ``V``, its
    length, ``:`` and its text; a float's ``-0.0`` as ``0`` (Spark groups it with ``0.0``, and
    every NaN as one), a timestamp as its microseconds (its local text repeats at a
    daylight saving change), binary in hex.  Refuses (naming ``call``) a value of a type
    without such a text: nested types, intervals, strings of another collation."""
    parts = []
    for text, kind in values:
        if isinstance(kind, (T.FloatType, T.DoubleType)):
            value = f"CASE WHEN ({text}) = 0 THEN '0' ELSE CAST(({text}) AS STRING) END"
        elif isinstance(kind, T.TimestampType):
            value = f"CAST(unix_micros({text}) AS STRING)"
        elif isinstance(kind, T.BinaryType):
            value = f"hex({text})"
        elif isinstance(kind, _TEXTUAL) and getattr(kind, "collation", "UTF8_BINARY") == "UTF8_BINARY":
            value = f"CAST(({text}) AS STRING)"
        else:
            raise _no_canonical(call, kind)
        parts.append(f"CASE WHEN ({text}) IS NULL THEN 'N' ELSE concat('V', length({value}), ':', {value}) END")
    return f"concat({', '.join(parts)})"


def _atomic_keys(types: Mapping[str, T.DataType], what: str, fix: str, node: object = None) -> None:
    """Refuses a struct, array or map value as a key (of a group, a join, a distinct row):
    the durable store finds a key's rows by their values with pyarrow, which cannot hash or
    look up nested values."""
    for kind in types.values():
        if isinstance(kind, (T.StructType, T.ArrayType, T.MapType)):
            raise SqlError(f"not supported: a {kind.simpleString()} value as {what}; {fix}", node=node)


def _no_canonical(call: exp.Expression, kind: T.DataType) -> SqlError:
    return SqlError(
        f"not supported: {call.sql(DIALECT)[:80]}, a distinct count over a {kind.simpleString()} value; "
        "count the distinct values of its atomic fields",
        node=call,
    )


_TEXTUAL = (
    T.NullType,
    T.ByteType,
    T.ShortType,
    T.IntegerType,
    T.LongType,
    T.DecimalType,
    T.BooleanType,
    T.StringType,
    T.DateType,
    T.TimestampNTZType,
)
"""Types whose values Spark's cast to a string keeps apart: equal texts, equal values
(a decimal's text has its type's scale)."""


def _is_call(node: exp.Expression) -> bool:
    """``node`` is an aggregate call: ``agg(...)``, or ``agg(...) FILTER (WHERE p)`` whole."""
    return isinstance(node, exp.AggFunc) or (isinstance(node, exp.Filter) and isinstance(node.this, exp.AggFunc))


def _aggregate_calls(e: exp.Expression) -> list[exp.Expression]:
    """The aggregate calls of ``e`` (outside its subqueries), a ``FILTER`` with its call."""
    return [
        n
        for n in _outside_subqueries(e)
        if _is_call(n) and not (isinstance(n.parent, exp.Filter) and n.arg_key == "this")
    ]


def _group_by(node: exp.Select) -> list[exp.Expression]:
    group = node.args.get("group")
    return list(group.expressions) if group is not None else []


def _aggregate_kind(call: exp.AggFunc) -> tuple[str, list[exp.Expression] | None]:
    """The engine's aggregate for a SQL aggregate call, and the values it reads (None for
    ``count(*)``; several for ``count(a, b)``)."""
    kind = AGGREGATES[type(call)]  # the parser refused the others
    argument = call.this
    if isinstance(call, exp.CountIf):
        return "count", [exp.Nullif(this=argument.copy(), expression=exp.false())]
    if isinstance(argument, exp.Distinct):
        distinct = {"count": "count_distinct", "sum": "sum_distinct", "avg": "avg_distinct"}
        if kind not in distinct or (kind != "count" and len(argument.expressions) != 1):
            raise SqlError(
                f"not supported: {call.sql(DIALECT)}; only count(DISTINCT ...), sum(DISTINCT x) and avg(DISTINCT x)",
                node=call,
            )
        return distinct[kind], list(argument.expressions)
    if isinstance(argument, exp.Star):
        return "count", None
    return kind, [argument, *(call.expressions if isinstance(call, exp.Count) else [])]


def _aggregate_type(a: ops.Agg, types: dict[str, T.DataType]) -> T.DataType:
    """The type of the engine's aggregate ``a`` over columns of ``types``."""
    if a.kind in ("count", "count_distinct"):
        return T.LongType()
    argument = types[a.column]
    total = a.kind in ("sum", "sum_distinct")
    if a.kind in ("avg", "avg_distinct", *ops.MOMENTS) or (total and isinstance(argument, (T.FloatType, T.DoubleType))):
        return T.DoubleType()
    if total and isinstance(argument, (T.ByteType, T.ShortType, T.IntegerType, T.LongType)):
        return T.LongType()
    return argument


_SUMS = {
    "sum": ("sum", "count"),
    "avg": ("sum", "count"),
    "sum_distinct": ("sum_distinct", "count_distinct"),
    "avg_distinct": ("sum_distinct", "count_distinct"),
}
"""The aggregates of a sum (``sum``, ``avg``, of all values or the distinct ones): each
one's sum and count, which make it over a decimal (see :meth:`_Compiler.aggregate_value`)."""
_PLACEHOLDER = "_dbsp_arg"


def _nullable(kind: T.DataType) -> T.DataType:
    """``kind`` with every nested element, value and field nullable."""
    if isinstance(kind, T.ArrayType):
        return T.ArrayType(_nullable(kind.elementType), True)
    if isinstance(kind, T.MapType):
        return T.MapType(_nullable(kind.keyType), _nullable(kind.valueType), True)
    if isinstance(kind, T.StructType):
        return T.StructType([T.StructField(f.name, _nullable(f.dataType), True) for f in kind.fields])
    return kind


def _output_type(spark: T.DataType, engine: T.DataType) -> T.DataType:
    """A view column's type: Spark's, nullable throughout where the engine's values are
    (a recomputed aggregate's: see :meth:`_Compiler.recomputed_types`), as Spark casts no
    nullable nested value to a non-nullable type."""
    return _nullable(spark) if _nullable(engine) == engine else spark


def _recomputed(call: exp.Expression) -> bool:
    """``call`` (an aggregate, or one with ``FILTER``) is Spark's own, recomputed per group."""
    return isinstance(call.this if isinstance(call, exp.Filter) else call, RECOMPUTED)


def _placed(template: exp.Expression, columns: list[str]) -> str:
    """``template`` (of :meth:`_Compiler.recomputed_call`) as Spark SQL over ``columns``:
    its placeholder ``i`` as ``columns[i]``."""

    def place(n: exp.Expression) -> exp.Expression:
        if isinstance(n, exp.Column) and n.name.startswith(_PLACEHOLDER):
            return exp.column(columns[int(n.name[len(_PLACEHOLDER) :])])
        return n

    return template.transform(place).sql(DIALECT)


def _or_over_no_rows(out: str, call: exp.Expression) -> str:
    """A recomputed aggregate's value: its column, or its value over no rows (a global
    aggregate's default row has NULL in every column but the counts)."""
    empty = over_no_rows(call)
    return out if isinstance(empty, exp.Null) else f"coalesce({out}, {empty.sql(DIALECT)})"
