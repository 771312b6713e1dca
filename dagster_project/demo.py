"""The main job on the embedded local default, end to end through Dagster.

Starts the embedded broker, produces Nexmark events to its topics, ticks the Kafka offset
sensor (which records each step's division in Delta and adds the step partition), runs
each requested step through Dagster on local Spark, and finally checks each maintained
view, read back from its output Delta table, against Spark batch SQL of the view's own
text (the pipeline's ``sql:`` file, else the demo's ``nexmark.sql``) over the input log.
"""

import os
import re
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field

import pyarrow.compute as pc
from dagster import DagsterInstance, EventLogEntry, build_sensor_context
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from circuits.daemon import listening
from circuits.errors import DbspError
from circuits.library.nexmark import KEYS, NexmarkGenerator, nexmark_changes
from circuits.library.nexmark_queries import NEXMARK_SQL
from circuits.sql import batch_views
from circuits.sql.parse import ddl_columns
from circuits.zset import WEIGHT
from sensors.delta_source import open_table, table_path
from storage import location
from storage.delta import add_actions
from storage.logs import STEP, DivisionLog
from storage.pipeline import Pipeline, status

from .config import DELTA, NEXMARK_PRODUCER, ConfigError, PipelineSpec, ProjectSpec, load_object
from .console import Progress
from .demo_producer import create_change_fed, merge_changes, produce_events
from .devserver import open_instance
from .factory import build_definitions
from .kafka import EMBEDDED
from .metadata import step_figures
from .status import dead_letters_note
from .store import store_settings

# The engine's phases (the step materialization's ``seconds/<phase>`` metadata), as shown.
PHASES = {
    "ingest": "ingest",
    "read": "read",
    "compute_and_write": "compute",
    "output_commit": "output",
    "checkpoint_commit": "checkpoint",
}
# What a step run is doing, by the Dagster event that starts it.
RUN_PHASES = {
    "RUN_START": "starting the run",
    "RESOURCE_INIT_STARTED": "opening Spark, the store and Kafka",
    "STEP_START": "running the circuit",
    "ASSET_MATERIALIZATION": "recording the outputs",
    "ASSET_CHECK_EVALUATION": "checking the outputs",
}


@dataclass
class StepReport:
    """One step run, from the metadata its materializations and checks recorded."""

    step: int
    events: tuple[int, int]
    succeeded: bool
    seconds: float
    rows_in: int = 0
    rows_out: int = 0
    phases: dict[str, float] = field(default_factory=dict)
    checks_passed: int = 0
    checks: int = 0
    error: str = ""

    def add(self, metadata: dict) -> None:
        """Takes in a sink's materialization metadata (values, not Dagster's wrappers): every
        sink's carries the step's shared metadata (rows in, phase seconds) and its own ``rows_out``."""
        self.rows_out += metadata.get("rows_out", 0)
        self.rows_in, self.phases = step_figures(metadata)

    def line(self) -> str:
        if not self.succeeded:
            return f"step {self.step} FAILED after {self.seconds:.1f} s: {self.error}"
        phases = " ".join(f"{PHASES.get(k, k)} {v:.1f}" for k, v in self.phases.items() if v >= 0.05)
        return (
            f"step {self.step}: events {self.events[0]}..{self.events[1]}, rows {self.rows_in} in / "
            f"{self.rows_out} out, {self.seconds:.1f} s ({phases})"
        )


@dataclass
class DemoResult:
    steps: list[StepReport]
    q4: Counter  # empty if the pipeline has no q4
    matches: dict[str, bool] | None  # per view; None: not checked (a step failed)
    dead_letters: list[str] = field(default_factory=list)  # their count, where to read them, inputs with too many

    @property
    def checks(self) -> tuple[int, int]:
        """Asset checks passed, and run, over every step."""
        return sum(s.checks_passed for s in self.steps), sum(s.checks for s in self.steps)

    @property
    def failed_step(self) -> StepReport | None:
        return next((s for s in self.steps if not s.succeeded), None)

    @property
    def too_many_dead_letters(self) -> bool:
        return any(line.startswith("too many dead letters") for line in self.dead_letters)

    @property
    def succeeded(self) -> bool:
        return (
            bool(self.steps)
            and bool(self.matches)
            and all(self.matches.values())
            and self.failed_step is None
            and not self.too_many_dead_letters
        )


