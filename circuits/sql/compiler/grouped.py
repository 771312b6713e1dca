"""``GROUP BY`` and aggregates: the engine's aggregate for each SQL call, its argument, its
type and its value over the groups (a decimal's sum and average, a distinct count's key,
Spark's own aggregates recomputed per group)."""

from __future__ import annotations

from dataclasses import replace

from pyspark.sql import functions as F
from pyspark.sql import types as T
from sqlglot import exp

from ... import operators as ops
from ..aggregates import RECOMPUTED, deterministic, over_no_rows
from ..decimals import exact_average
from ..errors import SqlError, construct
from ..parse import AGGREGATES, DIALECT, window_call
from .scope import (
    Col,
    Rel,
    _atomic_keys,
    _columns,
    _correlation_refused,
    _has_subquery,
    _outside_subqueries,
    _Scope,
    _star_columns,
)


class _Aggregates:
    """The aggregate part of :class:`~.core._Compiler`."""

    def aggregate(self, node: exp.Select, rel: Rel, scope: _Scope) -> tuple[Rel, _Scope, list[tuple[str, str]]]:
        """``GROUP BY`` (or a global aggregate): the group keys and each aggregate's argument
        projected, grouped, and the select list and HAVING rewritten over the result."""
        keys = [self.resolve(self._group_expression(g, node, scope), scope) for g in _group_by(node)]
        calls: dict[str, tuple[str, exp.Expression]] = {}
        for e in [*node.expressions, node.args.get("having")]:
            for call in _aggregate_calls(e) if e else []:
                if _has_subquery(call):
                    raise SqlError(f"a subquery inside an aggregate is not supported: {construct(call)}", node=call)
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


def _no_canonical(call: exp.Expression, kind: T.DataType) -> SqlError:
    return SqlError(
        f"not supported: {construct(call)}, a distinct count over a {kind.simpleString()} value; "
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
