"""A file of Spark Declarative Pipelines views, parsed and checked without Spark.

The file holds ``CREATE MATERIALIZED VIEW name AS <query>;`` and ``CREATE TEMPORARY VIEW
name AS <query>;`` statements.  Everything the engine cannot maintain incrementally is
refused here, before any data is read, with the file, line, view and construct.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError
from sqlglot.tokens import TokenType

from .aggregates import RECOMPUTED
from .errors import SqlError, construct, located
from .grouped_windows import windows_over_groups
from .grouping import expand_grouping_sets
from .named_windows import inline_named_windows
from .single_values import single_values

DIALECT = "spark"
log = logging.getLogger(__name__)
_IGNORED_ORDER = "ORDER BY without LIMIT is ignored: a maintained view is a set of rows, with no order"

# Constructs whose result is not a function of the inputs' current contents, or that
# need an order: the reason each is refused.
_REFUSED_NODES: dict[type[exp.Expression], str] = {
    exp.Window: "window functions (OVER ...)",
    exp.Order: "ORDER BY (a maintained view is a set of rows, with no order)",
    exp.Limit: "LIMIT (without an order it is not a function of the rows)",
    exp.Offset: "OFFSET",
    exp.Fetch: "FETCH",
    exp.Lateral: "LATERAL VIEW / LATERAL",
    exp.Pivot: "PIVOT / UNPIVOT",
    exp.TableSample: "TABLESAMPLE",
    exp.Values: "VALUES",
    exp.Unnest: "UNNEST",
    exp.Explode: "explode() and other generators",
    exp.Rand: "rand() (non-deterministic)",
    exp.Randn: "randn() (non-deterministic)",
    exp.Uuid: "uuid() (non-deterministic)",
    exp.CurrentTimestamp: "current_timestamp() (non-deterministic)",
    exp.CurrentDate: "current_date() (non-deterministic)",
}
_NONDETERMINISTIC = {
    "rand",
    "randn",
    "random",
    "uuid",
    "shuffle",
    "now",
    "current_timestamp",
    "current_date",
    "localtimestamp",
    "monotonically_increasing_id",
    "spark_partition_id",
    "input_file_name",
    "input_file_block_start",
    "input_file_block_length",
    "unix_timestamp",
    "try_reflect",
    "reflect",
}
AGGREGATES = {
    exp.Count: "count",
    exp.Sum: "sum",
    exp.Avg: "avg",
    exp.Min: "min",
    exp.Max: "max",
    exp.LogicalAnd: "min",
    exp.LogicalOr: "max",
    exp.CountIf: "count",
    exp.Stddev: "stddev_samp",
    exp.StddevSamp: "stddev_samp",
    exp.StddevPop: "stddev_pop",
    exp.Variance: "var_samp",
    exp.VariancePop: "var_pop",
    **{kind: "recomputed" for kind in RECOMPUTED},
}
"""The SQL aggregates the engine maintains, by its ``Agg`` kind of each.  They are Spark's
own definitions: ``bool_and``/``every`` is ``min`` over booleans and ``bool_or``/``some``/
``any`` is ``max`` (false < true; NULLs ignored, NULL over no value), ``count_if(p)`` is
``count(NULLIF(p, false))``, ``stddev``/``std`` is ``stddev_samp`` and ``variance`` is
``var_samp``; the :data:`~circuits.sql.aggregates.RECOMPUTED` ones are Spark's own,
evaluated over a group's rows."""
_MAINTAINED = (
    "count, sum, avg, min, max, bool_and (every), bool_or (some, any), count_if, stddev_samp/stddev_pop (stddev, "
    "std), var_samp/var_pop (variance), max_by, min_by, collect_list, collect_set, percentile, percentile_approx "
    "and median"
)
_WHICHEVER_ROW = (exp.First, exp.Last, exp.AnyValue, exp.FirstValue, exp.LastValue)
"""Aggregates whose value is whichever row Spark meets first or last: not a function of the rows."""
_OTHER_NAMES = {"every": exp.LogicalAnd, "some": exp.LogicalOr, "any": exp.LogicalOr, "std": exp.Stddev}
"""Spark's other names of ``bool_and``, ``bool_or`` and ``stddev``, which sqlglot reads as plain
functions (``any(x)`` as ``x = ANY (subquery)``'s ``ANY``)."""
_UNPARSED_AGGREGATES = {
    "try_sum",
    "try_avg",
    "histogram_numeric",
    "count_min_sketch",
    "hll_sketch_agg",
    "hll_union_agg",
}
"""Spark aggregates that sqlglot reads as plain functions: taken for what they are, an
aggregate, so that the refusal names them (left as a projection, Spark fails on it)."""
_CREATE = re.compile(r"\s*CREATE\s+(MATERIALIZED|TEMPORARY)\s+VIEW\b", re.IGNORECASE)
_HEAD = re.compile(r"\s*CREATE\s+\w+\s+VIEW\s+[\w`]+\s+AS\s", re.IGNORECASE)


