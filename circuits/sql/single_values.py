"""Scalar subqueries that are no aggregate, rewritten as the aggregate Spark evaluates.

Spark's value of a scalar subquery ``(SELECT x FROM t WHERE ...)`` is the one row's ``x``,
NULL over no rows, and an error (``SCALAR_SUBQUERY_TOO_MANY_ROWS``) over more: Calcite's
``SINGLE_VALUE`` aggregate.  So such a subquery is rewritten, before it is compiled, as
that aggregate in SQL::

    (SELECT CASE WHEN count(*) > 1 THEN raise_error('...') ELSE max(x) END FROM t WHERE ...)

(for ``SELECT DISTINCT x``, the count is of the distinct values, a NULL counted as one),
which the engine maintains as any scalar aggregate, uncorrelated or correlated.  The
maximum of one row is that row's value.  A step whose change leaves the subquery more than
one row fails, naming it, where Spark's batch query over the same rows fails too.
"""

from __future__ import annotations

from sqlglot import exp

from .errors import construct


def single_values(query: exp.Expression) -> exp.Expression:
    """``query`` with each scalar subquery that is a plain ``SELECT [DISTINCT] x FROM ...``
    (no aggregate, grouping, order or limit) rewritten as its single value (see above)."""
    for subquery in list(query.find_all(exp.Subquery)):
        select = subquery.this
        if _scalar(subquery) and _plain(select) and not _reads_derived_table(select) and _reads_inner(select):
            _rewrite(subquery, select)
    return query


def _scalar(subquery: exp.Subquery) -> bool:
    """``subquery`` stands for a value: not a table in FROM or a join, not a set operation's
    side, not the query of ``IN`` or of a quantified comparison (``x = ANY (q)``)."""
    parent = subquery.parent
    tables = (exp.From, exp.Join, exp.Lateral, exp.SetOperation, exp.Subquery, exp.CTE)
    if isinstance(parent, (*tables, exp.Any, exp.All)):
        return False
    return not (isinstance(parent, exp.In) and subquery.arg_key == "query")


def _plain(select: exp.Expression) -> bool:
    if not isinstance(select, exp.Select) or len(select.expressions) != 1 or select.args.get("from_") is None:
        return False
    if any(select.args.get(part) for part in ("group", "having", "qualify", "order", "limit", "offset", "windows")):
        return False
    item = select.expressions[0]
    if isinstance(item.unalias(), exp.Star):
        return False
    prune = lambda n: n is not item and isinstance(n, (exp.Subquery, exp.Exists, exp.Query))
    return not any(isinstance(n, (exp.AggFunc, exp.Window)) for n in item.walk(prune=prune))


def _sources(select: exp.Select) -> set[str]:
    tables = [select.args["from_"].this, *(j.this for j in select.args.get("joins") or [])]
    return {t.alias_or_name.lower() for t in tables}


def _reads_inner(select: exp.Select) -> bool:
    """The value may read the subquery's own rows: not every column of it is qualified by
    a name of an enclosing query (``(SELECT a.v FROM b ...)`` is Spark's to judge as is).
    A value of no column (a literal) reads the rows only by their number."""
    columns = list(select.expressions[0].find_all(exp.Column))
    inner = _sources(select)
    return not columns or any(not c.table or c.table.lower() in inner for c in columns)


def _reads_derived_table(select: exp.Select) -> bool:
    """``select`` reads one derived table and nothing else, which the compiler reads as a
    table of at most one row where it is one (``(SELECT m FROM (SELECT max(x) AS m ...))``),
    and refuses as it is where it is not: left to it."""
    return not select.args.get("joins") and isinstance(select.args["from_"].this, exp.Subquery)


def _rewrite(subquery: exp.Subquery, select: exp.Select) -> None:
    message = (
        f"the scalar subquery {construct(subquery)} gave more than one row, which Spark refuses too "
        "(SCALAR_SUBQUERY_TOO_MANY_ROWS): make it give at most one, with an aggregate (max, sum, ...) or a filter "
        "on a unique key"
    )
    item = select.expressions[0]
    value = item.unalias()
    if select.args.get("distinct"):
        select.set("distinct", None)
        null = exp.If(
            this=exp.Is(this=value.copy(), expression=exp.null()),
            true=exp.Literal.number(1),
            false=exp.Literal.number(0),
        )
        rows = exp.Add(this=exp.Count(this=exp.Distinct(expressions=[value.copy()])), expression=exp.Max(this=null))
    else:
        rows = exp.Count(this=exp.Star())
    error = exp.Anonymous(this="raise_error", expressions=[exp.Literal.string(message)])
    single = exp.Case(ifs=[exp.If(this=exp.GT(this=rows, expression=exp.Literal.number(1)), true=error)])
    single.set("default", exp.Max(this=value.copy()))
    item.replace(exp.alias_(single, item.alias) if isinstance(item, exp.Alias) else single)
