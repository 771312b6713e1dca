"""Fixed cost of a step: what an empty step and a one-row step cost, and what Dagster adds.

One durable pipeline (``revenue_circuit``: view ``bids_by_category``, ``--workers``
workers) is loaded in step 0 with ``--bids`` bids over ``--bids // 15`` auctions.  Then,
``--steps`` times (after ``--warmup`` unrecorded rounds), in turn:

* an empty step (``{}`` inputs) and a one-row step (one new bid), each run directly:
  ``Pipeline.submit`` then ``Pipeline.run``;
* a no-op run (``Pipeline.run`` with nothing pending: open the checkpoint, start and stop
  the worker);
* through Dagster (a temporary sqlite instance, a local Kafka node): one bid produced to
  Kafka, one sensor tick (which cuts the step), then the pipeline's step job executed in
  process for that step; and the step job again for that same, committed step (the
  Dagster no-op floor).  The sensor never cuts a step without records, so there is no
  empty step through Dagster.

The direct steps record zero-width offset ranges at the topics' ends as their division,
so the sensor's next cut starts where the Kafka topics stand, and both kinds of step
advance the same pipeline, on the same state.

Per kind, medians of: wall seconds; Spark jobs, stages run (and skipped), tasks run and
the time at least one job ran, read from the Spark UI's REST API for the jobs that
appeared during the step; Delta commits (new table versions) per kind of table; phase
seconds: ``Pipeline.timings`` plus ``submit`` (``rest``: the wall time outside them);
for a Dagster run, Dagster's own time before and after the asset, the step's
``seconds/*`` metadata, the rest of the asset body and the asset checks (from the run's
event log).  The Dagster overhead is the Dagster run's median wall time minus that of
the same step run directly.  Then the jobs (with the phase that started each) and the
commits of the median step of each kind, to show where they come from.

    python bench/fixed_cost.py --bids 100000 --steps 5
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import statistics
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from urllib.parse import urlparse

from common import auctions, bids
from dagster import DagsterEventType, DagsterInstance, build_sensor_context
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from circuits.library import revenue_circuit
from circuits.spark import local_session
from dagster_project.config import parse_project
from dagster_project.factory import build_definitions, step_key
from sensors.broker import LocalBroker, ensure_topics
from sensors.kafka import KafkaClient
from storage.delta import delta_tables
from storage.logs import Range
from storage.pipeline import Pipeline

NAME = "fixed"
PROJECT = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # stripped from call sites
KINDS = ("state", "outputs", "inputs", "checkpoint", "other")


@dataclass
class Sample:
    """What one step (or run) cost."""

    wall: float
    jobs: list[dict]  # the Spark REST API's job records
    commits: Counter  # table path (relative to the pipeline root) -> new versions
    phases: dict[str, float]
    extra: dict = field(default_factory=dict)

    def total(self, key: str) -> int:
        return sum(j[key] for j in self.jobs)

    def in_jobs(self) -> float:
        """Seconds during which at least one of the step's Spark jobs ran."""
        covered, end = 0.0, float("-inf")
        for start, stop in sorted(interval(j) for j in self.jobs):
            covered += max(stop - max(start, end), 0.0)
            end = max(end, stop)
        return covered

    def by_kind(self) -> dict[str, int]:
        kinds = Counter({kind: 0 for kind in KINDS})
        for path, n in self.commits.items():
            kinds[kind_of(path)] += n
        return kinds


def epoch(timestamp: str) -> float:
    """A Spark REST API time (``2026-01-01T12:00:00.000GMT``) in seconds since the epoch."""
    return (
        datetime.strptime(timestamp.removesuffix("GMT"), "%Y-%m-%dT%H:%M:%S.%f")
        .replace(tzinfo=timezone.utc)
        .timestamp()
    )


def interval(job: dict) -> tuple[float, float]:
    return epoch(job["submissionTime"]), epoch(job["completionTime"])


def kind_of(path: str) -> str:
    top = path.split(os.sep)[0]
    return {"state": "state", "outputs": "outputs", "inputs": "inputs", "_checkpoints": "checkpoint"}.get(top, "other")