@dataclass(frozen=True)
class View:
    name: str
    query: exp.Query
    materialized: bool
    file: str
    line: int
    text: str
    """The statement's query as written (what Spark batch SQL of the same view runs)."""
    text_line: int = 0
    """The line of the file where ``text`` starts."""

    def line_in_file(self, text_line: int) -> int:
        """The file's line of line ``text_line`` (from 1) of ``text``."""
        return (self.text_line or self.line) + text_line - 1

    def error(self, message: str, line: int | None = None) -> SqlError:
        return located(self.file, line or self.line, self.name, message)


def parse_views(text: str, file: str = "<sql>") -> list[View]:
    """The views of ``text`` (a file's contents), in dependency order: each after every
    view it reads.  Raises :class:`SqlError` for anything that does not load."""
    views = [_view(statement, line, file) for statement, line in _statements(text, file)]
    seen: dict[str, View] = {}
    for view in views:
        if view.name.lower() in seen:
            first = seen[view.name.lower()]
            raise view.error(f"a second view named {view.name!r} (the first is at line {first.line}); rename one")
        seen[view.name.lower()] = view
    return _in_dependency_order(views)


def parse_errors(text: str, file: str = "<sql>") -> list[SqlError]:
    """Every error of ``text``: each statement's that does not parse (:func:`parse_views`
    raises the first), else the file's own (two views of one name, a cycle)."""
    try:
        statements = _statements(text, file)
    except SqlError as e:
        return [e]
    errors = []
    for statement, line in statements:
        try:
            _view(statement, line, file)
        except SqlError as e:
            errors.append(e)
    if not errors:
        try:
            parse_views(text, file)
        except SqlError as e:
            errors.append(e)
    return errors


def _statements(text: str, file: str) -> list[tuple[str, int]]:
    """Each statement's text (blank lines in front, so that positions are the file's) and line."""
    try:
        tokens = sqlglot.Dialect.get_or_raise(DIALECT).tokenize(text)
    except TokenError as e:
        raise located(file, 1, None, f"the SQL does not tokenize: {e}") from e
    statements, first = [], None
    for token in [*tokens, None]:
        if token is not None and token.token_type != TokenType.SEMICOLON:
            first = first or token
            continue
        if first is not None:
            end = len(text) if token is None else token.start
            statements.append(("\n" * (first.line - 1) + text[first.start : end], first.line))
        first = None
    return statements


def _view(statement: str, line: int, file: str) -> View:
    kind = _CREATE.match(statement)
    if kind is None:
        head = " ".join(statement.split()[:3])
        raise located(
            file,
            line,
            None,
            f"{head!r}: only CREATE MATERIALIZED VIEW name AS SELECT ... and CREATE TEMPORARY VIEW name AS "
            "SELECT ... are supported in a views file",
        )
    create = _parsed(statement, line, file)
    query = create.expression
    if not isinstance(create, exp.Create) or create.kind != "VIEW" or not isinstance(query, exp.Query):
        raise located(
            file, line, None, "syntax error: expected CREATE ... VIEW name AS SELECT ...; check the statement"
        )
    head = _HEAD.match(statement)
    body = statement[head.end() :].strip() if head else query.sql(DIALECT)
    starts = statement.count("\n", 0, statement.index(body)) + 1 if head else line
    query = query.transform(_other_name, copy=False)
    try:
        query = expand_grouping_sets(windows_over_groups(single_values(inline_named_windows(query))))
    except SqlError as e:
        raise located(file, _line_of(statement, e.node, line), create.this.name, str(e)) from e
    view = View(create.this.name, query, kind.group(1).upper() == "MATERIALIZED", file, line, body, starts)
    _refuse_unsupported(view, statement)
    return view


