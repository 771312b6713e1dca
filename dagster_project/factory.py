"""Dagster definitions for one pipeline: its step partitions, its outputs as one
multi-asset, the Kafka offset sensor, and its maintenance jobs."""

import json
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from dagster import (
    AllPartitionMapping,
    AssetCheckResult,
    AssetCheckSpec,
    AssetDep,
    AssetExecutionContext,
    AssetKey,
    AssetMaterialization,
    AssetSpec,
    BackfillPolicy,
    Config,
    DagsterRunStatus,
    DefaultSensorStatus,
    Definitions,
    DynamicPartitionsDefinition,
    MaterializeResult,
    MetadataValue,
    OpExecutionContext,
    RunRequest,
    RunsFilter,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    asset,
    define_asset_job,
    in_process_executor,
    job,
    multi_asset,
    op,
    sensor,
)
from dagster._core.storage.tags import PARTITION_NAME_TAG
from deltalake import DeltaTable

from gateway.control import call, require_running
from sensors.division import DivisionPolicy, cut_next
from sensors.errors import SourceError
from sensors.status import report
from storage import inspect, views
from storage.gateway_figures import record_figures, record_unflushed
from storage.lease import Holder
from storage.logs import DivisionLog, output_uri
from storage.pipeline import Pipeline, status

from .config import PipelineSpec, ProjectSpec, home, load_object, upstream_view
from .demo_producer import produce_events
from .metadata import flush_gateway, step_metadata, view_metadata
from .resources import KafkaResource, SparkResource, StoreResource, build_resources
from .run_coordinator import PIPELINE_TAG
from .status import DeadLetterRate, dead_letter_rates, status_text

CHECK = "well_formed"
"""The asset check of every view: its step's changes are consolidated and, unless the view
is a bag, the view is a set."""


def step_key(step: int) -> str:
    return f"{step:010d}"


def build_definitions(project: ProjectSpec) -> Definitions:
    """Every pipeline of ``project``, with the project's resources."""
    gateway = [Definitions(jobs=[_gateway_rescale_job()])] if project.sources else []
    gateway_topics = frozenset(group.topic for group in project.sources)
    return Definitions.merge(
        *(build_pipeline(spec, gateway_topics) for spec in project.pipelines),
        *gateway,
        # The implicit asset job (a backfill's, the UI's "Materialize") runs in the run's own
        # process too, not in a new process per step as Dagster's default executor would.
        Definitions(resources=build_resources(project), executor=in_process_executor),
    )


class GatewayRescaleConfig(Config):
    workers: int


def _gateway_rescale_job():
    """Moves the running gateway's sources to ``workers`` I/O threads (ICADD, while they run)."""

    @op(name="rescale_gateway")
    def rescale(context: OpExecutionContext, config: GatewayRescaleConfig):
        figures = call(require_running(home("gateway")), f"/rescale?workers={config.workers}", timeout=600)
        context.log.info(f"gateway: {json.dumps(figures['rescale'])}")
        context.add_output_metadata({"workers": MetadataValue.json(figures["workers"])})

    return _one_op_job("gateway_rescale", rescale, {})


def build_pipeline(spec: PipelineSpec, gateway_topics: frozenset[str] = frozenset()) -> Definitions:
    """Everything Dagster needs to run ``spec``: assets, checks, sensor and jobs.
    ``gateway_topics``: the topics the project's source gateway writes to."""
    partitions = DynamicPartitionsDefinition(name=f"{spec.name}_steps")
    steps = _step_assets(spec, partitions)
    # One op per job: the run's own process executes it (the default executor would start
    # another process per run, and pay the imports and the Spark session twice).
    step_job = define_asset_job(
        f"{spec.name}_step_job",
        selection=[steps],
        partitions_def=partitions,
        tags={PIPELINE_TAG: spec.name},
        executor_def=in_process_executor,
    )
    layout = _layout_asset(spec)
    rescale_job = define_asset_job(
        f"{spec.name}_rescale", selection=[layout], tags={PIPELINE_TAG: spec.name}, executor_def=in_process_executor
    )
    jobs = [step_job, rescale_job, *_maintenance_jobs(spec)]
    fed = bool(gateway_topics & set(spec.topics.values()))
    return Definitions(assets=[steps, layout], jobs=jobs, sensors=[_offset_sensor(spec, partitions, step_job, fed)])