def table_versions(root: str) -> dict[str, int]:
    return {os.path.relpath(uri, root): DeltaTable(uri).version() for uri in delta_tables(root)}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class TracedPipeline(Pipeline):
    """A pipeline that also records when each phase ran (to tell which phase started a
    Spark job), and times ``submit`` as a phase of its own."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.windows: list[tuple[str, float, float]] = []

    @contextlib.contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        started = time.time()
        try:
            with super().timed(phase):
                yield
        finally:
            self.windows.append((phase, started, time.time()))

    def submit(self, step: int, inputs: dict, ranges: list[Range]) -> None:
        with self.timed("submit"):
            super().submit(step, inputs, ranges)

    def phase_at(self, moment: float) -> str:
        """The innermost phase running at ``moment`` (seconds since the epoch)."""
        during = [(start, phase) for phase, start, stop in self.windows if start - 0.001 <= moment <= stop + 0.001]
        return max(during)[1] if during else "-"


class Observer:
    """Measures an action: its wall time, the Spark jobs and Delta commits it caused."""

    def __init__(self, spark: SparkSession, root: str) -> None:
        self.spark = spark
        self.root = root
        port = urlparse(spark.sparkContext.uiWebUrl).port  # Spark moves on when the port is taken
        self.url = f"http://localhost:{port}/api/v1/applications/{spark.sparkContext.applicationId}"

    def settle(self) -> None:
        """Waits until the UI has seen every event posted so far (jobs end before a step returns)."""
        try:
            self.spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty(30_000)
        except Exception:
            time.sleep(1.0)

    def jobs(self) -> list[dict]:
        with urllib.request.urlopen(f"{self.url}/jobs") as response:
            return json.load(response)

    def measure(
        self,
        action: Callable[[], dict | None],
        timings: Counter | None = None,
        phase_at: Callable[[float], str] | None = None,
    ) -> Sample:
        """Runs ``action``, which may return phase seconds; the growth of ``timings`` (a
        ``Pipeline.timings``) during the action are phases too; ``phase_at`` tells, after
        the action, which phase was running when a job started (``_phase``)."""
        self.settle()
        last_job = max((j["jobId"] for j in self.jobs()), default=-1)
        versions = table_versions(self.root)
        before = Counter(timings or {})
        started = time.perf_counter()
        phases = action() or {}
        wall = time.perf_counter() - started
        deadline = time.monotonic() + 30
        while True:  # the step is synchronous: its jobs have ended, the UI may lag behind
            self.settle()
            jobs = sorted((j for j in self.jobs() if j["jobId"] > last_job), key=lambda j: j["jobId"])
            running = [j["jobId"] for j in jobs if j["status"] == "RUNNING"]
            if not running:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"Spark jobs {running} are still listed as running 30 s after the step returned")
            time.sleep(0.2)
        after = table_versions(self.root)
        commits = Counter(
            {path: v - versions.get(path, -1) for path, v in after.items() if v != versions.get(path, -1)}
        )
        if timings is not None:
            phases = {**phases, **{k: v - before[k] for k, v in timings.items() if v - before[k] > 0}}
        for job in jobs:
            job["_phase"] = phase_at(interval(job)[0]) if phase_at else "-"
        phases["rest"] = wall - sum(phases.values())
        return Sample(wall, jobs, commits, phases)


@dataclass
class Dagster:
    """The pipeline served by Dagster against the local broker, as the tests set it up."""

    instance: DagsterInstance
    resources: dict
    sensor: object
    job: object
    client: KafkaClient
    topics: list[str]
    marks: dict[str, float] = field(default_factory=dict)  # the last run's milestones (seconds since the epoch)

    def tick(self) -> str:
        """One sensor evaluation (partitions added as the daemon would); the requested step."""
        result = self.sensor(build_sensor_context(instance=self.instance, resources=self.resources))
        if not getattr(result, "run_requests", None):
            raise RuntimeError(f"the sensor requested no run: {result}")
        for request in result.dynamic_partitions_requests or []:
            self.instance.add_dynamic_partitions(request.partitions_def_name, request.partition_keys)
        (request,) = result.run_requests
        return request.partition_key

    def run(self, partition_key: str) -> dict[str, float]:
        """Executes the step job for one step.  Returns its phases: Dagster's own until the
        asset starts, the step's ``seconds/*`` metadata, the rest of the asset body until its
        first materialization (lease, opening, metadata), the asset checks, and Dagster's own
        from the step's end until ``execute_in_process`` returns."""
        called = time.time()
        result = self.job.execute_in_process(
            partition_key=partition_key,
            instance=self.instance,
            run_config={"loggers": {"console": {"config": {"log_level": "WARNING"}}}},
        )
        returned = time.time()
        events = {}
        for entry in self.instance.all_logs(result.run_id):
            if entry.dagster_event is not None:
                events.setdefault(entry.dagster_event.event_type, entry.timestamp)
        started = events[DagsterEventType.STEP_START]
        materialized = events[DagsterEventType.ASSET_MATERIALIZATION]
        ended = events[DagsterEventType.STEP_SUCCESS]
        self.marks = {"asset": started, "checks": materialized, "dagster": ended}
        metadata = result.get_asset_materialization_events()[0].materialization.metadata
        step = {k.removeprefix("seconds/"): v.value for k, v in metadata.items() if k.startswith("seconds/")}
        return {
            "dagster before": started - called,
            **step,
            "lease+open+metadata": materialized - started - sum(step.values()),
            "asset checks": ended - materialized,
            "dagster after": returned - ended,
        }

    def phase_at(self, moment: float) -> str:
        """Which part of the last run was going on at ``moment``."""
        marks = self.marks
        if moment < marks["asset"] or moment >= marks["dagster"]:
            return "dagster"
        return "asset body" if moment < marks["checks"] else "asset checks"


