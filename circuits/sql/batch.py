"""The oracle of a views file: Spark batch SQL of the same text over whole tables."""

from __future__ import annotations

from collections.abc import Mapping

import sqlglot
from pyspark.sql import DataFrame, SparkSession
from sqlglot import exp

from .aggregates import ORDER_DEPENDENT, with_deterministic_aggregates
from .grouped_windows import groups_columns, over_groups
from .named_windows import inline_named_windows
from .parse import DIALECT, parse_views, views_read
from .windows import order_dependent


def batch_views(
    spark: SparkSession, text: str, tables: Mapping[str, DataFrame], file: str = "<sql>"
) -> dict[str, DataFrame]:
    """Each materialized view of ``text`` recomputed from scratch by Spark over ``tables``
    (name -> contents): every table and view becomes a temporary view of ``spark``, the
    views in dependency order, so a view's text runs unchanged."""
    for name, frame in tables.items():
        frame.createOrReplaceTempView(name)
    recomputed = {}
    for view in parse_views(text, file):
        frame = spark.sql(view.text)
        if view.query.args.get("limit") or view.query.find(exp.Window, *ORDER_DEPENDENT):
            frame = spark.sql(tie_broken(view.text, len(frame.columns)))
        frame.createOrReplaceTempView(view.name)
        if view.materialized:
            recomputed[view.name] = frame
    return recomputed


def standalone_sql(text: str, file: str = "<sql>") -> dict[str, str]:
    """Each materialized view of ``text`` as one query over the tables alone: the views it
    reads come first as CTEs (for a batch job that has only the tables)."""
    views = parse_views(text, file)
    queries = {}
    for view in views:
        if view.materialized:
            needed = views_read(view, views)
            ctes = [f"`{v.name}` AS ({v.text})" for v in views if v.name.lower() in needed]
            queries[view.name] = (
                f"WITH {', '.join(ctes)}, `{view.name}` AS ({view.text}) SELECT * FROM `{view.name}`"
                if ctes
                else view.text
            )
    return queries


def tie_broken(query: str, columns: int) -> str:
    """``query`` (a view's Spark SQL, of ``columns`` columns) with the engine's choice among
    ties made explicit, so that Spark batch SQL of it gives the one answer the engine
    maintains (of those Spark may give): the order of each window whose value depends on
    the order of tied rows (see :mod:`circuits.sql.windows`) ends with the rows' columns
    (``struct(*)``; over a query's groups, its grouping expressions and aggregate calls), the view's own ``ORDER BY ... LIMIT`` with its columns, by
    position, and each aggregate whose value depends on the order of the rows (``max_by``,
    ``collect_list``, ...) is the engine's (see :mod:`circuits.sql.aggregates`).  A query
    with none of them is returned as it is."""
    tree = inline_named_windows(sqlglot.parse_one(query, read=DIALECT))
    windows = [w for w in tree.find_all(exp.Window) if order_dependent(w)]
    aggregates = tree.find(*ORDER_DEPENDENT)
    if not windows and not aggregates and not (tree.args.get("limit") and tree.args.get("order")):
        return query
    with_deterministic_aggregates(tree)
    for window in windows:
        if window.args.get("order") is None:
            window.set("order", exp.Order(expressions=[]))
        groups = over_groups(window)
        ties = (
            [e.copy() for part in groups_columns(groups) for e in part] if groups else [exp.func("struct", exp.Star())]
        )
        for tie in ties:
            window.args["order"].append("expressions", exp.Ordered(this=tie, nulls_first=True))
    if tree.args.get("limit") and tree.args.get("order"):
        for position in range(1, columns + 1):
            tree.args["order"].append("expressions", exp.Ordered(this=exp.Literal.number(position), nulls_first=True))
    return tree.sql(DIALECT)
