"""Running steps whose input comes from Kafka: read each step's recorded ranges once,
persist them (and the records that could not be decoded) to the input log, then advance
the pipeline.  Replays read the input log, never the broker again."""

from __future__ import annotations

from dataclasses import dataclass, field

from storage.errors import StepOrderError, StorageError
from storage.pipeline import Pipeline

from .decode import read_failed, read_ranges
from .kafka import KafkaClient


@dataclass(frozen=True)
class KafkaSource:
    """Where a pipeline's inputs come from: one topic per input handle."""

    bootstrap_servers: str
    topics: dict[str, str]
    config: dict[str, str] = field(default_factory=dict)
    read_timeout: float = 30.0
    """Seconds without a new record before the step's read fails (a limit on no progress)."""

    def client(self) -> KafkaClient:
        return KafkaClient(self.bootstrap_servers, self.config)


def ingest(pipeline: Pipeline, source: KafkaSource, step: int) -> None:
    """Persists ``step``'s input from its recorded ranges (a no-op when already persisted)."""
    if pipeline.inputs.persisted(step):
        return
    ranges = pipeline.divisions.get(step)
    if step >= pipeline.divisions.next_step():
        raise StepOrderError(f"step {step} has no recorded division yet: the sensor has not cut it")
    schemas = {source.topics[h]: s for h, s in pipeline.circuit.inputs.items()}
    decoded = read_ranges(
        pipeline.spark,
        source.bootstrap_servers,
        source.config,
        ranges,
        schemas,
        source.read_timeout,
        taken=pipeline.inputs.taken_before(step),
    )
    # A topic with no offsets in the step is an empty input, known so without reading.
    read = {r.source for r in ranges if r.end > r.start}
    try:
        inputs = {h: decoded.inputs[t] for h, t in source.topics.items() if t in read}
        dead_letters, taken = (decoded.dead_letters, decoded.taken) if read else (None, None)
        pipeline.inputs.persist(step, inputs, dead_letters, taken)
    except StorageError as e:
        # The job failed before anything was committed: the step stays unpersisted.
        failed = read_failed(e)
        if failed is None:
            raise
        raise failed from e
    finally:
        decoded.unpersist()


def run_steps(pipeline: Pipeline, source: KafkaSource, first: int, last: int) -> range:
    """Runs steps ``first..=last`` in order as one checkpoint and returns the steps it ran
    (empty when all were committed).  Refuses, naming it, a step whose predecessor is not
    committed."""
    steps = pipeline.pending(first, last)
    for step in steps:
        with pipeline.timed("ingest"):
            ingest(pipeline, source, step)
    if steps:
        pipeline.advance(through=last)
    return steps
