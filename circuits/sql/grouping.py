"""``GROUP BY ROLLUP`` / ``CUBE`` / ``GROUPING SETS`` as the union of plain ``GROUP BY``s.

An aggregate over grouping sets is, by Spark's definition, one aggregate per grouping
set, their rows together (duplicate sets give their groups twice): in the rows of a set,
each grouping expression outside it is NULL, ``GROUPING(e)`` is 1 where ``e`` is outside
it (else 0) and ``GROUPING_ID(e1, ..., en)`` is those bits, ``e1``'s the most significant
(without arguments, of every grouping expression in order of first appearance).  The
aggregates themselves read the real values.  So the query is rewritten, before it is
compiled, into ``UNION ALL`` (``UNION`` for ``SELECT DISTINCT``) of one query per set, each
an aggregate maintained as any ``GROUP BY`` is; the view's ``WITH``, ``ORDER BY`` and
``LIMIT`` go on the union.

A grouping expression ``e`` outside a set becomes ``IF(false, e, NULL)`` outside aggregate
calls, and the set's ``GROUP BY`` groups by that too: a NULL of exactly ``e``'s type, and a
key, so that the set's aggregate has no row over no input rows, as Spark's has none.  The
one exception is Spark's: ``GROUPING SETS (())`` alone is a global aggregate, one row also
over no rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations, product

from sqlglot import exp

from .errors import SqlError

_GROUPING = (exp.Rollup, exp.Cube, exp.GroupingSets)


def expand_grouping_sets(query: exp.Expression) -> exp.Expression:
    """``query`` with each ``SELECT`` over grouping sets rewritten as the union of one plain
    aggregate per set (innermost first, so each one rewritten holds no other)."""
    while True:
        selects = {id(s): s for s in query.find_all(exp.Select) if _has_grouping_sets(s)}
        innermost = next(
            (s for s in selects.values() if not any(id(o) in selects for o in s.find_all(exp.Select) if o is not s)),
            None,
        )
        if innermost is None:
            return query
        union = _union(innermost)
        if innermost is query:
            return union
        innermost.replace(union)


def _has_grouping_sets(select: exp.Select) -> bool:
    group = select.args.get("group")
    if group is None:
        return False
    return any(group.args.get(arg) for arg in ("rollup", "cube", "grouping_sets")) or any(
        isinstance(e, _GROUPING) for e in group.expressions
    )


def _union(select: exp.Select) -> exp.Query:
    columns, sets = _grouping_sets(select)
    keys = [_key(c) for c in columns]
    branches = [_branch(select, columns, {keys[i] for i in s}, len(sets) > 1) for s in sets]
    union = branches[0]
    for branch in branches[1:]:
        union = exp.union(union, branch, distinct=bool(select.args.get("distinct")), copy=False)
    if len(branches) == 1:
        union.set("distinct", select.args.get("distinct"))
    for arg in ("with_", "order", "limit"):
        union.set(arg, select.args.get(arg))
    return union


def _grouping_sets(select: exp.Select) -> tuple[list[exp.Expression], list[list[int]]]:
    """The grouping expressions (each once, in order of first appearance: the bits of
    ``GROUPING_ID()``) and the grouping sets, each as the positions of its expressions."""
    group = select.args["group"]
    items = list(group.expressions)
    columns: dict[str, exp.Expression] = {}
    if group.args.get("rollup") or group.args.get("cube"):  # GROUP BY a, b WITH ROLLUP
        kind = exp.Rollup if group.args.get("rollup") else exp.Cube
        items = [kind(expressions=items)]
    alternatives = [_item_sets(item, select) for item in items]
    if group.args.get("grouping_sets"):  # GROUP BY a, b GROUPING SETS (...): a, b are the columns
        for item in items:
            if isinstance(item, _GROUPING):
                raise SqlError(
                    f"{item.sql('spark')} before GROUPING SETS (...) without a comma: "
                    "list the plain grouping expressions there, or separate the items with commas",
                    node=item,
                )
        for [[declared]] in alternatives:
            columns.setdefault(_key(declared), declared)
        alternatives = [[s for g in group.args["grouping_sets"] for s in _item_sets(g, select)]]
    sets = []
    for combination in product(*alternatives):
        chosen = [e for s in combination for e in s]
        for e in chosen:
            columns.setdefault(_key(e), e)
        sets.append(chosen)
    positions = {k: i for i, k in enumerate(columns)}
    return list(columns.values()), [sorted({positions[_key(e)] for e in s}) for s in sets]


def _item_sets(item: exp.Expression, select: exp.Select) -> list[list[exp.Expression]]:
    """The grouping sets one ``GROUP BY`` item stands for (a plain expression: itself)."""
    if isinstance(item, exp.Rollup):
        units = [_unit(e, select) for e in item.expressions]
        return [[e for u in units[:n] for e in u] for n in range(len(units), -1, -1)]
    if isinstance(item, exp.Cube):
        units = [_unit(e, select) for e in item.expressions]
        return [[e for u in chosen for e in u] for n in range(len(units), -1, -1) for chosen in combinations(units, n)]
    if isinstance(item, exp.GroupingSets):
        return [s for e in item.expressions for s in _set_sets(e, select)]
    return [[_grouping_expression(item, select)]]


def _set_sets(e: exp.Expression, select: exp.Select) -> list[list[exp.Expression]]:
    """The sets an item of ``GROUPING SETS (...)`` stands for: a ``ROLLUP``/``CUBE`` its
    own, a parenthesized list one set, an expression the set of it alone."""
    if isinstance(e, (exp.Rollup, exp.Cube)):
        return _item_sets(e, select)
    return [_unit(e, select)]


def _unit(e: exp.Expression, select: exp.Select) -> list[exp.Expression]:
    """An element of ``ROLLUP``/``CUBE``/``GROUPING SETS``: ``(a, b)`` stands for both."""
    if isinstance(e, exp.Tuple):
        return [_grouping_expression(x, select) for x in e.expressions]
    if isinstance(e, exp.Paren):
        return [_grouping_expression(e.this, select)]
    return [_grouping_expression(e, select)]


def _grouping_expression(e: exp.Expression, select: exp.Select) -> exp.Expression:
    """A grouping expression as the select list says it: an ordinal is the item it
    numbers, and the name of a select-list alias is the aliased expression, unless that
    reads a column of the name (``v + 1 AS v``: the column, as Spark takes it).  Spark takes
    a column of the FROM first: a name that both a column and another alias give is
    taken for the alias here (its item has to read grouped columns only, so Spark mostly
    refuses such a query)."""
    if isinstance(e, exp.Literal) and not e.is_string and e.name.isdigit():
        position = int(e.name)
        if not 1 <= position <= len(select.expressions):
            raise SqlError(f"GROUP BY {position}: the select list has {len(select.expressions)} items", node=e)
        return select.expressions[position - 1].unalias()
    if isinstance(e, exp.Column) and not e.table:
        for item in select.expressions:
            named = isinstance(item, exp.Alias) and item.alias.lower() == e.name.lower()
            if named and not any(c.name.lower() == e.name.lower() for c in item.this.find_all(exp.Column)):
                return item.this
    return e


def _key(e: exp.Expression) -> str:
    return e.sql("spark").lower()


def _unqualified(e: exp.Expression) -> str:
    return _key(e.transform(lambda n: exp.column(n.name) if isinstance(n, exp.Column) else n))


def _branch(select: exp.Select, columns: list[exp.Expression], kept: set[str], keyed: bool) -> exp.Select:
    """The plain aggregate of one grouping set (``kept``: its expressions' keys); ``keyed``:
    grouped by a constant if by nothing else (one of several sets of no expression)."""
    branch = select.copy()
    for arg in ("with_", "order", "limit", "distinct"):
        branch.set(arg, None)
    grouping_set = _Set(select, columns, kept)
    by = [c.copy() if _key(c) in kept else _nulled(c) for c in columns]
    if not by and keyed:
        by = [exp.cast(exp.null(), "TINYINT")]
    branch.set("group", exp.Group(expressions=by))
    items = []
    for item in branch.expressions:
        rewritten = grouping_set.rows(item)
        if rewritten.sql("spark") != item.sql("spark") and not isinstance(rewritten, exp.Alias) and item.alias_or_name:
            rewritten = exp.alias_(rewritten, item.alias_or_name, quoted=True)  # ORDER BY names it
        items.append(rewritten)
    branch.set("expressions", items)
    having = branch.args.get("having")
    if having is not None:
        having.set("this", grouping_set.rows(having.this))
    return branch


def _nulled(e: exp.Expression) -> exp.Expression:
    """NULL of ``e``'s type: Spark types ``IF(false, e, NULL)`` as ``e``."""
    return exp.If(this=exp.false(), true=e.copy(), false=exp.null())


@dataclass
class _Set:
    """One grouping set of ``select``: ``kept`` the keys of its expressions among ``columns``."""

    select: exp.Select
    columns: list[exp.Expression]
    kept: set[str]

    def match(self, e: exp.Expression) -> str | None:
        """The grouping expression (its key) that ``e`` is, if any: the same text, or the
        same without qualifiers when only one grouping expression has that (``a.k`` is the
        ``k`` of ``ROLLUP(k)``, as Spark resolves it).  A select-list alias is none: it
        stands for its item, which is rewritten itself."""
        if _key(e) in {_key(c) for c in self.columns}:
            return _key(e)
        found = [_key(c) for c in self.columns if _unqualified(c) == _unqualified(e)]
        return found[0] if len(found) == 1 else None

    def rows(self, e: exp.Expression) -> exp.Expression:
        """``e`` (a select item or ``HAVING``) in the set's rows: outside aggregate calls and
        subqueries, a grouping expression outside the set NULL, and ``GROUPING``/
        ``GROUPING_ID`` their values."""
        e = e.copy()

        def stop(n: exp.Expression) -> bool:
            return isinstance(n, (exp.AggFunc, exp.Filter, exp.Subquery)) or self.match(n) is not None

        targets = [n for n in e.walk(prune=stop) if _is_grouping(n) or self.match(n) is not None]
        for n in targets:
            if n is e:
                return self.value(n)
            n.replace(self.value(n))
        return e

    def value(self, n: exp.Expression) -> exp.Expression:
        if isinstance(n, exp.Grouping):
            return exp.cast(exp.Literal.number(self.outside(n.expressions[0], n)), "TINYINT")
        if isinstance(n, exp.GroupingId) or _is_hive_grouping_id(n):
            bits = [self.outside(a, n) for a in n.expressions or self.columns]
            return exp.cast(exp.Literal.number(sum(b << (len(bits) - 1 - i) for i, b in enumerate(bits))), "BIGINT")
        return n.copy() if self.match(n) in self.kept else _nulled(n)

    def outside(self, argument: exp.Expression, call: exp.Expression) -> int:
        """1 if ``argument`` (of ``call``, a ``GROUPING``/``GROUPING_ID``) is outside the set, else 0."""
        key = self.match(_grouping_expression(argument, self.select))
        if key is None:
            raise SqlError(
                f"{call.sql('spark')}: {argument.sql('spark')} is not a grouping expression; "
                "name one of the GROUP BY's expressions as written there",
                node=call,
            )
        return 0 if key in self.kept else 1


def _is_grouping(n: exp.Expression) -> bool:
    return isinstance(n, (exp.Grouping, exp.GroupingId)) or _is_hive_grouping_id(n)


def _is_hive_grouping_id(n: exp.Expression) -> bool:
    """Hive's ``GROUPING__ID``, Spark's name of ``GROUPING_ID()`` of every grouping expression."""
    return isinstance(n, exp.Column) and not n.table and n.name.lower() == "grouping__id"