def run_demo(
    project: ProjectSpec,
    steps: int,
    events_per_step: int,
    seed: int,
    reset: bool,
    progress: Progress,
    sql: str | None = None,
    source: str = "kafka",
) -> DemoResult:
    """Feeds ``steps`` batches of events; each becomes one step run through Dagster.
    ``sql``: a file of views over the demo's inputs, run instead of the pipeline's
    definition.  ``source``: ``kafka``, events produced to the pipeline's topics, or
    ``delta``, each batch merged into a Delta table per input by Spark."""
    base = project.pipelines[0].model_dump()
    if sql is not None:
        base.update(sql=os.path.abspath(sql), circuit=None, sinks=[], bags=[])
    tables = f"{store_settings(project).pipeline_root(base['name'])}_sources"
    if source == "delta":
        base.update(sources={h: f"{DELTA}{tables}/{h}" for h in base["sources"]})
    # One step per batch: cut as soon as a batch is there (in a table: its MERGE, and its creation first).
    per_step = 2 * len(base["sources"]) if source == "delta" else events_per_step
    spec = PipelineSpec(**{**base, "max_records_per_step": per_step, "max_wait_seconds": 0})
    project = project.model_copy(update={"pipelines": [spec], "sources": []})  # its resources, and their file
    defs = build_definitions(project)
    instance = open_instance()
    resources = defs.resources
    store, kafka, spark = resources["store"], resources["kafka"], resources["spark"]
    root = store.pipeline_root(spec.name)
    if reset:
        location.remove_tree(root)
        location.remove_tree(tables)
    sensor = defs.resolve_sensor_def(spec.sensor_name)
    step_job = defs.resolve_job_def(f"{spec.name}_step_job")
    if source == "kafka":
        with progress.phase(_kafka_phase(kafka)):
            feed = KafkaFeed(kafka.topics(spec), load_object(spec.producer), root)
        progress.line(
            f"broker {feed.source.bootstrap_servers}, topics {', '.join(sorted(feed.source.topics.values()))}"
        )
    with progress.phase(_spark_phase(spark)):
        session = spark.session()
    if source == "delta":
        with progress.phase("creating the input tables"):
            feed = DeltaFeed(session, spec)
        progress.line(f"input tables under {tables}, each batch one MERGE by Spark")
    with progress.phase("compiling the pipeline's circuit"):
        spec.circuit_for(session)  # a SQL view Spark cannot analyse fails here, before anything is fed or divided
    progress.line(f"state under {root}")
    reports = []
    for _ in range(steps):
        if not all(r.succeeded for r in reports):
            break  # the later steps would fail too: a step runs only after its predecessor
        with progress.phase(f"{feed.verb} {events_per_step} events"):
            feed.feed(events_per_step, seed)
        with progress.phase("sensor tick: recording the next step's division"):
            result = sensor(build_sensor_context(instance=instance, resources=resources))
        for request in result.dynamic_partitions_requests or []:
            instance.add_dynamic_partitions(request.partitions_def_name, request.partition_keys)
        for request in result.run_requests or []:
            report = _run_step(step_job, instance, request, feed.events(int(request.partition_key)), progress)
            progress.line(report.line())
            reports.append(report)
    dead_letters = dead_letters_note(root, spec.sources, spec.max_dead_letter_share)
    if not all(r.succeeded for r in reports):  # the server may be gone with the step: nothing to check
        return DemoResult(reports, Counter(), None, dead_letters)
    with progress.phase(f"checking each view against Spark batch SQL over {feed.oracle}"):
        pipeline = Pipeline(session, root, spec.circuit_for(session), workers=spec.workers)
        return _check_views(pipeline, spec, feed, reports, dead_letters)