def _parsed(statement: str, line: int, file: str) -> exp.Expression:
    """The statement's syntax tree.  A syntax error names the line of the token sqlglot
    stopped at: where it gives up on a whole ``CREATE`` (and falls back to a bare command,
    with a warning of its own, kept off stderr), the query after ``AS`` is parsed alone
    (the head blanked, so lines stay the file's) to find it."""
    with _quiet(logging.getLogger("sqlglot")):
        try:
            create = sqlglot.parse_one(statement, read=DIALECT)
            head = _HEAD.match(statement)
            if isinstance(create, exp.Command) and head:
                sqlglot.parse_one(
                    re.sub(r"[^\n]", " ", statement[: head.end()]) + statement[head.end() :], read=DIALECT
                )
        except ParseError as e:
            first = e.errors[0] if e.errors else {}
            near = f" at {first['highlight']!r} (column {first.get('col')})" if first.get("highlight") else ""
            message = f"syntax error: {first.get('description', e)}{near}"
            raise located(file, first.get("line") or line, None, message) from e
    return create


@contextmanager
def _quiet(logger: logging.Logger) -> Iterator[None]:
    """``logger``'s records dropped meanwhile: sqlglot warns (through Python's last-resort
    handler, to stderr) of what the caller turns into its own error."""
    dropped = lambda record: False  # one object, so that the same is removed
    logger.addFilter(dropped)
    try:
        yield
    finally:
        logger.removeFilter(dropped)


def _refuse_unsupported(view: View, statement: str) -> None:
    for node in view.query.walk():
        if isinstance(node, exp.Order) and isinstance(node.parent, exp.Window):
            continue  # a window's own order: the window is checked
        reason = next((r for kind, r in _REFUSED_NODES.items() if isinstance(node, kind)), None)
        if isinstance(node, exp.Window):
            reason = _window_refusal(node)
        elif isinstance(node, (exp.Order, exp.Limit)) and isinstance(node.parent, exp.Query):
            reason = _limit_refusal(node.parent, top=node.parent is view.query)
            if isinstance(node, exp.Order) and node.parent.args.get("limit") is None:
                line = _line_of(statement, node, view.line)
                log.warning("%s", located(view.file, line, view.name, _IGNORED_ORDER))
        if reason is None and isinstance(node, exp.Anonymous) and node.name.lower() in _NONDETERMINISTIC:
            reason = f"{node.name}() (non-deterministic)"
        if reason is None and isinstance(node, _WHICHEVER_ROW) and not window_call(node):
            reason = (
                f"{node.sql(DIALECT)}, whichever row Spark meets first or last (not a function of the rows); "
                "write min, max, max_by(x, y) or min_by(x, y) for the row of the least or greatest y"
            )
        if reason is None and _lacking_aggregate(node):
            reason = f"the aggregate {node.sql(DIALECT)} (the engine maintains {_MAINTAINED})"
        if reason is not None:
            raise view.error(
                f"not supported in a maintained view: {reason}; remove it (or compute it downstream)",
                _line_of(statement, node, view.line),
            )


def _other_name(node: exp.Expression) -> exp.Expression:
    """``every(x)``, ``some(x)``, ``any(x)`` and ``std(x)`` as the ``bool_and``/``bool_or``/
    ``stddev`` they are (``x = ANY (subquery)`` is a comparison, not the aggregate)."""
    if isinstance(node, exp.Anonymous) and node.name.lower() in _OTHER_NAMES and len(node.expressions) == 1:
        return _OTHER_NAMES[node.name.lower()](this=node.expressions[0])
    if isinstance(node, exp.Any) and not isinstance(node.this, (exp.Subquery, exp.Query)):
        return exp.LogicalOr(this=node.this.unnest())
    return node


def _lacking_aggregate(node: exp.Expression) -> bool:
    """``node`` calls an aggregate the engine does not maintain (a window's own function
    is the window's refusal)."""
    if window_call(node):
        return False
    unparsed = isinstance(node, exp.Anonymous) and node.name.lower() in _UNPARSED_AGGREGATES
    return unparsed or (isinstance(node, exp.AggFunc) and type(node) not in AGGREGATES)


RANKING_FUNCTIONS: dict[type[exp.Expression], str] = {
    exp.RowNumber: "row_number",
    exp.Rank: "rank",
    exp.DenseRank: "dense_rank",
}
"""The window functions a top-k computes, by the engine's name of their ranking."""
_TOP_K_SHAPE = (
    "SELECT ... FROM (SELECT ..., ROW_NUMBER() OVER (PARTITION BY p ORDER BY o) AS rn FROM ...) WHERE rn <= k "
    "(or RANK(), DENSE_RANK(); rn < k, rn = 1)"
)


