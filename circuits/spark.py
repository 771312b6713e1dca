"""SparkSession settings the engine relies on, and one Spark idiom it uses throughout."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from functools import reduce

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

ENGINE_CONF = {
    # A step is small and keyed by vnode: broadcasting a trace or letting AQE re-plan
    # partitions would move rows away from the worker that owns their vnode.
    "spark.sql.adaptive.enabled": "false",
    "spark.sql.autoBroadcastJoinThreshold": "-1",
    # Joins and groupings include the exchange's partition column among their keys;
    # this lets Spark reuse that partitioning instead of shuffling again.
    "spark.sql.requireAllClusterKeysForCoPartition": "false",
    "spark.sql.session.timeZone": "UTC",
    # Checkpointed state carries the constraints of the plan that wrote it; propagating them
    # step after step grows the optimizer's work without bound.
    "spark.sql.constraintPropagation.enabled": "false",
    # A trace is a union of parts and a lookup semi-joins it with the step's keys. Pushing
    # joins into the union copies the (large) key subtree once per part, and chained
    # operators multiply those copies.
    "spark.sql.optimizer.pushDownJoinThroughUnion.enabled": "false",
    "spark.sql.optimizer.excludedRules": "org.apache.spark.sql.catalyst.optimizer.PushDownLeftSemiAntiJoin",
    # PySpark records the Python call site of every Column and DataFrame call for Spark's
    # error messages: a stack walk, a failed IPython import and four JVM calls each, which
    # made up most of a step's planning.  The engine names the user's call site itself.
    "spark.python.sql.dataFrameDebugging.enabled": "false",
}


def local_session(cores: int = 2, app_name: str = "dbsp", extra: dict[str, str] | None = None) -> SparkSession:
    """A local-mode session with the engine's settings (``cores`` threads in one JVM)."""
    return session(f"local[{cores}]", app_name, extra)


def session(master: str, app_name: str = "dbsp", extra: dict[str, str] | None = None) -> SparkSession:
    """A session on ``master`` (``local[N]``, ``spark://host:7077``, ``k8s://...``, ``yarn``)
    with the engine's settings; an existing session in this process is reused."""
    # Python workers (mapInArrow) must run the interpreter that has this project's packages.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in {**ENGINE_CONF, "spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false", **(extra or {})}.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def aggregate_each(frames: Sequence[DataFrame], *aggregates: Column) -> list[tuple | None]:
    """``aggregates`` over each of ``frames`` (which have the same columns), all computed by
    one Spark job: a tuple per frame, or None for a frame without rows."""
    if not frames:
        return []
    labelled = [df.select(F.lit(i).alias("_frame"), *df.columns) for i, df in enumerate(frames)]
    rows = reduce(DataFrame.unionByName, labelled).groupBy("_frame").agg(*aggregates).collect()
    found = {row[0]: tuple(row[1:]) for row in rows}
    return [found.get(i) for i in range(len(frames))]
