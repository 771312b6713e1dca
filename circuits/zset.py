"""Z-sets as Spark DataFrames.

A Z-set is a DataFrame of the user's columns plus an integer weight column
:data:`WEIGHT`.  A row with weight ``w`` stands for ``w`` copies of the row;
negative weights are deletions.  Two Z-sets are equal when they are equal after
:func:`consolidate`.
"""

from __future__ import annotations

from collections.abc import Iterable

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from .ddl import parse_ddl
from .errors import SchemaMismatchError
from .sharding import PART, VNODE

WEIGHT = "_weight"
"""Name of the weight column of every Z-set."""

INTEGRAL_TYPES = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)


def data_columns(schema: T.StructType) -> list[str]:
    """The user's columns of a Z-set of ``schema``: every column but the weight and the
    routing columns."""
    return [c for c in schema.names if c not in (WEIGHT, VNODE, PART)]


def weight() -> Column:
    return F.col(WEIGHT)


def negate(df: DataFrame) -> DataFrame:
    """``-Z``: every weight negated."""
    return df.withColumn(WEIGHT, -weight())


def add(*zsets: DataFrame, allow_missing: bool = False) -> DataFrame:
    """``Z1 + Z2 + ...``: the union of rows, weights summed on consolidation; columns are
    matched by name, in the first term's order (``allow_missing``: a column some terms
    lack is null there).

    The terms are united as a balanced tree, so a plan's depth grows with the logarithm of
    their number: Spark Connect's client cannot send a checkpoint of a plan nested much
    deeper than about 50 relations."""
    terms = list(zsets)
    while len(terms) > 1:
        pairs = zip(terms[0::2], terms[1::2])
        terms = [a.unionByName(b, allowMissingColumns=allow_missing) for a, b in pairs] + terms[
            len(terms) - len(terms) % 2 :
        ]
    return terms[0]


_ROW = "_row"
"""The struct of a row's columns that :func:`consolidate` groups by."""


def consolidate(df: DataFrame, *, routed: bool = False) -> DataFrame:
    """Sums the weights of equal rows and drops rows whose weight is zero.

    Grouping treats nulls as equal, as a Z-set must: a null row is one row.  The rows are
    grouped as one struct of every column but the weight, so that planning needs no
    schema (over Spark Connect, asking for one is a round trip).  A ``routed`` frame (it
    has the routing columns and sits on the owning workers) is grouped by its partition
    column too, which keeps the grouping where the exchange put the rows."""
    by = [PART] if routed else []
    return (
        df.select(*by, F.struct("*").dropFields(WEIGHT, *by).alias(_ROW), WEIGHT)
        .groupBy(*by, _ROW)
        .agg(F.sum(WEIGHT).alias(WEIGHT))
        .where(weight() != 0)
        .select(f"{_ROW}.*", *by, WEIGHT)
    )


def empty_like(df: DataFrame) -> DataFrame:
    """A Z-set with ``df``'s schema and no rows, without running a Spark job.

    Spark's optimizer sees that it is empty (a false filter becomes an empty local
    relation) and removes every join, aggregate and exchange that it empties in turn:
    an operator whose delta is empty this step costs no Spark stage."""
    return df.where(F.lit(False))


def parse_schema(schema: T.StructType | str) -> T.StructType:
    """A declared input schema: a StructType or a DDL string such as ``"word string, n bigint"``.

    The types of :mod:`circuits.ddl` are parsed with no Spark session; a schema with
    anything else goes to Spark's DDL parser."""
    if isinstance(schema, T.StructType):
        return schema
    return parse_ddl(schema) or T._parse_datatype_string(schema)


def with_weight_schema(schema: T.StructType) -> T.StructType:
    return T.StructType([*schema.fields, T.StructField(WEIGHT, T.LongType(), False)])


def from_rows(spark: SparkSession, rows: Iterable[tuple], schema: T.StructType | str) -> DataFrame:
    """A Z-set from Python tuples whose last element is the weight."""
    return spark.createDataFrame(list(rows), with_weight_schema(parse_schema(schema)))


def empty(spark: SparkSession, schema: T.StructType | str) -> DataFrame:
    """A Z-set of the declared ``schema`` (the weight column added) and no rows."""
    return nothing(spark, with_weight_schema(parse_schema(schema)))


def nothing(spark: SparkSession, schema: T.StructType) -> DataFrame:
    """A provably empty relation of ``schema`` (as is), with no plan below it."""
    return empty_like(spark.createDataFrame([], schema))


def conform(name: str, df: DataFrame, schema: T.StructType) -> DataFrame:
    """Checks an input delta against its declared schema and returns it with a bigint weight.

    Column order may differ; names and types must match.  Raises
    :class:`SchemaMismatchError` naming the input and the column.
    """
    types = {f.name: f.dataType for f in df.schema.fields}
    if WEIGHT not in types:
        raise SchemaMismatchError(
            f"input '{name}': the delta has no weight column '{WEIGHT}'; add an integer column "
            f"'{WEIGHT}' (1 to insert a row, -1 to delete it)"
        )
    if not isinstance(types[WEIGHT], INTEGRAL_TYPES):
        raise SchemaMismatchError(
            f"input '{name}': weight column '{WEIGHT}' has type {types[WEIGHT].simpleString()}; "
            "weights must be integers (tinyint, smallint, int or bigint)"
        )
    for field in schema.fields:
        if field.name not in types:
            raise SchemaMismatchError(
                f"input '{name}': column '{field.name}' ({field.dataType.simpleString()}) is declared "
                "but missing from the delta"
            )
        if types[field.name] != field.dataType:
            raise SchemaMismatchError(
                f"input '{name}': column '{field.name}' has type {types[field.name].simpleString()}, "
                f"declared {field.dataType.simpleString()}"
            )
    extra = sorted(set(types) - {f.name for f in schema.fields} - {WEIGHT})
    if extra:
        raise SchemaMismatchError(
            f"input '{name}': column(s) {', '.join(repr(c) for c in extra)} are not in the declared "
            f"schema ({schema.simpleString()})"
        )
    return df.select(*[f.name for f in schema.fields], weight().cast("bigint").alias(WEIGHT))