def open_pipeline(spec: PipelineSpec, spark: SparkResource, store: StoreResource) -> Pipeline:
    session = spark.session()
    return Pipeline(
        session,
        store.pipeline_root(spec.name),
        spec.circuit_for(session),
        workers=spec.workers,
        views=spec.views,
        catalog=spec.name,
    )


_kept: dict[tuple, tuple] | None = None
"""The step runs' pipelines this process keeps open between runs (None: it keeps none);
by (spec, root, session), each with the spec and session that key it, so their ids
are not reused while kept."""


def keep_pipelines_open() -> None:
    """Makes this process (the resident step worker) keep each pipeline a step run opens for
    its next step run: its circuit, and its state's open tables, which the next run checks
    against the latest checkpoint (:meth:`storage.pipeline.Pipeline.open`) rather than
    opening again.  Runs of one pipeline are one at a time (its lease), so they never share
    the pipeline at once."""
    global _kept
    _kept = {}


@contextmanager
def step_pipeline(spec: PipelineSpec, spark: SparkResource, store: StoreResource) -> Iterator[Pipeline]:
    """The pipeline for a step run: a new one, or the one kept open (:func:`keep_pipelines_open`).
    A run that fails lets its kept pipeline go: the next run starts from a new one."""
    if _kept is None:
        yield open_pipeline(spec, spark, store)
        return
    session, root = spark.session(), store.pipeline_root(spec.name)
    key = (id(spec), root, id(session))
    if key not in _kept:
        _kept[key] = (spec, session, open_pipeline(spec, spark, store))
    pipeline = _kept[key][2]
    pipeline.timings.clear()  # the run's metadata shows this run's phases
    try:
        yield pipeline
    except BaseException:
        _kept.pop(key, None)
        raise


def _holder(context: OpExecutionContext, spec: PipelineSpec) -> Holder:
    """The run as its pipeline's lease holder: it waits ``lease_wait_seconds`` for another
    run, or less when the Dagster run holding the lease has ended."""

    def gone(run_id: str) -> bool:
        run = context.instance.get_run_by_id(run_id)
        return run is None or run.is_finished

    return Holder(context.run_id, spec.lease_wait_seconds, gone)


def _step_assets(spec: PipelineSpec, partitions: DynamicPartitionsDefinition):
    keys = {name: AssetKey([spec.name, name]) for name in spec.sink_names}
    checks = [
        AssetCheckSpec(CHECK, asset=key, description=_check_description(name not in spec.bags))
        for name, key in keys.items()
    ]
    specs = [_sink_spec(spec, name, key, keys) for name, key in keys.items()]

    @multi_asset(
        name=f"{spec.name}_steps",
        specs=specs,
        check_specs=checks,
        partitions_def=partitions,
        backfill_policy=BackfillPolicy.single_run(),
        can_subset=False,
    )
    def steps(context: AssetExecutionContext, spark: SparkResource, store: StoreResource, kafka: KafkaResource):
        first, last = (int(k) for k in (context.partition_key_range.start, context.partition_key_range.end))
        with step_pipeline(spec, spark, store) as pipeline, pipeline.lease.held(_holder(context, spec)):
            context.log.info(f"{spec.name}: running steps {first}..{last}")
            ran = pipeline.run_steps(kafka.source(spec, store, spark, verify=True).read, first, last)
        context.log.info(
            f"{spec.name}: ran steps {list(ran)}"
            if ran
            else f"{spec.name}: steps {first}..{last} were committed already"
        )
        layout = pipeline.layout()
        if layout.workers != spec.workers:
            context.log.warning(
                f"{spec.name}: configured for {spec.workers} workers, but its state's layout has {layout.workers}; "
                f"materialize {spec.name}/layout with workers: {spec.workers} to change it"
            )
        yield from step_results(spec, pipeline, keys, first, last, ran)

    return steps


