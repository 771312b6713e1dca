"""FROM: its tables and derived tables, and their joins (``ON``, ``USING``, ``NATURAL``),
keyed by the equalities between their sides."""

from __future__ import annotations

from dataclasses import replace

from pyspark.sql import functions as F
from pyspark.sql import types as T
from sqlglot import exp

from ..errors import SqlError, construct
from ..parse import DIALECT
from ..parse import conjuncts as _conjuncts
from .scope import Col, Rel, _atomic_keys, _columns, _correlation_refused, _has_subquery, _Scope

_JOIN_SIDES = {"": "inner", "LEFT": "left", "RIGHT": "right", "FULL": "full"}


class _Joins:
    """The FROM part of :class:`~.core._Compiler`."""

    def from_(self, node: exp.Select, outer: _Scope | None) -> Rel:
        where = node.args.get("where")
        # ``FROM a, b WHERE a.k = b.k`` keys the join by the WHERE's equalities: as a join
        # with no key it would be a cross product read whole on every change.  The WHERE
        # is still applied whole after the joins, so taking them here changes no result.
        implied = [c for c in _factored(_conjuncts(where.this if where else None)) if not _has_subquery(c)]
        joins = node.args.get("joins") or []
        sources = [self.source(s, outer) for s in [node.args["from_"].this, *(j.this for j in joins)]]
        rel, *others = [self.pushed(r, implied) if _kept_whole(joins, i) else r for i, r in enumerate(sources)]
        for join, right in zip(joins, others):
            rel = self.join(rel, right, join, implied)
        return rel

    def pushed(self, rel: Rel, conjuncts: list[exp.Expression]) -> Rel:
        """``rel`` filtered by the ``conjuncts`` that read its columns and no others, as
        Spark's optimizer pushes them below a join: the join's state then keeps only rows
        that may pass (a self-join of a table filtered each side to another year multiplies
        the rows of the year alone, not of every year)."""
        scope = _Scope(rel.cols)
        local = [c for c in conjuncts if _columns(c) and _reads_only(scope, c)]
        return self.where(rel, scope, exp.and_(*local)) if local else rel

    def source(self, node: exp.Expression, outer: _Scope | None) -> Rel:
        if isinstance(node, exp.Table):
            base = self.table(node.name.lower())
            qualifier = node.alias_or_name
        elif isinstance(node, exp.Subquery):
            base = self.derived(node.this, outer)
            qualifier = node.alias or None
        else:
            raise SqlError(f"not supported in FROM: {construct(node)}", node=node)
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
        an unknown column.  So a query of the same text over the same tables is the same
        relation: compiled once per view and shared (the branches of a ``ROLLUP`` each read
        the FROM of the query it was written in; compiled apart, TPC-DS q14a's five sets
        made 662 operators, 242 shared)."""
        read = {t.name.lower() for t in query.find_all(exp.Table)}
        # Which common table each name is (by identity; kept alive by the entry so that no
        # later one takes its id), or none: an input or view, the same all view long.
        ctes = tuple(next((ctes[n] for ctes in reversed(self.ctes) if n in ctes), None) for n in sorted(read))
        key = (query.sql(DIALECT), tuple(map(id, ctes)))
        if key not in self.alone_queries:
            with _correlation_refused(
                outer, lambda c: f"{construct} reads {c} of an enclosing query {kind}: not supported; {fix}"
            ):
                self.alone_queries[key] = (self.query(query, None), ctes)
        return self.alone_queries[key][0]

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


def _kept_whole(joins: list[exp.Join], i: int) -> bool:
    """Whether the FROM's ``i``-th source (0: the first) reaches the joins' result only
    through inner joins: the WHERE's tests of its rows alone may then be made before them
    (not below the side an outer join pads with NULLs, whose padded rows the WHERE tests)."""
    sides = [(j.side or "").upper() for j in joins]
    brought_by_inner = i == 0 or (sides[i - 1] == "" and (joins[i - 1].kind or "").upper() not in ("SEMI", "ANTI"))
    return brought_by_inner and not any(side in ("RIGHT", "FULL") for side in sides[i:])


def _reads_only(scope: _Scope, e: exp.Expression) -> bool:
    """Every column of ``e`` is one of ``scope``'s (False where one of its names is ambiguous
    there: the WHERE, applied whole, reports it)."""
    try:
        return scope.is_local(e)
    except SqlError:
        return False


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