WINDOW_FUNCTIONS: dict[type[exp.Expression], str] = {
    exp.Sum: "sum",
    exp.Count: "count",
    exp.Avg: "avg",
    exp.Min: "min",
    exp.Max: "max",
    exp.Lag: "lag",
    exp.Lead: "lead",
    exp.FirstValue: "first_value",
    exp.LastValue: "last_value",
    exp.NthValue: "nth_value",
    **RANKING_FUNCTIONS,
    exp.PercentRank: "percent_rank",
    exp.CumeDist: "cume_dist",
    exp.Ntile: "ntile",
}
"""The functions the engine maintains as window columns (``f(...) OVER (...)``)."""
_PICKED = (exp.FirstValue, exp.LastValue, exp.NthValue)


def window_call(node: exp.Expression) -> bool:
    """``node`` is the function a window computes (``RANK() OVER`` is no aggregate)."""
    parent = node.parent
    if isinstance(parent, (exp.IgnoreNulls, exp.RespectNulls)):
        parent = parent.parent
    return isinstance(parent, exp.Window) and (parent.this is node or parent.this is node.parent)


def window_function(window: exp.Window) -> exp.Expression:
    """The function ``window`` computes (``IGNORE NULLS``/``RESPECT NULLS`` unwrapped)."""
    call = window.this
    return call.this if isinstance(call, (exp.IgnoreNulls, exp.RespectNulls)) else call


def is_top_k(window: exp.Window) -> bool:
    """``window`` is a ranking bounded in its enclosing query: a top-k (:func:`rank_bound`)."""
    ranking = type(window.this) in RANKING_FUNCTIONS and not window.args.get("spec") and window.args.get("order")
    return bool(ranking) and rank_bound(window) is not None


def rows_frame(window: exp.Window) -> bool:
    """``window``'s frame is ``ROWS BETWEEN ...`` (not ``RANGE``, nor the default)."""
    spec = window.args.get("spec")
    return spec is not None and str(spec.args.get("kind", "")).upper() == "ROWS"


def _window_refusal(window: exp.Window) -> str | None:
    """Why ``window`` is neither a top-k nor a window column the engine maintains, or None."""
    text = construct(window)
    select = window.find_ancestor(exp.Select)
    if window.args.get("alias"):
        return f"the window {text} names no window of the query's WINDOW clause; define it there"
    if is_top_k(window):
        return None
    if type(window_function(window)) not in WINDOW_FUNCTIONS:
        return f"the window function {text} (the engine maintains {', '.join(WINDOW_FUNCTIONS.values())} over a window)"
    if (
        select is None
        or isinstance(select.parent, (exp.In, exp.Exists))
        or isinstance(select.parent and select.parent.parent, (exp.In, exp.Exists))
    ):
        return f"{text} in an IN or EXISTS subquery; compute it in a subquery in FROM (or a view)"
    if isinstance(window_function(window), _PICKED) and not rows_frame(window):
        return (
            f"{text} over a RANGE frame (the default), where Spark picks any of the rows tied under ORDER BY; "
            "give it ORDER BY and a ROWS frame: ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING"
        )
    return None


def _aggregated(select: exp.Select) -> bool:
    """``select``'s list calls an aggregate outside window functions."""
    return any(
        isinstance(n, exp.AggFunc) and not window_call(n)
        for e in select.expressions
        for n in e.walk(prune=lambda n: isinstance(n, exp.Subquery))
    )


def ranking_select(window: exp.Window) -> exp.Select | None:
    """The query whose select list has ``window`` as an aliased item of its own, if it is
    one without aggregates, other windows or ``DISTINCT``, read in a ``FROM``."""
    alias = window.parent
    select = alias.parent if isinstance(alias, exp.Alias) else None
    if not isinstance(select, exp.Select) or alias.arg_key != "expressions" or select.args.get("distinct"):
        return None
    aggregates = [
        n for e in select.expressions for n in e.walk() if isinstance(n, exp.AggFunc) and n is not window.this
    ]
    if select.args.get("group") or aggregates:
        return None
    if sum(1 for e in select.expressions for _ in e.find_all(exp.Window)) != 1:
        return None
    subquery = select.parent
    if not isinstance(subquery, exp.Subquery) or not isinstance(subquery.parent, (exp.From, exp.Join)):
        return None
    return select