class KafkaFeed:
    """The demo's events produced to the pipeline's topics; the oracle's inputs are the
    integrated input log (what the steps decoded)."""

    verb, oracle = "producing", "the input log"

    def __init__(self, source, records_of, root: str):
        self.source, self.records_of, self.root = source, records_of, root

    def feed(self, events: int, seed: int) -> None:
        produce_events(self.source, self.records_of, events, seed)

    def events(self, step: int) -> tuple[int, int]:
        return events_of(self.root, step)

    def inputs(self, pipeline: Pipeline, last: int) -> dict[str, DataFrame]:
        return {h: integral(pipeline.inputs.admitted(h, 0, last)) for h in pipeline.circuit.inputs}


class DeltaFeed:
    """The Nexmark demo's changes merged into a Delta table per input (one ``MERGE`` each
    per batch: new events inserted, earlier rows updated and deleted); the oracle's inputs
    are the tables as of the last step's versions."""

    verb, oracle = "merging", "the tables as of the last step's versions"

    def __init__(self, spark, spec: PipelineSpec):
        if spec.producer != NEXMARK_PRODUCER:
            raise ConfigError(
                f"pipeline {spec.name!r}: --source delta feeds the built-in Nexmark inputs "
                f"(producer: {NEXMARK_PRODUCER}); write your own tables with Spark and run `dbsp step`"
            )
        self.spark, self.spec = spark, spec
        self.schemas = spec.input_schemas()
        self.batch = (0, 0)
        for handle, ddl in self.schemas.items():
            create_change_fed(spark, table_path(spec.sources[handle]), ddl)

    def feed(self, events: int, seed: int) -> None:
        # The sequence goes on after the latest event in the tables (never changed later: see
        # nexmark_changes), found in the data files' statistics: no Spark job.
        files = [add_actions(open_table(self.spec.sources[h])) for h in self.schemas]
        times = [pc.max(f.column("max.date_time")).as_py() for f in files if f.num_rows]
        start = NexmarkGenerator(seed).index(max(times)) + 1 if times else 0
        for handle, changes in nexmark_changes(start, events, seed).items():
            merge_changes(
                self.spark, table_path(self.spec.sources[handle]), self.schemas[handle], KEYS[handle], changes
            )
        self.batch = (start, start + events)

    def events(self, step: int) -> tuple[int, int]:
        return self.batch

    def inputs(self, pipeline: Pipeline, last: int) -> dict[str, DataFrame]:
        versions = {r.source: r.end - 1 for ranges in DivisionLog(pipeline.root).all().values() for r in ranges}
        return {
            h: self._table(h, versions[self.spec.sources[h]]).select(*ddl_columns(self.schemas[h]))
            for h in self.schemas
        }

    def _table(self, handle: str, version: int) -> DataFrame:
        path = location.spark_path(table_path(self.spec.sources[handle]))
        return self.spark.read.format("delta").option("versionAsOf", version).load(path)


def events_of(root: str, step: int) -> tuple[int, int]:
    """The demo events of ``step``: the records of every step before it, up to its own."""
    counts = {s: sum(r.end - r.start for r in ranges) for s, ranges in DivisionLog(root).all().items()}
    first = sum(n for s, n in counts.items() if s < step)
    return first, first + counts.get(step, 0)


def _kafka_phase(kafka) -> str:
    if kafka.bootstrap_servers != EMBEDDED:
        return f"Kafka: connecting to {kafka.bootstrap_servers}"
    return _embedded_phase("Kafka broker", kafka.embedded_port)


def _spark_phase(spark) -> str:
    if spark.master:
        return f"Spark: starting a classic session on {spark.master}"
    if spark.remote != EMBEDDED:
        return f"Spark: connecting to {spark.remote}"
    return _embedded_phase("Spark Connect server", spark.embedded_port)


def _embedded_phase(what: str, port: int) -> str:
    # A daemon that already listens is reused; only a cold start takes long.
    return f"{what}: {'connecting to the running one' if listening(port) else 'starting it'} on port {port}"


