"""The main job on the embedded local default, end to end through Dagster.

Starts the bundled broker, produces Nexmark events to its topics, ticks the Kafka offset
sensor (which records each step's division in Delta and adds the step partition), runs
each requested step through Dagster on local Spark, and finally checks the maintained q4,
read back from its output Delta table, against Spark batch SQL over the input log.
"""

import shutil
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from dagster import DagsterInstance, build_sensor_context
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from circuits.library.nexmark_queries import RECOMPUTE_SQL
from circuits.zset import WEIGHT
from storage.logs import STEP, read_steps
from storage.pipeline import Pipeline, status

from .config import PipelineSpec, ProjectSpec, load_object
from .factory import build_definitions, produce_events


@dataclass
class DemoResult:
    steps: list[int]
    q4: Counter
    q4_matches: bool
    step_seconds: list[float] = field(default_factory=list)


def run_demo(
    project: ProjectSpec, steps: int, events_per_step: int, seed: int, reset: bool, log: Callable[[str], None]
) -> DemoResult:
    """Produces ``steps`` batches of events; each becomes one step run through Dagster."""
    base = project.pipelines[0]
    # One step per batch: cut as soon as a batch is there.
    spec = PipelineSpec(**{**base.model_dump(), "max_records_per_step": events_per_step, "max_wait_seconds": 0})
    project = ProjectSpec(pipelines=[spec], resources=project.resources)
    defs = build_definitions(project)
    instance = DagsterInstance.get()
    resources = defs.resources
    store, kafka, spark = resources["store"], resources["kafka"], resources["spark"]
    root = store.pipeline_root(spec.name)
    if reset:
        shutil.rmtree(root, ignore_errors=True)
    sensor = defs.resolve_sensor_def(f"{spec.name}_kafka_offsets")
    step_job = defs.resolve_job_def(f"{spec.name}_step_job")
    source = kafka.source(spec)
    log(f"broker {source.bootstrap_servers}, topics {sorted(source.topics.values())}, state under {root}")
    ran, seconds = [], []
    for _ in range(steps):
        start = produce_events(source, load_object(spec.producer), events_per_step, seed)
        result = sensor(build_sensor_context(instance=instance, resources=resources))
        for request in result.dynamic_partitions_requests or []:
            instance.add_dynamic_partitions(request.partitions_def_name, request.partition_keys)
        for request in result.run_requests or []:
            started = time.perf_counter()
            outcome = step_job.execute_in_process(partition_key=request.partition_key, instance=instance, tags=request.tags)
            seconds.append(time.perf_counter() - started)
            ran.append(int(request.partition_key))
            log(f"step {request.partition_key}: events {start}..{start + events_per_step} -> run {outcome.run_id[:8]} "
                f"{'succeeded' if outcome.success else 'FAILED'} ({seconds[-1]:.1f} s)")
    pipeline = Pipeline(spark.session(), root, spec.circuit_def, workers=spec.workers)
    return _check_q4(pipeline, ran, seconds)


def _check_q4(pipeline: Pipeline, ran: list[int], seconds: list[float]) -> DemoResult:
    """q4 integrated from its output log against Spark SQL over the integrated input log."""
    last = status(pipeline.root).committed_step - 1
    spark = pipeline.spark
    for handle in pipeline.circuit.inputs:
        integral(read_steps(spark, pipeline.inputs.uri(handle), 0, last)).createOrReplaceTempView(handle)
    recomputed = Counter(tuple(r) for r in spark.sql(RECOMPUTE_SQL["q4"]).collect())
    maintained = Counter(tuple(r) for r in integral(pipeline.outputs.read("q4", 0, last)).collect())
    return DemoResult(ran, maintained, _rounded(maintained) == _rounded(recomputed), seconds)


def integral(changes: DataFrame) -> DataFrame:
    """The bag a change log adds up to: each row repeated by its summed weight."""
    columns = [c for c in changes.columns if c not in (WEIGHT, STEP)]
    summed = changes.groupBy(*columns).agg(F.sum(WEIGHT).alias(WEIGHT)).where(F.col(WEIGHT) > 0)
    return summed.withColumn("_copy", F.explode(F.sequence(F.lit(1), F.col(WEIGHT)))).select(*columns)


def _rounded(z: Counter) -> Counter:
    return Counter({tuple(round(v, 6) if isinstance(v, float) else v for v in row): w for row, w in z.items()})
