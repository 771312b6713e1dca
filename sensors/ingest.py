"""A step's read of Kafka: :meth:`KafkaSource.read`, the reader a caller gives
:meth:`storage.pipeline.Pipeline.run_steps`, consumes each step's recorded ranges once on
the executors and decodes them.  The pipeline persists what it reads (and the records that could not be decoded) to the input
log; replays read the input log, never the broker again."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from pyspark.sql import SparkSession
from pyspark.sql.types import StructType

from storage.errors import StorageError
from storage.logs import Range
from storage.pipeline import StepInput

from .decode import read_failed, read_ranges
from .kafka import KafkaClient


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
        try:
            yield StepInput(
                {h: decoded.inputs[t] for h, t in self.topics.items() if t in read},
                *((decoded.dead_letters, decoded.taken) if read else (None, None)),
            )
        except StorageError as e:
            # The job failed before anything was committed: the step stays unpersisted.
            failed = read_failed(e)
            if failed is None:
                raise
            raise failed from e
        finally:
            decoded.unpersist()
