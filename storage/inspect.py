"""Read-only facts about a pipeline's tables, for reports and checks.

Row counts come from the Delta log's file statistics (no Spark job); the checks are
queries for the bad rows of an output log (the set check: among the rows a step touched,
counted in the output's current view where it has one, else integrated over the log).
:func:`check_outputs` counts them in this process with pyarrow when the logs are small,
else with one Spark job (:func:`count_each`).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import reduce
from typing import TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from deltalake import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from circuits.spark import aggregate_each
from circuits.zset import WEIGHT

from .delta import add_actions, read_files, table_schema
from .logs import STEP, OutputLog, files_of_steps, step_rows
from .tables import dataset, groupable, open_table, parquet_dataset

K = TypeVar("K")

LOCAL_ROWS = 1_000_000
"""Output logs of at most this many rows (by their file statistics) are checked in the
run's own process: a Spark job for the checks cost 1.1-2.7 s of a 1,000-event demo step
run (load 11-17), pyarrow 0.02-0.12 s (``bench/dagster_step_parts.py``).  Larger logs are
checked by Spark, where they are."""
_TOUCHED = "_touched"


def check_outputs(
    outputs: OutputLog,
    sets: dict[str, bool],
    first: int,
    last: int,
    views: Mapping[str, DeltaTable] | None = None,
) -> dict[tuple[str, str], int]:
    """Bad rows of steps ``first..=last`` of each output ``sets`` names, by (output,
    check): ``consolidated`` (see :func:`unconsolidated`) for each, ``is_a_set`` (see
    :func:`not_a_set`) for those whose value is True.

    ``views``: outputs' current views as of step ``last``.  The set check of such an
    output counts the copies of the touched rows in the view, the log's integral, rather
    than integrating the log from its first step: what a run reads then grows with the
    view, not with the pipeline's age."""
    views = views or {}
    logs = {name: open_table(outputs.uri(name)) for name in sets}
    if not all(map(_local, logs.values())):
        return _spark_checks(outputs, sets, first, last, views)
    integrals = {name: views.get(name) for name, is_set in sets.items() if is_set}
    rows = sum(_rows(files_of_steps(log, first, last)) for log in logs.values()) + sum(
        _rows(add_actions(view).to_pylist()) if view is not None else _rows(files_of_steps(logs[name], 0, last))
        for name, view in integrals.items()
    )
    if rows > LOCAL_ROWS or not all(map(_local, filter(None, integrals.values()))):
        return _spark_checks(outputs, sets, first, last, views)
    bad = {}
    for name, log in logs.items():
        changes = step_rows(log, first, last)
        bad[name, "consolidated"] = unconsolidated_rows(changes)
        if name in integrals:
            view = integrals[name]
            integral = step_rows(log, 0, last) if view is None else _copies(dataset(view).to_table())
            bad[name, "is_a_set"] = not_a_set_rows(integral, changes)
    return bad


def _spark_checks(
    outputs: OutputLog, sets: dict[str, bool], first: int, last: int, views: Mapping[str, DeltaTable]
) -> dict[tuple[str, str], int]:
    queries = {}
    for name, is_set in sets.items():
        changes = outputs.read(name, first, last)
        queries[name, "consolidated"] = unconsolidated(changes)
        if is_set:
            view = views.get(name)
            integral = outputs.read(name, 0, last) if view is None else _view_copies(outputs.spark, view)
            queries[name, "is_a_set"] = not_a_set(integral, changes)
    return count_each(queries)


def _copies(view: pa.Table) -> pa.Table:
    """A view's rows (a row per copy) as changes of weight 1 each."""
    return view.append_column(WEIGHT, pa.array(np.ones(view.num_rows, dtype=np.int64)))


def _view_copies(spark: SparkSession, view: DeltaTable) -> DataFrame:
    """:func:`_copies` of a view read by Spark."""
    rows = read_files(spark, view.table_uri, table_schema(view), view.file_uris(), view.version())
    return rows.withColumn(WEIGHT, F.lit(1).cast("bigint"))


def _local(table) -> bool:
    """Whether pyarrow can check the table: it exists, and it has no nested column (which
    pyarrow cannot group by)."""
    return table is not None and groupable(table)


def _rows(files: list[dict]) -> int:
    """The rows of add actions ``files`` by their statistics; a file without them counts as too many."""
    return sum(LOCAL_ROWS + 1 if f["num_records"] is None else f["num_records"] for f in files)


def unconsolidated_rows(changes: pa.Table) -> int:
    """:func:`unconsolidated` of an Arrow table: the number of its bad rows."""
    columns = [c for c in changes.column_names if c != WEIGHT]
    if not columns:
        return 0
    weights = changes.set_column(changes.column_names.index(WEIGHT), WEIGHT, pc.abs(changes[WEIGHT]))
    grouped = weights.group_by(columns, use_threads=False).aggregate([(WEIGHT, "count"), (WEIGHT, "min")])
    bad = pc.or_(pc.greater(grouped[f"{WEIGHT}_count"], 1), pc.equal(grouped[f"{WEIGHT}_min"], 0))
    return pc.sum(bad.cast(pa.int64())).as_py() or 0