def step_results(
    spec: PipelineSpec, pipeline: Pipeline, keys: dict[str, AssetKey], first: int, last: int, ran: range
) -> Iterator[MaterializeResult | AssetCheckResult]:
    """What a step run reports of steps ``first..=last`` once they are committed: each sink's
    materialization (see :func:`sink_metadata`) and its check (see :func:`check_results`)."""
    current = views.views_at(pipeline.root, spec.views, last)
    for name, metadata in sink_metadata(spec, pipeline, first, last, ran, current).items():
        yield MaterializeResult(asset_key=keys[name], metadata=metadata)
    sets = {name: name not in spec.bags for name in keys}
    rates = dead_letter_rates(pipeline.root, spec.sources, first, last)
    loud = [r for r in rates if r.too_high(spec.max_dead_letter_share)]
    dead = {name: [r for r in loud if r.handle in spec.view_sources(name)] for name in keys}
    yield from check_results(keys, inspect.check_outputs(pipeline.outputs, sets, first, last, current), dead)


def sink_metadata(
    spec: PipelineSpec, pipeline: Pipeline, first: int, last: int, ran: range, current: dict[str, DeltaTable]
) -> dict[str, dict]:
    """Per sink, its materialization's metadata for steps ``first..=last``: the steps' own
    (:func:`~.metadata.step_metadata`), the rows the sink's changes have, and its view's
    (``current``: the views as of step ``last``, see :func:`storage.views.views_at`)."""
    shared = step_metadata(pipeline, first, last, ran)
    return {
        name: {
            **shared,
            "rows_out": MetadataValue.int(inspect.rows_of_steps(output_uri(pipeline.root, name), first, last)),
            **(view_metadata(pipeline.root, name, last, current.get(name)) if name in spec.views else {}),
        }
        for name in spec.sink_names
    }


def record_committed(instance, spec: PipelineSpec, pipeline: Pipeline, ran: range, by: str) -> dict[str, dict]:
    """Records steps ``ran`` (one checkpoint) that ``by`` committed outside the step assets
    (a command, a maintenance job) as materializations of every sink's step partition, so
    that Dagster shows them as materialized as it shows the steps its step runs committed.
    Returns the metadata recorded (see :func:`sink_metadata`; none when nothing ran)."""
    if not ran:
        return {}
    partitions = f"{spec.name}_steps"
    existing = set(instance.get_dynamic_partitions(partitions))
    instance.add_dynamic_partitions(partitions, [step_key(s) for s in ran if step_key(s) not in existing])
    last = ran.stop - 1
    metadata = sink_metadata(spec, pipeline, ran.start, last, ran, views.views_at(pipeline.root, spec.views, last))
    for step in ran:
        for name, values in metadata.items():
            instance.report_runless_asset_event(
                AssetMaterialization(
                    AssetKey([spec.name, name]),
                    partition=step_key(step),
                    metadata={**values, "committed_by": MetadataValue.text(by)},
                )
            )
    return metadata


def _check_description(is_set: bool) -> str:
    consolidated = "the step's changes have no duplicate rows and no zero weights (`bad_rows/consolidated`)"
    decoded = (
        "; and no input the view reads had all its records of the run dead-lettered, or more than "
        "`max_dead_letter_share` of them (`dead_letters/<input>`)"
    )
    if not is_set:
        return f"{consolidated}; the view is a bag (listed under `bags`): duplicate rows are allowed{decoded}"
    return f"{consolidated}, and the view so far has no duplicate and no negative rows (`bad_rows/is_a_set`){decoded}"


