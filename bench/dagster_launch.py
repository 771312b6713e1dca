"""Launch to success of demo step runs under ``dbsp dev`` (executed by its resident step
worker), against the engine's own time for the same step.

``dbsp dev`` serves the Nexmark demo from a temporary directory (its own Dagster home,
embedded broker and embedded Spark Connect server on free ports, and the step worker).
For each size in ``--events``, the bench produces that many events to the broker, the
offset sensor cuts a step and launches its run, and the bench waits for it; ``--warmup``
steps of the first size come first, unrecorded (the server and the worker start cold).
For every run, from the instance's run records: queue wait (created to started) and run
(started to ended); launch to success is their sum.  The engine's time is the step's own
phases, as the run's materialization reports them (``seconds/*``: ingest, compute and
write, commits), measured inside the warm worker: launch to success minus it is what
Dagster and the launch add; where it goes is shown by the run's events (the median seconds
before each kind of event, a log message by its first words: before "running steps" the
pipeline is found and its lease taken, before "ran steps" the steps run and the lease is
released, before the first STEP_OUTPUT the materializations' metadata is read).  The
worker's resident memory (VmRSS) is read after the warm-up and at the end, and with
``--memory-every N`` every N runs, with those runs' figures.

    python bench/dagster_launch.py --events 1000 --steps 5 --warmup 3
    python bench/dagster_launch.py --events 1 --steps 990 --warmup 10 --memory-every 100  # a leak
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

import yaml

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dagster import DagsterEventType, DagsterInstance, DagsterRunStatus, RunsFilter
from dagster._core.instance.ref import InstanceRef

from circuits.daemon import free_port
from circuits.library.nexmark import nexmark_records
from circuits.spark import stop_connect_server
from dagster_project.config import demo_settings, parse_project
from dagster_project.demo_producer import produce_events
from dagster_project.metadata import step_figures
from dagster_project.resources import KafkaResource
from dagster_project.step_worker import WORKER_FILE
from sensors.broker import stop_local_broker

PIPELINE = "nexmark"
TIMEOUT = 600.0


def project(root: str, events: int, broker: int, spark: int) -> dict:
    """The demo pipeline, cutting a step at ``events`` records or 3 s after the first
    (longer than producing a step's events takes)."""
    spec = {
        **demo_settings()["pipelines"][0],
        "max_records_per_step": events,
        "max_wait_seconds": 3,
        "sensor_interval_seconds": 1,
    }
    return {
        "pipelines": [spec],
        "resources": {
            "kafka": {"embedded_port": broker},
            "spark": {"embedded_port": spark},
            "store": {"root": os.path.join(root, "pipelines")},
        },
    }


class Served:
    """``dbsp dev`` in ``root`` and what the bench needs of it."""

    def __init__(self, root: str, events: int, broker: int | None = None, spark: int | None = None) -> None:
        """``broker``, ``spark``: the embedded broker's and Spark server's ports (default: free ones)."""
        self.root, self.port = root, free_port()
        self.broker, self.spark = broker or free_port(), spark or free_port()
        settings = project(root, events, self.broker, self.spark)
        config = os.path.join(root, "dbsp.yaml")
        with open(config, "w") as f:
            yaml.safe_dump(settings, f)
        # The bench's own broker client finds the embedded broker's state by $DBSP_HOME too.
        os.environ.update(DBSP_HOME=os.path.join(root, "home"), DBSP_CONFIG=config)
        self.env = dict(os.environ)
        self.kafka = KafkaResource(embedded_port=self.broker)
        self.spec = parse_project(settings, config).pipelines[0]
        self.log = open(os.path.join(root, "dev.log"), "w")
        dbsp = os.path.join(os.path.dirname(sys.executable), "dbsp")
        self.process = subprocess.Popen(
            [dbsp, "dev", "-p", str(self.port)],
            cwd=root,
            env=self.env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._wait_for_webserver()
        self.instance = DagsterInstance.from_ref(InstanceRef.from_dir(os.path.join(self.env["DBSP_HOME"], "dagster")))

    def _wait_for_webserver(self) -> None:
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"dbsp dev exited with code {self.process.returncode}; see {self.log.name}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/server_info", timeout=2):
                    return
            except OSError:
                time.sleep(0.5)
        raise RuntimeError(f"dagster dev did not serve within {TIMEOUT:g} s; see {self.log.name}")

    def step(self, events: int, records_of=nexmark_records) -> dict:
        """Produces ``events`` events of ``records_of`` (a demo producer) and returns the
        figures of the step run they cause."""
        seen = self._runs(f"{PIPELINE}_step_job")
        produce_events(self.kafka.topics(self.spec), records_of, events, seed=0)
        return self._finished(f"{PIPELINE}_step_job", seen)

    def worker_rss(self) -> int:
        """The step worker's resident memory, in bytes."""
        with open(os.path.join(self.env["DBSP_HOME"], "dagster", WORKER_FILE)) as f:
            pid = json.load(f)["pid"]
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))

    def _runs(self, job: str) -> set[str]:
        return {r.dagster_run.run_id for r in self.instance.get_run_records(RunsFilter(job_name=job))}

    def _finished(self, job: str, seen: set[str]) -> dict:
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            new = [
                r for r in self.instance.get_run_records(RunsFilter(job_name=job)) if r.dagster_run.run_id not in seen
            ]
            if new and new[0].dagster_run.status in (DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED):
                raise RuntimeError(f"run {new[0].dagster_run.run_id} of {job} ended {new[0].dagster_run.status}")
            if new and new[0].dagster_run.status == DagsterRunStatus.SUCCESS:
                record = new[0]
                queued = record.start_time - record.create_timestamp.timestamp()
                rows, phases = step_figures(self._metadata(record))
                run = record.end_time - record.start_time
                gaps = self._gaps(record)
                return {
                    "queue": queued,
                    "run": run,
                    "engine": sum(phases.values()),
                    "phases": phases,
                    "rows_in": rows,
                    "gaps": gaps,
                }
            time.sleep(0.2)
        raise RuntimeError(f"no run of {job} succeeded within {TIMEOUT:g} s; see {self.log.name}")

    def _metadata(self, record) -> dict:
        """The run's first materialization's metadata values (see :func:`step_figures`)."""
        entry = self.instance.all_logs(record.dagster_run.run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION)[0]
        return {key: value.value for key, value in entry.asset_materialization.metadata.items()}

    def _gaps(self, record) -> dict[str, float]:
        """The run's seconds by the event that ended them: for each event type, the sum of
        the time from the event before each of its events (a log message counts by its first
        two words after the pipeline's name), from the run's creation on."""
        gaps: dict[str, float] = {}
        last = record.create_timestamp.timestamp()
        for entry in self.instance.all_logs(record.dagster_run.run_id):
            kind = entry.dagster_event.event_type_value if entry.dagster_event else log_kind(entry.user_message)
            gaps[kind] = gaps.get(kind, 0.0) + entry.timestamp - last
            last = entry.timestamp
        return gaps

    def stop(self) -> None:
        os.killpg(self.process.pid, signal.SIGINT)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
        stop_connect_server(os.path.join(self.env["DBSP_HOME"], "spark"), self.spark)
        stop_local_broker(self.broker, os.path.join(self.env["DBSP_HOME"], "broker"))
        self.log.close()