def rank_bound(window: exp.Window) -> int | None:
    """``k`` of the top-k that ``window`` is (see :func:`ranking_select`): the enclosing
    query's ``WHERE`` has a conjunct ``rn <= k``, ``rn < k + 1`` or ``rn = 1`` on its alias."""
    select = ranking_select(window)
    if select is None:
        return None
    subquery, outer = select.parent, select.parent.parent.parent
    where = outer.args.get("where") if isinstance(outer, exp.Select) else None
    name, qualifiers = window.parent.alias.lower(), {"", subquery.alias.lower()}
    bounds = []
    for c in conjuncts(where.this if where else None):
        side, limit = (c.this, c.expression) if isinstance(c, (exp.LTE, exp.LT, exp.EQ)) else (None, None)
        if isinstance(c, (exp.GTE, exp.GT)):
            side, limit = c.expression, c.this
        if not isinstance(side, exp.Column) or side.name.lower() != name or side.table.lower() not in qualifiers:
            continue
        if isinstance(limit, exp.Literal) and not limit.is_string and limit.name.isdigit():
            k = int(limit.name) - (1 if isinstance(c, (exp.LT, exp.GT)) else 0)
            if k >= 1 and (not isinstance(c, exp.EQ) or k == 1):
                bounds.append(k)
    return min(bounds, default=None)


def _limit_refusal(query: exp.Query, top: bool) -> str | None:
    """Why ``query``'s ``ORDER BY``/``LIMIT`` is refused (``top``: it is the view's own
    query), or None.  An ``ORDER BY`` alone is ignored; the view's own ``ORDER BY ...
    LIMIT k`` is a top-k; a ``LIMIT`` alone is kept over a result of at most one row."""
    limit = query.args.get("limit")
    if limit is None:
        return None
    count = limit.expression if isinstance(limit, exp.Limit) else None
    if not isinstance(count, exp.Literal) or query.args.get("offset") or not (count.name.isdigit() and int(count.name)):
        what = "LIMIT" if count is None else f"LIMIT {count.sql(DIALECT)}"
        return f"{what} (only LIMIT k with k a positive integer, no OFFSET)"
    if query.args.get("order") is None:
        if one_row(query) or (top and constant_rows(query)):
            return None
        return (
            "LIMIT without ORDER BY (which rows it keeps is not a function of the rows, unless there is at most one: "
            "a global aggregate, or such tables side by side; or its rows are all alike: a select list of literals)"
        )
    if top:
        return None
    return f"ORDER BY ... LIMIT inside a query (a top-k is the view's own ORDER BY ... LIMIT k, or {_TOP_K_SHAPE})"


def constant_rows(query: exp.Expression) -> bool:
    """Every row of ``query`` is the same row: its select list is of literals only
    (``SELECT 1 AS x FROM ... LIMIT 100``, Spark's TPC-DS q32), so which ``k`` rows a
    ``LIMIT k`` keeps is no choice: ``min(k, n)`` copies of that row."""
    if not isinstance(query, exp.Select) or not query.expressions:
        return False
    varying = (exp.Column, exp.Func, exp.Subquery, exp.Star, exp.Window)
    return not any(isinstance(n, varying) for item in query.expressions for n in item.unalias().walk())


def one_row(query: exp.Expression) -> bool:
    """``query`` has at most one row, so that its ``LIMIT k`` changes nothing: a global
    aggregate (a SELECT of aggregates and no ``GROUP BY``), or a SELECT without
    ``GROUP BY`` over derived tables of at most one row each, joined other than by a
    ``FULL`` join (TPC-DS q28's six global aggregates side by side)."""
    if not isinstance(query, exp.Select) or query.args.get("group") is not None:
        return False
    if _aggregated(query):
        return True
    joins = query.args.get("joins") or []
    source = query.args.get("from_")
    tables = [source.this] if source is not None else []
    tables += [j.this for j in joins if str(j.args.get("side") or "").upper() != "FULL"]
    return len(tables) == 1 + len(joins) and all(isinstance(t, exp.Subquery) and one_row(t.this) for t in tables)


def conjuncts(condition: exp.Expression | None) -> list[exp.Expression]:
    if condition is None:
        return []
    if isinstance(condition, exp.And):
        return [*conjuncts(condition.this), *conjuncts(condition.expression)]
    if isinstance(condition, exp.Paren):
        return conjuncts(condition.this)
    return [condition]


def _line_of(statement: str, node: exp.Expression, default: int) -> int:
    """The line of ``node`` in the file (``statement`` has the file's lines before it): where
    the parser met it or the first of its parts it placed, else where ``node``'s first word
    appears in ``statement`` (a node the rewrites made), else ``default``."""
    placed = next((n.meta["line"] for n in node.walk() if n._meta and "line" in n._meta), None)
    if placed is not None:
        return placed
    word = node.sql(DIALECT).split("(")[0].split()[0] if node.sql(DIALECT).strip() else ""
    position = statement.upper().find(word.upper()) if word else -1
    return statement.count("\n", 0, position) + 1 if position >= 0 else default


