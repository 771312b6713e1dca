"""Views of other pipelines as inputs: pipelines chain.

An input whose source is ``view:<pipeline>.<sink>`` takes what sink ``<sink>`` of pipeline
``<pipeline>`` (another pipeline of the same configuration, on the same store) changed,
step by step: the upstream's output log (``<upstream root>/outputs/<sink>``), whose rows
are the view's changes with their weights and ``_step``.  It is divided like a Delta
table: one :class:`storage.logs.Range` per view, partition 0, ``start`` to ``end``
(exclusive) the upstream's steps (a step counts as one record).  The sensor learns how
many steps the upstream has committed from the log (delta-rs, no Spark) and cuts as they
commit; the step reads the rows of its range of steps with their weights, and the pipeline
persists them to its own input log, so a replay never reads the upstream again.

An upstream step's output, once in the log, is final (a replay of the upstream verifies
that it writes the same rows), so a downstream step never takes a change the upstream
could still undo.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from circuits.zset import WEIGHT
from storage.delta import table_schema
from storage.logs import Range, output_steps, output_uri, read_steps
from storage.pipeline import StepInput
from storage.tables import open_table

from .delta_source import ranged_input
from .errors import InputColumnsChangedError, TableRewrittenError

VIEW = "view:"
"""The prefix of an upstream view's source (Kafka topic names cannot hold ``:``)."""


def is_view(source: str) -> bool:
    return source.startswith(VIEW)


def view_name(source: str) -> tuple[str, str]:
    """``(pipeline, sink)`` of ``view:<pipeline>.<sink>``."""
    pipeline, _, sink = source.removeprefix(VIEW).partition(".")
    return pipeline, sink


def went_back(source: str, start: int, end: int) -> TableRewrittenError:
    """The error for an upstream whose log has ``end`` steps, fewer than ``start``, where
    the division log says the next step starts: the upstream started anew."""
    pipeline, sink = view_name(source)
    return TableRewrittenError(
        f"view {sink!r} of pipeline {pipeline!r}: its output log has {end} steps, but steps have read it up to step "
        f"{start - 1}; the upstream pipeline started anew (a new store root, or its store was deleted). Start this "
        "pipeline anew too, on a new store root, so that it reads the upstream from its first step"
    )


@dataclass(frozen=True)
class UpstreamViews:
    """A pipeline's inputs that are views of other pipelines: per input handle its source,
    ``view:<pipeline>.<sink>``, and per upstream pipeline its store root.  Its :meth:`read`
    serves :data:`storage.pipeline.StepReader` for those handles."""

    views: dict[str, str]
    roots: dict[str, str]

    @property
    def sources(self) -> list[str]:
        return sorted(set(self.views.values()))

    def log(self, source: str) -> tuple[str, str]:
        """The upstream's root and the sink whose output log ``source`` reads."""
        pipeline, sink = view_name(source)
        return self.roots[pipeline], sink

    def uri(self, source: str) -> str:
        return output_uri(*self.log(source))

    def positions(self) -> dict[tuple[str, int], tuple[int, int]]:
        """Per view ``(source, 0)``: ``(0, steps committed)`` (the output log keeps every step)."""
        return {(s, 0): (0, output_steps(*self.log(s))) for s in self.sources}

    @contextmanager
    def read(
        self,
        spark: SparkSession,
        ranges: list[Range],
        schemas: dict[str, T.StructType],
        taken: dict[tuple[str, str], int],
    ) -> Iterator[StepInput]:
        """Each handle's changes over its view's range of upstream steps, weighted; a view
        without a range in the step is an empty input."""
        yield ranged_input(self.views, ranges, lambda h, s, r: self.changes(spark, s, r, h, schemas[h]))

    def changes(self, spark: SparkSession, source: str, r: Range, handle: str, schema: T.StructType) -> DataFrame:
        """The Z-set of input ``handle``: the upstream's changes of steps ``r.start..r.end - 1``,
        the columns of ``schema`` and their weights (the log's columns checked against it)."""
        uri = self.uri(source)
        have = {f.name.lower(): f.dataType for f in table_schema(open_table(uri)).fields}
        for f in schema.fields:
            found = have.get(f.name.lower())
            if found is None or found.simpleString() != f.dataType.simpleString():
                pipeline, sink = view_name(source)
                there = "is not a column of the view" if found is None else f"is {found.simpleString()} there"
                raise InputColumnsChangedError(
                    f"view {sink!r} of pipeline {pipeline!r}: column {f.name!r}, which input {handle!r} reads as "
                    f"{f.dataType.simpleString()}, {there}. Declare the view's columns in schemas.{handle} "
                    "as the upstream's view has them"
                )
        rows = read_steps(spark, uri, r.start, r.end - 1)
        return rows.select(*(F.col(f.name) for f in schema.fields), F.col(WEIGHT))