def serve(args: argparse.Namespace, bootstrap: str) -> tuple[Dagster, str, object]:
    """The Dagster side: project, definitions, instance and topics; also the pipeline's
    root and its circuit (the one Dagster runs)."""
    settings = {
        "pipelines": [
            {
                "name": NAME,
                "circuit": "circuits.library.nexmark_queries:revenue_circuit",
                "sources": {h: f"{NAME}.{h}" for h in ("persons", "auctions", "bids")},
                "sinks": ["bids_by_category"],
                "workers": args.workers,
                "max_records_per_step": 100_000,
                "max_wait_seconds": 0,
                "sensor_running": False,
                "lease_wait_seconds": 0,
            }
        ],
        "resources": {"store": {"root": os.path.join(args.root, "store")}, "kafka": {"bootstrap_servers": bootstrap}},
    }
    project = parse_project(settings, "bench/fixed_cost.py")
    spec = project.pipelines[0]
    defs = build_definitions(project)
    topics = list(spec.sources.values())
    ensure_topics(bootstrap, {t: spec.topic_partitions for t in topics})
    home = os.path.join(args.root, "dagster_home")
    os.makedirs(home)
    instance = DagsterInstance.local_temp(home, overrides={"telemetry": {"enabled": False}})
    dagster = Dagster(
        instance,
        defs.resources,
        defs.resolve_sensor_def(spec.sensor_name),
        defs.resolve_job_def(f"{NAME}_step_job"),
        KafkaClient(bootstrap),
        topics,
    )
    return dagster, defs.resources["store"].pipeline_root(NAME), spec.circuit_def


