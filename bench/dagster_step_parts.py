"""Where a ``dbsp demo`` step run's time goes: the demo's steps through Dagster
(``execute_in_process``, as ``dbsp demo`` runs them), each split into the engine's
phases (ingest, compute and write, view commit: the materialization's ``seconds/``
metadata), the asset checks, the materialization's metadata reads, and the rest (Dagster:
its events in the instance's SQLite storage, resource init, the lease), with the Spark
round trips of the run by kind.

``--alternate`` checks every other step with one Spark job (as before the checks ran in
the run's process: ``storage.inspect.LOCAL_ROWS = 0``), so both ways are measured on one
server in the same minutes.  The demo's own embedded broker and Spark Connect server run
on free ports under a temporary ``$DBSP_HOME``, whose Dagster home is the one ``dbsp`` writes
(``--per-run-event-logs``: with Dagster's default event log instead).

    python bench/dagster_step_parts.py --steps 10 --warmup 2 --alternate
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

ROOT = tempfile.mkdtemp(prefix="dbsp-parts-")
os.environ.update(DBSP_HOME=ROOT, DAGSTER_HOME=os.path.join(ROOT, "dagster"))
os.makedirs(os.environ["DAGSTER_HOME"])

# E402: the project reads DBSP_HOME and DAGSTER_HOME as its modules load, so they are set first.
from circuits.daemon import free_port  # noqa: E402
from circuits.spark import round_trips, stop_connect_server  # noqa: E402
from dagster_project import demo, factory  # noqa: E402
from dagster_project.cli import DAGSTER_YAML, dagster_yaml  # noqa: E402
from dagster_project.config import demo_settings, parse_project  # noqa: E402
from dagster_project.console import Progress  # noqa: E402
from dagster_project.resources import SparkResource  # noqa: E402
from sensors.broker import stop_local_broker  # noqa: E402
from storage import inspect  # noqa: E402

PARTS = {
    "checks": (inspect, "check_outputs"),
    "metadata": (factory, "step_metadata"),
    "view_metadata": (factory, "view_metadata"),
}


def timed(seconds: Counter) -> None:
    """Adds each part's wall time to ``seconds[part]``."""
    for part, (module, name) in PARTS.items():
        original = getattr(module, name)

        def wrapper(*args, _original=original, _part=part, **kwargs):
            started = time.perf_counter()
            try:
                return _original(*args, **kwargs)
            finally:
                seconds[_part] += time.perf_counter() - started

        setattr(module, name, functools.wraps(original)(wrapper))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="measured steps")
    parser.add_argument("--warmup", type=int, default=2, help="unrecorded steps first")
    parser.add_argument("--events", type=int, default=1000, help="events per step")
    parser.add_argument("--alternate", action="store_true", help="check every other step with one Spark job")
    parser.add_argument(
        "--per-run-event-logs",
        action="store_true",
        help="Dagster's default event log (a database per run), not the one database dbsp configures",
    )
    parser.add_argument("--trace", type=argparse.FileType("w"), help="a line per round trip: its call sites")
    args = parser.parse_args()
    home = os.environ["DAGSTER_HOME"]
    with open(os.path.join(home, "dagster.yaml"), "w") as f:
        f.write(DAGSTER_YAML if args.per_run_event_logs else dagster_yaml(home))
    broker, spark = free_port(), free_port()
    resources = {"kafka": {"embedded_port": broker}, "spark": {"embedded_port": spark}}
    project = parse_project({"pipelines": [demo_settings()["pipelines"][0]], "resources": resources}, "bench")
    seconds: Counter = Counter()
    timed(seconds)
    rows: dict[str, list[dict]] = {}
    run_step = demo._run_step

    def measured(*a, **k):
        done = sum(len(v) for v in rows.values())
        local = not (args.alternate and done % 2 == 0)
        inspect.LOCAL_ROWS = 1_000_000 if local else 0
        seconds.clear()
        rpc_seconds: Counter = Counter()
        session = SparkResource(embedded_port=spark).session()
        if args.trace:
            print(f"# step run {done + 1}", file=args.trace)
        with round_trips(session, trace=args.trace, seconds=rpc_seconds) as calls:
            report = run_step(*a, **k)
        engine = sum(report.phases.values())
        figures = {
            "wall": report.seconds,
            **report.phases,
            **seconds,
            "rest": report.seconds - engine - sum(seconds.values()),
        }
        figures |= {f"rpc/{k}": v for k, v in calls.items()}
        rows.setdefault("checks in the run's process" if local else "checks by one Spark job", []).append(figures)
        return report

    demo._run_step = measured
    try:
        demo.run_demo(project, args.warmup + args.steps, args.events, 0, True, Progress(sys.stderr, live=False))
    finally:
        stop_connect_server(os.path.join(ROOT, "spark"), spark)
        stop_local_broker(broker, os.path.join(ROOT, "broker"))
    for kind, samples in rows.items():
        samples = samples[args.warmup // (2 if args.alternate else 1) :]
        keys = [k for k in samples[0] if all(k in s for s in samples)]
        medians = ", ".join(f"{k} {statistics.median(s[k] for s in samples):.2f}" for k in keys)
        print(f"{kind} ({len(samples)} steps, medians, seconds or calls): {medians}")
    shutil.rmtree(ROOT, ignore_errors=True)


if __name__ == "__main__":
    main()
