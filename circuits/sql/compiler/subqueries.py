"""WHERE and its subqueries: ``[NOT] EXISTS`` and ``[NOT] IN`` as semi and anti joins or as
marks, scalar subqueries joined to the rows they correlate with, and ``NOT`` pushed down."""

from __future__ import annotations

from dataclasses import replace

from pyspark.sql import functions as F
from pyspark.sql import types as T
from sqlglot import exp

from ..aggregates import over_no_rows
from ..errors import SqlError, construct
from ..parse import AGGREGATES, DIALECT, one_row
from ..parse import conjuncts as _conjuncts
from .grouped import _canonical, _group_by, _is_aggregate, _is_call
from .joins import _factored, _split_equalities
from .scope import Col, Rel, _columns, _found, _has_subquery, _outside_subqueries, _Scope


class _Subqueries:
    """The WHERE and subquery part of :class:`~.core._Compiler`."""

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

        Spark fails when ``q`` gives more than one row, so only ``q`` of at most one row is
        taken: an aggregate, or a read of a one-row table (:meth:`one_row_value`).
        Uncorrelated and without ``GROUP BY``, an aggregate has exactly one row (a global
        aggregate), joined to every row on a constant key; grouped by columns its WHERE
        equates with literals (:func:`_pinned_group`), at most one group, left-joined on a
        constant key (NULL without it).  Correlated by equalities
        ``outer = inner`` only (and grouped by nothing or by the inner sides), it is the
        aggregate grouped by the inner sides, left-joined on them; a row without a group
        gets the aggregate over no rows (``count`` 0, the others NULL), as in Spark, or NULL
        when ``q`` has a GROUP BY.  Correlated by anything else, it is
        :meth:`decorrelated`.  A WHERE's disjunctions are factored first (an equality in
        every branch is a correlation equality, as in joins)."""
        query = subquery.this
        outer = correlate or _Scope([])
        if _one_row_read(subquery):
            return self.joined_value(rel, self.one_row_value(subquery, outer), [], "NULL")
        _check_scalar(subquery)
        with self.common_tables(query, outer):
            inner = self.from_(query, outer)
            inner_scope = _Scope(inner.cols, outer)
            where = query.args.get("where")
            conjuncts = _factored(_conjuncts(where.this if where else None))
            local = [c for c in conjuncts if inner_scope.is_local(c)]
            pairs, rest = _split_equalities([c for c in conjuncts if c not in local], outer, inner_scope)
            if local:
                inner = self.where(inner, inner_scope, exp.and_(*local))
            if rest:
                return self.decorrelated(rel, subquery, inner, pairs, rest, correlate)
            keys = [i for _, i in pairs] or _pinned_group(query, local)
            item = _scalar_item(subquery, keys)
            values = self.scalar_values(subquery, inner, inner_scope, keys, item)
        on = [(self.resolve(o, outer), c.internal) for (o, _), c in zip(pairs, values.cols)]
        empty = None if not keys else "NULL" if _group_by(query) else _over_no_rows(item)
        return self.joined_value(rel, values, on, empty)

    def scalar_values(
        self, subquery: exp.Subquery, rel: Rel, scope: _Scope, keys: list[exp.Expression], item: exp.Expression
    ) -> Rel:
        """The scalar subquery's aggregate ``item`` over ``rel`` grouped by ``keys``: the
        keys, the value and a TRUE marker (NULL beside a row that meets no group)."""
        shaped = subquery.this.copy()
        shaped.set("where", None)
        shaped.set("group", exp.Group(expressions=[k.copy() for k in keys]) if keys else None)
        shaped.set("expressions", [*[k.copy() for k in keys], item.copy(), exp.true()])
        grouped, _, items = self.aggregate(shaped, rel, scope)
        return self.project(grouped, items)

    def joined_value(self, rel: Rel, values: Rel, on: list[tuple[str, str]], empty: str | None) -> tuple[Rel, str]:
        """``rel`` joined with a scalar subquery's ``values`` (its value and marker last) on
        the key pairs ``on``, and the value: ``empty`` where no row of ``values`` meets the
        row (a left join), or an inner join where one always does (``empty`` None)."""
        joined = self.keyed_join(rel, values, on, None, "inner" if empty is None else "left")
        # Nameless: the values are no column of the FROM (``*`` leaves them out).
        hidden = [Col(None, "", c.internal) for c in values.cols]
        value, marker = values.cols[-2].internal, values.cols[-1].internal
        if empty is not None:
            value = f"CASE WHEN {marker} IS NULL THEN {empty} ELSE {value} END"
        return Rel(joined.stream, [*rel.cols, *hidden], joined.types), value

    def decorrelated(
        self,
        rel: Rel,
        subquery: exp.Subquery,
        inner: Rel,
        pairs: list[tuple[exp.Expression, exp.Expression]],
        rest: list[exp.Expression],
        correlate: _Scope | None,
    ) -> tuple[Rel, str]:
        """A scalar aggregate correlated by conjuncts ``rest`` that are no equalities
        ``outer = inner`` (``b.x > a.v``), beside equalities ``pairs``.

        Its value is a function of the outer columns it reads, so it is computed once per
        distinct tuple of them (the *domain*, Spark's rewrite of such a subquery): the
        ``distinct`` of ``rel``'s correlated columns, joined with the subquery's rows on
        ``pairs`` and ``rest`` (an inner join; keyed by ``pairs``, else by a constant),
        aggregated grouped by the domain's columns (the incremental aggregate), and
        left-joined to ``rel`` on those columns, NULL-safely (each side's :func:`_canonical`
        text, equal where the values are equal or both NULL).  A tuple without a row in the
        subquery gets the aggregate over no rows, as in Spark.  Every operator is one the
        engine maintains; a change of ``rel`` touches the domain only where a tuple appears
        or disappears, and a change of the subquery's rows re-aggregates the tuples it meets."""
        query = subquery.this
        if correlate is None or _group_by(query):
            where = " in HAVING or beside aggregates" if correlate is None else " with GROUP BY"
            raise SqlError(
                f"a scalar subquery correlated by {construct(rest[0])}{where} is not supported: "
                f"{construct(subquery)}; correlate it by equalities outer = inner only, or aggregate "
                "in a subquery in FROM and join with it there",
                node=rest[0],
            )
        inner_scope = _Scope(inner.cols, correlate)
        reads = [c for e in [*(o for o, _ in pairs), *rest] for c in _columns(e) if inner_scope.find(c) is None]
        found = {id(c): _found(c, correlate) for c in reads}
        keys = list({found[id(c)]: c for c in reversed(reads)}.values())[::-1]
        domain_cols = [found[id(c)] for c in keys]
        if any(c not in rel.cols for c in domain_cols):
            raise SqlError(
                f"a scalar subquery reads a column of a query further out: {construct(subquery)}; "
                "correlate it with the query it is in",
                node=subquery,
            )
        stream = rel.stream.select(*[c.internal for c in domain_cols]).distinct()
        domain = Rel(stream, domain_cols, {c.internal: rel.types[c.internal] for c in domain_cols})
        scope = _Scope(inner.cols, _Scope(domain_cols, correlate.outer))
        on = [(self.resolve(o, scope), self.resolve(i, scope)) for o, i in pairs]
        joined = self.keyed_join(domain, inner, on, self.resolve(exp.and_(*rest), scope), "inner")
        item = _scalar_item(subquery, keys)
        values = self.scalar_values(subquery, joined, scope, keys, item)
        texts = [
            _canonical(subquery, [(c.internal, r.types[c.internal]) for c in cols])
            for r, cols in ((rel, domain_cols), (values, values.cols[: len(keys)]))
        ]
        return self.joined_value(rel, values, [tuple(texts)], _over_no_rows(item))

    def one_row_value(self, subquery: exp.Subquery, outer: _Scope) -> Rel:
        """A scalar subquery that reads one column (Spark's analysis refuses more) of a table of at most one row (a CTE or
        derived table that is a global aggregate: ``(SELECT * FROM totals)``), compiled on
        its own: its column and a TRUE marker, at most one row, left-joined to every row on
        a constant key (NULL where it has no row)."""
        values = self.alone(
            subquery.this,
            outer,
            "a scalar subquery of a one-row table",
            "(a correlation)",
            "read its column uncorrelated, or aggregate: (SELECT max(x) FROM t WHERE t.k = outer.k)",
        )
        return self.project(values, [("", values.cols[0].internal), ("", "true")])

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


def _pinned_group(query: exp.Select, local: list[exp.Expression]) -> list[exp.Expression]:
    """The uncorrelated ``query``'s GROUP BY if each of its expressions is equated with a
    literal by a conjunct of ``local`` (``WHERE k = 4 ... GROUP BY k``, TPC-DS q44): then it
    has at most one group, a scalar subquery Spark allows; else none."""
    pinned = {
        side.sql(DIALECT)
        for c in local
        if isinstance(c, exp.EQ)
        for side, other in ((c.this, c.expression), (c.expression, c.this))
        if isinstance(other, exp.Literal)
    }
    group = _group_by(query)
    return group if group and all(g.sql(DIALECT) in pinned for g in group) else []


def _one_row_read(subquery: exp.Subquery) -> bool:
    """``subquery`` reads a table of at most one row (:func:`one_row`), without joins,
    grouping or aggregates: a CTE of an enclosing query, or a derived table."""
    query = subquery.this
    if not isinstance(query, exp.Select) or query.args.get("joins") or _is_aggregate(query):
        return False
    source = query.args["from_"].this if query.args.get("from_") else None
    if isinstance(source, exp.Subquery):
        return one_row(source.this)
    if not isinstance(source, exp.Table) or source.db:
        return False
    node = subquery
    while node is not None:
        with_ = node.args.get("with_")
        for cte in with_.expressions if with_ else []:
            if cte.alias_or_name.lower() == source.name.lower():
                return one_row(cte.this)
        node = node.parent
    return False


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
    query, text = subquery.this, construct(subquery)
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
    query, text = subquery.this, construct(subquery)
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


def _and(a: str | None, b: str) -> str:
    return b if a is None else f"({a}) AND ({b})"