def _run_step(step_job, instance: DagsterInstance, request, events: tuple[int, int], progress: Progress) -> StepReport:
    """Runs one step through Dagster, showing the run's phase live, and reports it."""
    step = int(request.partition_key)
    run_id = str(uuid.uuid4())  # known before the run starts, to follow its events
    label = f"step {step}"

    def follow(entry: EventLogEntry) -> None:
        kind = entry.dagster_event_type.value if entry.dagster_event_type else None
        if kind in RUN_PHASES:
            progress.update(f"{label}: {RUN_PHASES[kind]}")

    # Dagster calls the listener in this thread for each event the run stores.
    instance.add_event_listener(run_id, follow)
    with progress.phase(f"{label}: queued"):
        started = time.perf_counter()
        outcome = step_job.execute_in_process(
            partition_key=request.partition_key,
            instance=instance,
            tags=request.tags,
            run_id=run_id,
            raise_on_error=False,
        )
        seconds = time.perf_counter() - started
    return step_report(step, events, outcome, seconds)


def step_report(step: int, events: tuple[int, int], outcome, seconds: float) -> StepReport:
    """A step's line from what its run recorded: every sink's materialization carries the
    step's shared metadata (rows in, phase seconds) and its own ``rows_out``."""
    report = StepReport(step, events, outcome.success, seconds)
    for event in outcome.get_asset_materialization_events():
        report.add({k: v.value for k, v in event.step_materialization_data.materialization.metadata.items()})
    failures = [e for e in outcome.all_events if e.is_step_failure]
    if failures:
        report.error = cause(failures[0].step_failure_data.error)
    evaluations = outcome.get_asset_check_evaluations()
    report.checks, report.checks_passed = len(evaluations), sum(e.passed for e in evaluations)
    return report


def cause(error, lines: int = 3) -> str:
    """What failed, from a Dagster error: its wrapper ("Error occurred while executing op")
    says nothing, so the first of its causes that is the project's own error, else the
    innermost one; its first ``lines`` (the whole traceback is in the run's events)."""
    chain = []
    while error is not None:
        chain.append(error)
        error = error.cause or error.context
    own = _names(DbspError)
    found = next((e for e in chain if e.cls_name in own), chain[-1])
    text = "\n  ".join(found.message.strip().splitlines()[:lines])
    # The message starts with the error's (qualified) type: the project's errors say what to do without it.
    return re.sub(rf"^[\w.]*\b{found.cls_name}: ", "", text) if found.cls_name in own else text


def _names(cls: type) -> set[str]:
    return {cls.__name__, *(name for sub in cls.__subclasses__() for name in _names(sub))}


def _check_views(
    pipeline: Pipeline, spec: PipelineSpec, feed, reports: list[StepReport], dead_letters: list[str]
) -> DemoResult:
    """Each sink integrated from its output log against Spark batch SQL of the same view's
    text over the feed's inputs as of the last step."""
    last = status(pipeline.root).committed_step - 1
    spark = pipeline.spark
    inputs = feed.inputs(pipeline, last)
    sql = spec.sql or str(NEXMARK_SQL)
    recomputed = batch_views(spark, open(sql).read(), inputs, sql)
    maintained = {
        name: Counter(tuple(r) for r in integral(pipeline.outputs.read(name, 0, last)).collect())
        for name in spec.sink_names
        if name in recomputed
    }
    matches = {
        name: _rounded(rows) == _rounded(Counter(tuple(r) for r in recomputed[name].collect()))
        for name, rows in maintained.items()
    }
    return DemoResult(reports, maintained.get("q4", Counter()), matches, dead_letters)


def integral(changes: DataFrame) -> DataFrame:
    """The bag a change log adds up to: each row repeated by its summed weight."""
    columns = [c for c in changes.columns if c not in (WEIGHT, STEP)]
    summed = changes.groupBy(*columns).agg(F.sum(WEIGHT).alias(WEIGHT)).where(F.col(WEIGHT) > 0)
    return summed.withColumn("_copy", F.explode(F.sequence(F.lit(1), F.col(WEIGHT)))).select(*columns)


def _rounded(z: Counter) -> Counter:
    return Counter({tuple(round(v, 6) if isinstance(v, float) else v for v in row): w for row, w in z.items()})