def check_results(
    keys: dict[str, AssetKey], bad: dict[tuple[str, str], int], dead: dict[str, list[DeadLetterRate]] | None = None
) -> list[AssetCheckResult]:
    """One result of :data:`CHECK` per view, from ``bad`` (bad rows by view and property,
    :func:`storage.inspect.check_outputs`) and ``dead`` (by view, the inputs it reads whose
    dead letters are too many): it passes when no property has a bad row and no input is
    in ``dead``, and shows each property's count and each such input's dead letters.
    Every check is planned and evaluated at each run, two events Dagster stores (several
    SQLite transactions): one per view, not one per property."""
    counts: dict[str, dict[str, int]] = {}
    for (name, prop), rows in bad.items():
        counts.setdefault(name, {})[prop] = rows
    results = []
    for name, props in counts.items():
        rates = (dead or {}).get(name, [])
        metadata = {f"bad_rows/{prop}": MetadataValue.int(rows) for prop, rows in props.items()}
        for r in rates:
            metadata[f"dead_letters/{r.handle}"] = MetadataValue.int(r.dead)
            metadata[f"dead_letter_reasons/{r.handle}"] = MetadataValue.text("\n".join(r.reasons))
        results.append(
            AssetCheckResult(
                asset_key=keys[name],
                check_name=CHECK,
                passed=not any(props.values()) and not rates,
                metadata=metadata,
                description="; ".join(r.text() for r in rates) or None,
            )
        )
    return results


def _sink_spec(spec: PipelineSpec, name: str, key: AssetKey, keys: dict[str, AssetKey]) -> AssetSpec:
    """A sink's asset; a SQL view's shows its query, and depends on the published views it
    reads (through temporary views too), so the asset graph draws the lineage between views."""
    description = f"Changes of view {name!r} of pipeline {spec.name!r}, one partition per step (Delta table)" + (
        f"; its current contents: the Delta table views/{name}." if name in spec.views else "."
    )
    sql = spec.view_sql(name)
    reads = [keys[v] for v in spec.view_reads(name) if v in keys] + [
        # A step of this pipeline reads a range of the upstream's steps, not the same step.
        AssetDep(AssetKey(list(upstream_view(spec.upstream[h]))), partition_mapping=AllPartitionMapping())
        for h in spec.view_sources(name)
        if h in spec.upstream
    ]
    metadata = {"sql": MetadataValue.md(f"```sql\n{sql}\n```"), "sql_file": MetadataValue.path(spec.sql)} if sql else {}
    if sql:
        description += f"\n\n```sql\n{sql}\n```"
    return AssetSpec(
        key, description=description, group_name=spec.name, kinds={"spark", "delta"}, deps=reads, metadata=metadata
    )


def _offset_sensor(spec: PipelineSpec, partitions: DynamicPartitionsDefinition, step_job, gateway_fed: bool):
    policy = DivisionPolicy(spec.max_records_per_step, spec.max_wait_seconds)

    @sensor(
        name=spec.sensor_name,
        job=step_job,
        minimum_interval_seconds=spec.sensor_interval_seconds,
        default_status=DefaultSensorStatus.RUNNING if spec.sensor_running else DefaultSensorStatus.STOPPED,
        description=f"Cuts the next step of {spec.name!r} from its topics' end offsets, its Delta tables' "
        "latest versions and its upstream pipelines' committed steps, and requests its run.",
    )
    def offsets(context: SensorEvaluationContext, store: StoreResource, kafka: KafkaResource, spark: SparkResource):
        return evaluate_sensor(
            spec, policy, partitions, context.instance, store, kafka, spark, gateway_fed, context.log
        )

    return offsets