def read_tables(query: exp.Expression) -> set[str]:
    """The names of the tables a query reads, but the CTEs it defines (lower case)."""
    ctes = {cte.alias_or_name.lower() for cte in query.find_all(exp.CTE)}
    return {t.name.lower() for t in query.find_all(exp.Table)} - ctes


def _in_dependency_order(views: list[View]) -> list[View]:
    by_name = {v.name.lower(): v for v in views}
    ordered: list[View] = []
    state: dict[str, str] = {}

    def visit(view: View, path: list[str]) -> None:
        key = view.name.lower()
        if state.get(key) == "done":
            return
        if state.get(key) == "visiting":
            cycle = " -> ".join([*path[path.index(key) :], key])
            raise view.error(
                f"views read each other in a cycle ({cycle}); break the cycle: a view may read other views, not itself through them"
            )
        state[key] = "visiting"
        for table in sorted(read_tables(view.query)):
            if table in by_name:
                visit(by_name[table], [*path, key])
        state[key] = "done"
        ordered.append(view)

    for view in views:
        visit(view, [])
    return ordered


def views_read(view: View, views: list[View], through_materialized: bool = True) -> set[str]:
    """The names (lower case) of the views of ``views`` that ``view`` reads, directly or
    through other views: every one, or, if not ``through_materialized``, the materialized
    ones it reaches directly or through temporary views (its lineage)."""
    by_name = {v.name.lower(): v for v in views}
    found, todo = set(), list(read_tables(view.query))
    while todo:
        name = todo.pop()
        if name in by_name and name not in found:
            found.add(name)
            if through_materialized or not by_name[name].materialized:
                todo += read_tables(by_name[name].query)
    return found if through_materialized else {n for n in found if by_name[n].materialized}


def check_columns(views: list[View], columns: dict[str, list[str]]) -> None:
    """Refuses a view that names a column that none of the tables and views it reads has,
    nor any alias or column list of its own: Spark's analysis finds it too, but this check
    needs no Spark (a Dagster code location loads the views before any session exists).
    ``columns``: each table's column names; ``views`` in dependency order.  Only names are
    compared (not which table a qualified name belongs to), so nothing Spark accepts is
    refused; a view that reads a table not in ``columns`` is left to Spark."""
    known = {name.lower(): {c.lower() for c in names} for name, names in columns.items()}
    for view in views:
        read = read_tables(view.query)
        if not read <= set(known):
            continue
        names = set().union(*(known[t] for t in read), _aliases(view.query))
        relations = {t.alias_or_name.lower() for t in view.query.find_all(exp.Table)} | {
            a.name.lower() for a in view.query.find_all(exp.TableAlias)
        }
        for column in view.query.find_all(exp.Column):
            qualifier = column.table.lower()
            if isinstance(column.this, exp.Star) or column.name.lower() in names:
                continue
            if qualifier and qualifier not in relations:
                continue  # a struct's field (``s.f``), not a table's column
            raise view.error(
                f"unknown column {column.sql(DIALECT)}: none of {sorted(read)} has it; check its spelling",
                column.this.meta.get("line"),
            )
        known[view.name.lower()] = names


def _aliases(query: exp.Expression) -> set[str]:
    """The names a query gives: select-list aliases and column lists (``AS t (a, b)``)."""
    aliases = {a.alias.lower() for a in query.find_all(exp.Alias)}
    return aliases | {c.name.lower() for t in query.find_all(exp.TableAlias) for c in t.columns}


def ddl_fields(ddl: str) -> list[str]:
    """The top-level fields of a Spark DDL schema (``'id BIGINT, price DECIMAL(12,2)'``:
    two), split without Spark."""
    fields, depth, start = [], 0, 0
    for i, char in enumerate(f"{ddl},"):
        depth += {"(": 1, "<": 1, ")": -1, ">": -1}.get(char, 0)
        if char == "," and depth == 0:
            fields.append(ddl[start:i])
            start = i + 1
    return [f for f in fields if f.strip()]


def ddl_columns(ddl: str) -> list[str]:
    """The column names of a Spark DDL schema: the first word of each field."""
    return [f.replace(":", " ").split()[0].strip("`") for f in ddl_fields(ddl)]