def measure(spark: SparkSession, args: argparse.Namespace, bootstrap: str | None) -> dict[str, list[Sample]]:
    dagster, root, circuit = (
        serve(args, bootstrap) if bootstrap else (None, os.path.join(args.root, "store", NAME), revenue_circuit())
    )
    pipeline = TracedPipeline(spark, root, circuit, workers=args.workers)
    observer = Observer(spark, root)

    def division(step: int) -> list[Range]:
        if dagster is None:
            return [Range("bench", 0, step, step + 1)]
        # Zero-width ranges where the topics end: the sensor's next cut starts there.
        return [Range(t, p, high, high) for (t, p), (_, high) in dagster.client.offsets(dagster.topics).items()]

    def direct(step: int, inputs: dict) -> Callable[[], None]:
        ranges = division(step)

        def action() -> None:
            pipeline.submit(step, inputs, ranges)
            pipeline.run()

        return action

    auction_count = max(args.bids // 15, 1)
    started = time.perf_counter()
    direct(0, {"auctions": auctions(spark, auction_count), "bids": bids(spark, 0, args.bids, auction_count)})()
    print(
        f"step 0: {args.bids:,} bids over {auction_count:,} auctions loaded in {time.perf_counter() - started:.1f} s",
        flush=True,
    )

    rounds = args.warmup + args.steps
    produced = [
        json.dumps(r.asDict()).encode()
        for r in bids(spark, 2 * args.bids, rounds, auction_count).drop("_weight").collect()
    ]
    samples: dict[str, list[Sample]] = {}
    step, next_bid = 1, args.bids
    for i in range(rounds):
        measured = {}
        traced = {"timings": pipeline.timings, "phase_at": pipeline.phase_at}
        measured["empty"] = observer.measure(direct(step, {}), **traced)
        step += 1
        measured["one row"] = observer.measure(
            direct(step, {"bids": bids(spark, next_bid, 1, auction_count)}), **traced
        )
        step, next_bid = step + 1, next_bid + 1
        measured["no-op run"] = observer.measure(lambda: pipeline.run() and None, **traced)
        if dagster is not None:
            dagster.client.produce(f"{NAME}.bids", [produced[i]])
            started = time.perf_counter()
            key = dagster.tick()
            tick = time.perf_counter() - started
            if key != step_key(step):
                raise RuntimeError(f"the sensor requested step {key}, expected {step_key(step)}")
            measured["dagster one record"] = observer.measure(
                lambda key=key: dagster.run(key), phase_at=dagster.phase_at
            )
            measured["dagster one record"].extra["tick"] = tick
            measured["dagster no-op"] = observer.measure(lambda key=key: dagster.run(key), phase_at=dagster.phase_at)
            step += 1
        if i >= args.warmup:
            for kind, sample in measured.items():
                samples.setdefault(kind, []).append(sample)
        print(
            f"round {i + 1}/{rounds}{' (warm-up)' if i < args.warmup else ''}: "
            + ", ".join(f"{k} {s.wall:.2f} s" for k, s in measured.items()),
            flush=True,
        )
    if dagster is not None:
        dagster.instance.dispose()
    return samples


def median_sample(samples: list[Sample]) -> Sample:
    return sorted(samples, key=lambda s: s.wall)[(len(samples) - 1) // 2]


def counts(samples: list[Sample]) -> dict:
    low = statistics.median_low
    kinds = [s.by_kind() for s in samples]
    return {
        "wall": statistics.median(s.wall for s in samples),
        "jobs": low(len(s.jobs) for s in samples),
        "stages": low(s.total("numCompletedStages") for s in samples),
        "skipped": low(s.total("numSkippedStages") for s in samples),
        "tasks": low(s.total("numCompletedTasks") for s in samples),
        "in_jobs": statistics.median(s.in_jobs() for s in samples),
        "commits": "/".join(str(low(k[kind] for k in kinds)) for kind in KINDS),
        "phases": ", ".join(
            f"{phase} {statistics.median(s.phases.get(phase, 0.0) for s in samples):.2f}"
            for phase in [*dict.fromkeys(p for s in samples for p in s.phases if p != "rest"), "rest"]
        ),
    }


def show_jobs(title: str, sample: Sample) -> None:
    """The sample's jobs: the phase that started each, its SQL execution (jobs of one
    action share it), whether it builds a broadcast, and where it was called from."""
    print(f"\n{title} ({sample.wall:.2f} s, {sample.in_jobs():.2f} s in Spark jobs): {len(sample.jobs)} Spark jobs")
    print("| job | phase | SQL execution | stages run (skipped) | tasks | s | description |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for job in sample.jobs:
        tags = job.get("jobTags", [])
        execution = next((t.rsplit("-", 1)[1] for t in tags if "-execution-root-id-" in t), "-")
        broadcast = " (broadcast exchange)" if any(t.startswith("broadcast exchange") for t in tags) else ""
        description = (job.get("description") or job["name"]).replace(PROJECT, "").replace("\n", " ")
        start, stop = interval(job)
        print(
            f"| {job['jobId']} | {job.get('_phase', '-')} | {execution} | {job['numCompletedStages']} ({job['numSkippedStages']}) "
            f"| {job['numCompletedTasks']} | {stop - start:.2f} | {description[:60]}{broadcast} |"
        )
    commits = ", ".join(f"{path} +{n}" for path, n in sorted(sample.commits.items()))
    print(f"Delta commits: {commits or 'none'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bids", type=int, default=100_000, help="bids in the state (loaded in step 0)")
    parser.add_argument("--steps", type=int, default=5, help="measured steps of each kind (medians over these)")
    parser.add_argument("--warmup", type=int, default=1, help="unrecorded rounds before them")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--no-dagster", action="store_true", help="direct steps only (no broker, no Dagster)")
    parser.add_argument(
        "--root", default="/tmp/dbsp-bench-fixed", help="pipeline store and Dagster instance (deleted first)"
    )
    args = parser.parse_args()
    shutil.rmtree(args.root, ignore_errors=True)
    os.makedirs(args.root)
    spark = local_session(
        cores=2,
        app_name="bench-fixed",
        extra={"spark.ui.enabled": "true", "spark.ui.port": str(free_port()), "spark.driver.memory": "8g"},
    )
    try:
        with contextlib.ExitStack() as stack:
            broker = None if args.no_dagster else stack.enter_context(LocalBroker())
            samples = measure(spark, args, broker and broker.bootstrap)
    finally:
        spark.stop()

    print(f"\nbids_by_category, {args.bids:,} bids of state, {args.workers} workers, median of {args.steps}")
    print(
        "\n| step kind | wall s | Spark jobs | stages (skipped) | tasks | in Spark jobs s "
        "| Delta commits (state/outputs/inputs/checkpoint/other) | phases s |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for kind in ("empty", "one row", "no-op run"):
        c = counts(samples[kind])
        print(
            f"| {kind} | {c['wall']:.2f} | {c['jobs']} | {c['stages']} ({c['skipped']}) | {c['tasks']} | {c['in_jobs']:.2f} "
            f"| {c['commits']} | {c['phases']} |"
        )
    if not args.no_dagster:
        print(
            "\n| kind | Dagster run s | direct step s | overhead s | Spark jobs (direct) | in Spark jobs s (direct) "
            "| Delta commits (direct) | Dagster run phases s |"
        )
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for kind, peer in (("one record", "one row"), ("no-op", "no-op run")):
            ours, theirs = counts(samples[f"dagster {kind}"]), counts(samples[peer])
            print(
                f"| {kind} | {ours['wall']:.2f} | {theirs['wall']:.2f} | {ours['wall'] - theirs['wall']:.2f} "
                f"| {ours['jobs']} ({theirs['jobs']}) | {ours['in_jobs']:.2f} ({theirs['in_jobs']:.2f}) "
                f"| {ours['commits']} ({theirs['commits']}) | {ours['phases']} |"
            )
        tick = statistics.median(s.extra["tick"] for s in samples["dagster one record"])
        print(
            "\nDagster one record (its division was cut by a sensor tick before the run, median "
            f"{tick:.2f} s) is compared with the direct one-row step, Dagster no-op (the step job again for "
            "the committed step) with the direct no-op run. Delta commits: state/outputs/inputs/checkpoint/other. "
            "Run phases: Dagster before the asset body, the step's seconds/* metadata, the rest of the body "
            "until it materializes (lease, open, metadata), the asset checks, Dagster after."
        )
    show_jobs("Median empty step", median_sample(samples["empty"]))
    show_jobs("Median one-row step", median_sample(samples["one row"]))
    if not args.no_dagster:
        show_jobs("Median Dagster one-record run", median_sample(samples["dagster one record"]))
        show_jobs("Median Dagster no-op run", median_sample(samples["dagster no-op"]))


if __name__ == "__main__":
    main()