def evaluate_sensor(
    spec,
    policy,
    partitions,
    instance,
    store: StoreResource,
    kafka: KafkaResource,
    spark: SparkResource,
    gateway_fed: bool = False,
    log: logging.Logger | None = None,
):
    """One tick.  The division log, not the cursor, is the truth: every divided step that is
    not committed is (re)requested with ``run_key`` = pipeline and step, which Dagster runs
    once; so a tick that died after recording a division loses nothing."""
    root = store.pipeline_root(spec.name)
    try:
        source = kafka.source(spec, store, spark)
        # Demand-based flush (docs/gateway.md): the gateway hands over its partly filled buffers now,
        # so the step about to be cut holds every record it has read.
        figures, unflushed = flush_gateway(gateway_fed)
        cut = cut_next(DivisionLog(root), source, policy)
    except SourceError as e:
        return SkipReason(f"{spec.name}: nothing recorded: {e}")
    if unflushed is not None and cut.step is not None:
        (log or logging.getLogger(__name__)).warning(
            f"{spec.name}: step {cut.step} was cut without the gateway's flush: {unflushed}. Records the gateway read "
            "but had not handed over go to a later step; none is lost or taken twice"
        )
        record_unflushed(root, cut.step, unflushed)
    if figures is not None and cut.step is not None:
        record_figures(root, cut.step, figures)
    position = status(root)
    existing = set(instance.get_dynamic_partitions(partitions.name))
    new = [step_key(s) for s in range(position.divided_step) if step_key(s) not in existing]
    attempts = [_attempt(spec, instance, s) for s in range(position.committed_step, position.divided_step)]
    retried = [a for a in attempts if a.failures]  # a run of theirs ended in failure
    for attempt in retried:
        (log or logging.getLogger(__name__)).warning(f"{spec.name}: {attempt.describe()}")
    requests = [a.request(spec) for a in attempts if a.wait == 0]
    waiting = [a.describe() for a in attempts if a.wait > 0]
    return SensorResult(
        run_requests=requests,
        skip_reason=None if requests else "; ".join(waiting) or cut.reason,
        dynamic_partitions_requests=[partitions.build_add_request(new)] if new else [],
        cursor=str(position.divided_step),
    )


FAILURES_TAG = "dbsp/failures"
"""A step run's tag: how many runs of its step failed before it."""


@dataclass(frozen=True)
class Attempt:
    """The next run of an uncommitted step.  ``ended``: runs of its partition that ended
    (each attempt has a run key of its own, ``<pipeline>:<step>`` then ``:retry<ended>``,
    since Dagster runs a run key once; a run in progress keeps the key it was requested
    with, and Dagster skips it); ``failures``: those that failed or were canceled; ``wait``:
    seconds left of the back-off after the last failure, ``retry_backoff_seconds`` doubled
    per failure up to ``retry_backoff_max_seconds`` (0: the run is due)."""

    step: int
    ended: int
    failures: int
    wait: float
    running: bool = False
    """Whether a run of the step is queued or in progress (requested again all the same: a
    run a tick created but did not launch is launched so)."""

    def request(self, spec: PipelineSpec) -> RunRequest:
        return RunRequest(
            run_key=f"{spec.name}:{step_key(self.step)}" + (f":retry{self.ended}" if self.ended else ""),
            partition_key=step_key(self.step),
            tags={PIPELINE_TAG: spec.name, FAILURES_TAG: str(self.failures)},
        )

    def describe(self) -> str:
        when = (
            "the next attempt is under way"
            if self.running
            else f"requesting it again in {self.wait:.0f} s"
            if self.wait > 0
            else "requesting it again now"
        )
        return f"step {self.step}: {self.failures} run(s) failed; {when} (attempt {self.failures + 1})"


FAILED = (DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED)


def _attempt(spec: PipelineSpec, instance, step: int) -> Attempt:
    runs = instance.get_run_records(
        RunsFilter(job_name=f"{spec.name}_step_job", tags={PARTITION_NAME_TAG: step_key(step)})
    )  # newest first
    ended = [r for r in runs if r.dagster_run.is_finished]
    failed = [r for r in ended if r.dagster_run.status in FAILED]
    if not failed or not runs[0].dagster_run.is_finished:
        return Attempt(step, len(ended), len(failed), 0.0, running=bool(runs) and not runs[0].dagster_run.is_finished)
    backoff = min(spec.retry_backoff_seconds * 2 ** (len(failed) - 1), spec.retry_backoff_max_seconds)
    return Attempt(step, len(ended), len(failed), max((failed[0].end_time or 0) + backoff - time.time(), 0.0))


class RescaleConfig(Config):
    """A layout change; a strategy or k left out keeps the current layout's (as ``dbsp rescale``)."""

    workers: int
    strategy: str | None = None  # "fixed" or "dynamic" (circuits.layouts checks it)
    k: float | None = None
    hot: bool = True