def not_a_set_rows(history: pa.Table, changes: pa.Table) -> int:
    """:func:`not_a_set` of Arrow tables: the number of rows ``changes`` touch whose
    weight integrated over ``history`` is not 0 or 1.  Rows are grouped, not joined, so
    that a null equals a null as in the Spark query's ``eqNullSafe``."""
    columns = [c for c in changes.column_names if c not in (WEIGHT, STEP)]
    if not columns:
        return 0
    weight = history.schema.field(WEIGHT).type
    touched = changes.select(columns).group_by(columns, use_threads=False).aggregate([])
    touched = touched.append_column(WEIGHT, pa.nulls(touched.num_rows, weight)).append_column(
        _TOUCHED, pa.repeat(True, touched.num_rows)
    )
    rows = history.select([*columns, WEIGHT]).append_column(_TOUCHED, pa.repeat(False, history.num_rows))
    both = pa.concat_tables([touched.select(rows.column_names), rows], promote_options="permissive")
    integral = both.group_by(columns, use_threads=False).aggregate([(WEIGHT, "sum"), (_TOUCHED, "any")])
    weights = integral[f"{WEIGHT}_sum"].fill_null(0)
    bad = pc.and_(integral[f"{_TOUCHED}_any"], pc.invert(pc.is_in(weights, pa.array([0, 1], weights.type))))
    return pc.sum(bad.cast(pa.int64())).as_py() or 0


def rows_of_steps(uri: str, first: int, last: int) -> int:
    """Rows that steps ``first..=last`` wrote to the step-keyed table ``uri`` (0 if none): by
    the statistics of the files holding only those steps, and by reading the steps' rows of
    any other (a compaction's, see :func:`storage.database.compact_log`)."""
    files = files_of_steps(open_table(uri), first, last)
    counted, others = 0, []
    for f in files:
        if first <= _step_bound(f, "min", -1) and _step_bound(f, "max", last + 1) <= last:
            counted += f["num_records"] or 0
        else:
            others.append(f["uri"])
    step = ds.field(STEP)
    return counted + (parquet_dataset(others).count_rows(filter=(step >= first) & (step <= last)) if others else 0)


def _step_bound(file: dict, bound: str, unknown: int) -> int:
    """A file's least or greatest step (``bound``: min or max) by its statistics, or ``unknown``."""
    found = file.get(f"{bound}.{STEP}")
    return unknown if found is None else found


def dead_letters_of_steps(uri: str, first: int, last: int, reasons: int) -> dict[str, tuple[int, list[str]]]:
    """Per topic, the dead letters of steps ``first..=last`` in the dead-letter table
    ``uri``: their count and the reasons of the first ``reasons`` of them (by step and offset)."""
    table = open_table(uri)
    if table is None:
        return {}
    letters = step_rows(table, first, last, columns=["topic", "partition", "offset", "reason", STEP])
    found: dict[str, tuple[int, list[str]]] = {}
    for row in letters.sort_by([(STEP, "ascending"), ("offset", "ascending")]).to_pylist():
        count, first_reasons = found.get(row["topic"], (0, []))
        if len(first_reasons) < reasons:
            first_reasons = [*first_reasons, f"partition {row['partition']} offset {row['offset']}: {row['reason']}"]
        found[row["topic"]] = (count + 1, first_reasons)
    return found


def count_each(queries: dict[K, DataFrame]) -> dict[K, int]:
    """The number of rows of each query, with one Spark job for all of them."""
    counts = aggregate_each([df.select() for df in queries.values()], F.count(F.lit(1)))
    return {key: found[0] if found else 0 for key, found in zip(queries, counts, strict=True)}


def unconsolidated(changes: DataFrame) -> DataFrame:
    """Rows of a step-keyed change log that break consolidation: a zero weight, or the
    same row twice in one step."""
    columns = [c for c in changes.columns if c != WEIGHT]
    grouped = changes.groupBy(*columns).agg(F.count(F.lit(1)).alias("n"), F.min(F.abs(WEIGHT)).alias("w"))
    return grouped.where((F.col("n") > 1) | (F.col("w") == 0))


def not_a_set(history: DataFrame, changes: DataFrame) -> DataFrame:
    """Rows of ``changes`` whose integrated weight over ``history`` (every step so far)
    is not 0 or 1: duplicates or negative rows in a view that must be a set.

    Only the rows that ``changes`` touch are integrated: every other row kept the weight
    an earlier check saw, so the check costs what the change does, not the whole log."""
    columns = [c for c in changes.columns if c not in (WEIGHT, STEP)]
    touched = changes.select(*columns).distinct()
    same = reduce(lambda a, b: a & b, [history[c].eqNullSafe(touched[c]) for c in columns])
    integral = history.join(F.broadcast(touched), same, "left_semi").groupBy(*columns).agg(F.sum(WEIGHT).alias("w"))
    return integral.where(~F.col("w").isin(0, 1))
