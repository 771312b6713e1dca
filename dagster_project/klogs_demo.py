"""``dbsp klogs-demo``: the KLogs paper's word count through Dagster on the embedded default.

Produces the KLogs paper's four messages to two keyed logs (fresh topics per demo), ticks the
offset sensor after each message (a step per message) or once after all of them (one
step), and runs each requested step through Dagster; the pipeline's sink prints a JSON
line per total, in the order the messages were produced either way: each is produced
with an explicit timestamp, one millisecond at least after the one before, and a step
orders its messages by timestamp (see :mod:`circuits.klogs`).
"""

from __future__ import annotations

import time
import uuid

from dagster import DagsterInstance, build_sensor_context

from circuits.klogs import DEAD_LETTERS, KLog, KLogs
from circuits.library.klogs_wordcount import LOWER, SEED_MESSAGES, UPPER
from sensors.broker import ensure_topics
from storage import location

from .config import PipelineSpec, ProjectSpec
from .factory import build_definitions

NAME = "klogs_word_count"
SINK = "sink_3"  # the pipeline's third stage: merge is no stage; partition, loop, sink are


def demo_project(project: ProjectSpec, run: str) -> ProjectSpec:
    """The word-count pipeline on ``project``'s resources, reading topics of its own (suffixed ``run``)."""
    spec = PipelineSpec(
        name=NAME,
        circuit="circuits.library.klogs_wordcount:word_count_klogs",
        sources={UPPER: f"{UPPER}.{run}", LOWER: f"{LOWER}.{run}"},
        sinks=[{"name": SINK, "current": False}, {"name": DEAD_LETTERS, "current": False}],
        max_records_per_step=len(SEED_MESSAGES),
        max_wait_seconds=0,
        sensor_running=False,
        lease_wait_seconds=30,
        # The demo ticks the sensor itself: a failed step is requested again at its next tick.
        retry_backoff_seconds=0,
    )
    return project.model_copy(update={"pipelines": [spec], "sources": []})  # its resources, and their file


class Demo:
    """The demo pipeline's Dagster definitions, and a producer to its logs."""

    def __init__(self, project: ProjectSpec, instance: DagsterInstance) -> None:
        self.defs = build_definitions(project)
        self.spec = project.pipelines[0]
        self.instance = instance
        self.source = self.defs.resources["kafka"].topics(self.spec)
        ensure_topics(
            self.source.bootstrap_servers, {t: self.spec.topic_partitions for t in self.source.topics.values()}
        )
        self.root = self.defs.resources["store"].pipeline_root(NAME)
        client = self.source.client()
        self.last_timestamp = 0

        def send(topic: str, key: bytes, value: bytes) -> None:
            # Explicit, increasing timestamps: messages produced within one millisecond
            # would otherwise be ordered by (log, partition, offset) in a step, not as produced.
            self.last_timestamp = max(int(time.time() * 1000), self.last_timestamp + 1)
            client.produce(self.source.topics[topic], [value], keys=[key], timestamps=[self.last_timestamp])

        self.klogs = KLogs(send)

    def produce(self, messages) -> None:
        for log, key, value in messages:
            self.klogs.produce(KLog.named(log), key, value)

    def advance(self) -> list:
        """A sensor tick, then a Dagster run of each step it requests; their outcomes."""
        result = self.defs.resolve_sensor_def(self.spec.sensor_name)(
            build_sensor_context(instance=self.instance, resources=self.defs.resources)
        )
        for request in result.dynamic_partitions_requests or []:
            self.instance.add_dynamic_partitions(request.partitions_def_name, request.partition_keys)
        job = self.defs.resolve_job_def(f"{NAME}_step_job")
        return [
            job.execute_in_process(
                partition_key=r.partition_key, instance=self.instance, tags=r.tags, raise_on_error=False
            )
            for r in result.run_requests or []
        ]


def run_klogs_demo(project: ProjectSpec, one_step: bool, instance: DagsterInstance) -> bool:
    """Runs the KLogs paper's messages in one step or one per step; whether every run succeeded."""
    demo = Demo(demo_project(project, uuid.uuid4().hex[:8]), instance)
    location.remove_tree(demo.root)  # a demo starts over, as its topics do
    outcomes = []
    for batch in [SEED_MESSAGES] if one_step else [[m] for m in SEED_MESSAGES]:
        demo.produce(batch)
        outcomes += demo.advance()
    return bool(outcomes) and all(o.success for o in outcomes)