def _layout_asset(spec: PipelineSpec):
    @asset(
        key=AssetKey([spec.name, "layout"]),
        group_name=spec.name,
        description=f"Which worker owns which vnode of {spec.name!r}; materialize it to change the layout (rescale).",
    )
    def layout(context: AssetExecutionContext, config: RescaleConfig, spark: SparkResource, store: StoreResource):
        pipeline = open_pipeline(spec, spark, store)
        report = pipeline.rescale(
            config.workers, config.strategy, config.k, hot=config.hot, holder=_holder(context, spec)
        )
        context.log.info(f"{report.before.describe()} -> {report.after.describe()}")
        return MaterializeResult(
            metadata={
                "layout": report.after.describe(),
                "workers": MetadataValue.int(report.after.workers),
                "vnodes_moved": MetadataValue.int(report.vnodes_moved),
                "fraction_moved": MetadataValue.float(round(report.fraction_moved, 4)),
                "state_rows_rewritten": MetadataValue.int(report.rows_rewritten),
                "state_bytes_rewritten": MetadataValue.int(report.bytes_rewritten),
                "copy_seconds": MetadataValue.float(round(report.copy_seconds, 3)),
                "pause_seconds": MetadataValue.float(round(report.pause_seconds, 3)),
            }
        )

    return layout


class RecoverConfig(Config):
    break_lease: bool = False


class ProduceConfig(Config):
    events: int = 5_000
    seed: int = 0


def _maintenance_jobs(spec: PipelineSpec) -> list:
    @op(name=f"{spec.name}_compact_op")
    def compact(context: OpExecutionContext, spark: SparkResource, store: StoreResource):
        pipeline = open_pipeline(spec, spark, store)
        with pipeline.lease.held(_holder(context, spec)):
            for table, (before, after) in pipeline.compact().items():
                context.log.info(f"{table}: {before} -> {after} files")

    @op(name=f"{spec.name}_vacuum_op")
    def vacuum(context: OpExecutionContext, spark: SparkResource, store: StoreResource):
        pipeline = open_pipeline(spec, spark, store)
        with pipeline.lease.held(_holder(context, spec)):
            context.log.info(f"deleted {len(pipeline.vacuum())} files no checkpoint needs")

    @op(name=f"{spec.name}_recover_op")
    def recover(
        context: OpExecutionContext,
        config: RecoverConfig,
        spark: SparkResource,
        store: StoreResource,
        kafka: KafkaResource,
    ):
        pipeline = open_pipeline(spec, spark, store)
        holder = _holder(context, spec)
        recovery = pipeline.recover(kafka.source(spec, store, spark, verify=True).read, holder, config.break_lease)
        if config.break_lease:
            context.log.warning(f"broke the lease of {recovery.broken}")
        record_committed(context.instance, spec, pipeline, recovery.ran, f"run {holder.name}")
        context.log.info(f"recovered: ran steps {list(recovery.ran)}; next step {recovery.next_step}")

    @op(name=f"{spec.name}_status_op")
    def show_status(context: OpExecutionContext, store: StoreResource, kafka: KafkaResource, spark: SparkResource):
        context.log.info(status_text(report(store.pipeline_root(spec.name), kafka.source(spec, store, spark))))

    pipeline_tags = {PIPELINE_TAG: spec.name}
    jobs = [
        _one_op_job(f"{spec.name}_compact", compact, pipeline_tags),
        _one_op_job(f"{spec.name}_vacuum", vacuum, pipeline_tags),
        _one_op_job(f"{spec.name}_recover", recover, pipeline_tags),
        _one_op_job(f"{spec.name}_status", show_status, {}),
    ]
    if spec.producer is not None:
        records_of = load_object(spec.producer)

        @op(name=f"{spec.name}_produce_op")
        def produce(context: OpExecutionContext, config: ProduceConfig, kafka: KafkaResource):
            source = kafka.topics(spec)
            start = produce_events(source, records_of, config.events, config.seed)
            context.log.info(f"produced events {start}..{start + config.events} to {sorted(source.topics.values())}")

        jobs.append(_one_op_job(f"{spec.name}_produce", produce, {}))
    return jobs


def _one_op_job(name: str, the_op, tags: dict):
    @job(name=name, tags=tags, executor_def=in_process_executor)
    def one_op():
        the_op()

    return one_op
