"""The oracle of a views file: Spark batch SQL of the same text over whole tables."""

from __future__ import annotations

from collections.abc import Mapping

from pyspark.sql import DataFrame, SparkSession

from .parse import parse_views, views_read


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
