"""The compiler: a view's query, its set operations and select lists, and the Spark SQL of
its expressions over internal names; FROM, WHERE, aggregates and top-k are its mixins'."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from pyspark.errors import AnalysisException
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from sqlglot import exp

from ...circuit import Circuit, Source, Stream
from ..analyses import Analyses
from ..errors import SqlError, construct
from ..parse import DIALECT, View, is_top_k, one_row, read_tables
from .grouped import _Aggregates, _is_aggregate, _nullable
from .joins import _Joins
from .ordering import _hidden_sorts, _Ordering, _with_items
from .scope import Col, Rel, _atomic_keys, _found, _outside_subqueries, _Scope, _star_columns
from .subqueries import _kind_of, _negations_pushed, _predicate_subqueries, _Subqueries
from .windowed import windowed


class _Compiler(_Joins, _Subqueries, _Aggregates, _Ordering):
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
        self.alone_queries: dict[tuple, tuple[Rel, tuple[Rel | None, ...]]] = {}
        """The view's uncorrelated subqueries compiled so far (see :meth:`alone`)."""

    def fresh(self) -> str:
        self.count += 1
        return f"c{self.count}"

    # views
    def view(self, view: View) -> None:
        self.circuit.declaring = f"{view.file}:{view.line} (view {view.name})"
        self.current, self.alone_queries = view, {}
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
                raise SqlError(f"not supported: {type(node).__name__} ({construct(node)})")
        return rel if limit is None or one_row(node) else self.limited(node, rel, sorts)

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
                    f"{construct(predicate)}; test it in WHERE, or aggregate in a subquery in FROM "
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


def _output_type(spark: T.DataType, engine: T.DataType) -> T.DataType:
    """A view column's type: Spark's, nullable throughout where the engine's values are
    (a recomputed aggregate's: see :meth:`_Compiler.recomputed_types`), as Spark casts no
    nullable nested value to a non-nullable type."""
    return _nullable(spark) if _nullable(engine) == engine else spark
