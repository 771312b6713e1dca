"""A step's read of its sources: :meth:`Sources.read`, the reader a caller gives
:meth:`storage.pipeline.Pipeline.run_steps`, reads each step's recorded ranges once: the
Kafka topics' (:meth:`KafkaSource.read`, consumed on the executors and decoded) and the
Delta tables' (:class:`sensors.delta_source.DeltaTables`, their change data feed) and
other pipelines' views (:class:`sensors.upstream.UpstreamViews`, their output logs).  The
pipeline persists what it reads (and the records that could not be decoded) to the input
log; replays read the input log, never the broker or the tables again."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field

from pyspark.sql import SparkSession
from pyspark.sql.types import StructType

from storage.errors import StorageError
from storage.logs import Range
from storage.pipeline import StepInput

from .decode import Decoded, read_ranges
from .delta_source import DeltaTables, is_table
from .kafka import KafkaClient
from .upstream import UpstreamViews, is_view


@dataclass(frozen=True)
class KafkaSource:
    """Where a pipeline's inputs come from: one topic per input handle.  Its :meth:`read`
    is the pipeline's :data:`storage.pipeline.StepReader`."""

    bootstrap_servers: str
    topics: dict[str, str]
    config: dict[str, str] = field(default_factory=dict)
    read_timeout: float = 30.0
    """Seconds without a new record before the step's read fails (a limit on no progress)."""

    def client(self) -> KafkaClient:
        return KafkaClient(self.bootstrap_servers, self.config)

    @contextmanager
    def read(
        self,
        spark: SparkSession,
        ranges: list[Range],
        schemas: dict[str, StructType],
        taken: dict[tuple[str, str], int],
    ) -> Iterator[StepInput]:
        """The step's records of ``ranges``, decoded; a job over them that fails because the
        broker did not deliver raises the read's error (offsets lost, broker stalled or gone)."""
        decoded = read_ranges(
            spark,
            self.bootstrap_servers,
            self.config,
            ranges,
            {self.topics[h]: s for h, s in schemas.items()},
            self.read_timeout,
            taken=taken,
        )
        # A topic with no offsets in the step is an empty input, known so without reading.
        read = {r.source for r in ranges if r.end > r.start}

        def step_input(decoded: Decoded) -> StepInput:
            return StepInput(
                {h: decoded.inputs[t] for h, t in self.topics.items() if t in read and t in decoded.inputs},
                *((decoded.dead_letters, decoded.taken) if read else (None, None)),
                rest=decoded.rest and (lambda: (more := decoded.rest()) and step_input(more)),
            )

        try:
            yield step_input(decoded)
        except StorageError as e:
            # The job failed before anything was committed: the step stays unpersisted.
            failed = decoded.failed(e)
            if failed is None:
                raise
            raise failed from e
        finally:
            decoded.unpersist()


@dataclass(frozen=True)
class Sources:
    """Every input of a pipeline: its Kafka topics, its Delta tables and the views of other
    pipelines it reads (any may be None: a pipeline without such inputs).  It is what a
    division is cut from (:class:`sensors.division.Positions`), and its :meth:`read` is the
    pipeline's :data:`storage.pipeline.StepReader`."""

    kafka: KafkaSource | None = None
    tables: DeltaTables | None = None
    views: UpstreamViews | None = None

    @property
    def names(self) -> list[str]:
        return [
            *(self.kafka.topics.values() if self.kafka else ()),
            *(self.tables.sources if self.tables else ()),
            *(self.views.sources if self.views else ()),
        ]

    def positions(self) -> dict[tuple[str, int], tuple[int, int]]:
        """Per topic partition its low and high offsets, per table its versions (see
        :meth:`~sensors.delta_source.DeltaTables.positions`), per upstream view its steps."""
        topics = self.kafka.client().offsets(list(self.kafka.topics.values())) if self.kafka else {}
        return (
            topics | (self.tables.positions() if self.tables else {}) | (self.views.positions() if self.views else {})
        )

    def check(self, ranges: list[Range]) -> None:
        if self.tables:
            self.tables.check(ranges)

    @contextmanager
    def read(
        self,
        spark: SparkSession,
        ranges: list[Range],
        schemas: dict[str, StructType],
        taken: dict[tuple[str, str], int],
    ) -> Iterator[StepInput]:
        """The step's input from each kind of source, its ranges and handles to each."""
        kinds = (
            (self.kafka, self.kafka.topics if self.kafka else {}, lambda s: not (is_table(s) or is_view(s))),
            (self.tables, self.tables.tables if self.tables else {}, is_table),
            (self.views, self.views.views if self.views else {}, is_view),
        )
        with ExitStack() as reads:
            read = [
                reads.enter_context(
                    source.read(
                        spark,
                        [r for r in ranges if its(r.source)],
                        {h: s for h, s in schemas.items() if h in handles},
                        taken,
                    )
                )
                for source, handles, its in kinds
                if source is not None
            ]
            found = [r for r in read if r.dead_letters is not None]
            yield StepInput(
                {h: df for r in read for h, df in r.inputs.items()},
                *((found[0].dead_letters, found[0].taken) if found else (None, None)),
                rest=next((r.rest for r in read if r.rest), None),  # the Kafka topics' alone
            )
