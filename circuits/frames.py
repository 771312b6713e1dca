"""Column edits as projections, which Spark Connect plans lazily.

A Spark Connect server resolves ``withColumn(s)``, ``withColumnRenamed``, ``drop`` and
``dropna`` by analysing the frame they apply to on the spot, each time a plan holding
them arrives, so a step's plan paid one analysis of the subtree below every such edit
(a quarter of the server's time in a profile of a demo step).  A projection or a filter
is analysed once, with the whole plan.  These helpers make the same edits that way."""

from __future__ import annotations

import re
from functools import reduce
from typing import Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F


def with_columns(df: DataFrame, **named: Column) -> DataFrame:
    """``df`` with the columns ``named`` (expressions over ``df``) last, replacing any
    ``df`` has of those names."""
    return df.select(_all_but(df, list(named)), *[column.alias(name) for name, column in named.items()])


def without(df: DataFrame, *names: str) -> DataFrame:
    """``df`` without the columns ``names`` (absent names are ignored, as by ``drop``)."""
    return df.select(_all_but(df, names))


def _all_but(df: DataFrame, names: Sequence[str]) -> Column:
    others = "|".join(re.escape(name) for name in names)
    return df.colRegex(f"`(?!(?:{others})$).+`")


def not_null(df: DataFrame, columns: Sequence[str]) -> DataFrame:
    """The rows of ``df`` with no null in ``columns``."""
    return df.where(reduce(lambda a, b: a & b, [F.col(c).isNotNull() for c in columns]))