def line(name: str, samples: list[dict]) -> str:
    queue, run, engine = (statistics.median(s[k] for s in samples) for k in ("queue", "run", "engine"))
    totals = sorted(s["queue"] + s["run"] for s in samples)
    ratio = statistics.median((s["queue"] + s["run"]) / s["engine"] for s in samples)
    return (
        f"{name:22s} queue {queue:5.2f} s + run {run:6.2f} s = launch to success {queue + run:6.2f} s"
        f" (each {totals[0]:.2f}..{totals[-1]:.2f}); engine {engine:.2f} s; launch to success - engine"
        f" {queue + run - engine:.2f} s; launch to success / engine {ratio:.2f}x"
    )


def log_kind(message: str) -> str:
    """A run's log message by its first two words after the pipeline's name."""
    return f"log '{' '.join(message.split(': ', 1)[-1].split()[:2])}'"


def breakdown(samples: list[dict], top: int = 12) -> str:
    """The runs' median seconds by the event that ended them, the largest first."""
    kinds = {kind for s in samples for kind in s["gaps"]}
    medians = {kind: statistics.median(s["gaps"].get(kind, 0.0) for s in samples) for kind in kinds}
    largest = sorted(medians.items(), key=lambda item: -item[1])[:top]
    return "  up to: " + ", ".join(f"{kind} {seconds:.3f}" for kind, seconds in largest)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--events", type=int, nargs="+", default=[1000, 5000], help="events per step, one size after another"
    )
    parser.add_argument("--steps", type=int, default=3, help="measured steps of each size (medians)")
    parser.add_argument("--warmup", type=int, default=3, help="unrecorded steps of the first size first")
    parser.add_argument("--memory-every", type=int, default=0, help="print the worker's memory every N runs")
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="dbsp-launch-")
    served = Served(root, max(args.events))
    lines = [f"dbsp dev, demo pipeline, medians of {args.steps} runs per kind after {args.warmup} warm-up steps"]
    try:
        for _ in range(args.warmup):
            served.step(args.events[0])
        runs, rss = args.warmup, served.worker_rss()
        for events in args.events:
            steps = []
            for _ in range(args.steps):
                steps.append(served.step(events))
                runs += 1
                if args.memory_every and runs % args.memory_every == 0:
                    print(f"step worker memory after {runs} runs: {served.worker_rss() / 2**20:.0f} MiB", flush=True)
                    window = steps[-args.memory_every :]
                    print(line(f"runs {runs - len(window) + 1}..{runs}", window), flush=True)
                    print(breakdown(window), flush=True)
            lines += [line(f"step run, {events} events", steps), breakdown(steps)]
        last = served.worker_rss()
        lines.append(
            f"step worker memory: {last / 2**20:.0f} MiB after {runs} runs"
            f" / {rss / 2**20:.0f} MiB after {args.warmup}: {last / rss:.2f}x"
        )
    finally:
        served.stop()
    print("\n".join(lines))
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
