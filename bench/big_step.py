"""A large step (a first load, a backfill) of the demo circuit against a Spark batch
recompute of the same four views over the same events, with the step's profile.

After ``--warmup`` loads of 100,000 events and recomputes (the server's JIT and code caches warm), one
step of ``--events`` events of the Nexmark mix (``state_scale.nexmark_mix``) into a
new durable pipeline of the demo circuit, no broker; then the four views recomputed by
Spark batch SQL over the same events as Parquet (``state_scale.peer_inputs``), in a
session of its own with Spark's defaults, on the same server.  The profile: the step's
phases (``Pipeline.timings``; ``submit`` is the input log's write), then each Spark stage
of the step by duration (the server's UI REST API): its name, tasks, rows and bytes in and
out, shuffle bytes, and the files the step wrote per table.

    python bench/big_step.py --events 1000000
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import tempfile
import time
from collections import Counter
from datetime import datetime, timezone

from common import SPARK_DEFAULTS, timed
from state_scale import VIEWS, Server, peer_inputs, recompute, server_arguments, weighted

from circuits.library import nexmark_circuit
from circuits.library.nexmark import SCHEMAS
from circuits.spark import remote_session, round_trips
from storage.delta import delta_tables
from storage.logs import Range
from storage.pipeline import Pipeline


def cpu_seconds(pid: int | None) -> tuple[float, float]:
    """CPU seconds used by process ``pid`` (the server's JVM) and by its descendants (its
    Python workers), with their children that have ended: under a loaded machine, the
    part of a step's cost that does not depend on what else runs."""
    if pid is None:
        return 0.0, 0.0
    parents, times = {}, {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parents[int(entry)] = int(fields[1])
            times[int(entry)] = sum(map(int, fields[11:15]))
    tree, grown = {pid}, True
    while grown:
        more = {p for p, parent in parents.items() if parent in tree} - tree
        tree, grown = tree | more, bool(more)
    tick = os.sysconf("SC_CLK_TCK")
    return times.get(pid, 0) / tick, sum(times.get(p, 0) for p in tree - {pid}) / tick


def used(now: tuple[float, float], before: tuple[float, float]) -> tuple[float, float]:
    return now[0] - before[0], now[1] - before[1]


def jobs_since(server: Server, job: int, started: float) -> list[str]:
    """The jobs after ``job``: seconds from ``started`` (epoch) to each one's submission,
    its duration and stages; the gaps between them are the driver's and client's work."""

    def at(stamp: str) -> float:
        return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%f%Z").replace(tzinfo=timezone.utc).timestamp()

    jobs = sorted((j for j in server.rest("jobs") if j["jobId"] > job), key=lambda j: j["jobId"])
    return [
        f"job {j['jobId']} at {at(j['submissionTime']) - started:.1f} s for"
        f" {at(j['completionTime']) - at(j['submissionTime']):.1f} s, {len(j['stageIds'])} stages"
        for j in jobs
    ]


def stages_since(server: Server, job: int) -> list[dict]:
    """The stages of the jobs after ``job``, longest first."""
    stages = {s for j in server.rest("jobs") if j["jobId"] > job for s in j["stageIds"]}
    return sorted(
        (s for s in server.rest("stages") if s["stageId"] in stages and s["status"] == "COMPLETE"),
        key=lambda s: -s["executorRunTime"],
    )


def files_written(root: str) -> Counter:
    """Data files per Delta table under ``root``."""
    return Counter(
        {os.path.relpath(t, root): sum(f.endswith(".parquet") for f in os.listdir(t)) for t in delta_tables(root)}
    )


def events(spark, base: str) -> dict:
    """The peer's Parquet inputs, read by the step too: both start from the same files."""
    return {name: spark.read.schema(SCHEMAS[name]).parquet(os.path.join(base, name, "base")) for name in SCHEMAS}


def load(spark, root: str, base: str, workers: int) -> tuple[Pipeline, float, float]:
    """A new pipeline at ``root`` whose first step is the events under ``base``; the
    seconds its input took to persist, then to run."""
    pipeline = Pipeline(spark, root, nexmark_circuit("big", VIEWS), workers=workers)
    submit = timed(lambda: pipeline.submit(0, weighted(events(spark, base)), [Range("bench", 0, 0, 1)]))
    return pipeline, submit, timed(pipeline.run)


def profile(spark, server: Server, args: argparse.Namespace) -> None:
    root = os.path.join(args.root, f"big-{args.events}")
    shutil.rmtree(root, ignore_errors=True)
    peer = spark.newSession()
    for key, value in SPARK_DEFAULTS.items():
        peer.conf.set(key, value)
    base = peer_inputs(peer, args.data, args.events)
    for warm in range(args.warmup):  # the smallest cached input, loaded on pipelines of their own and recomputed
        small = peer_inputs(peer, args.data, 100_000)
        load(spark, os.path.join(args.root, f"warm-{warm}"), small, args.workers)
        recompute(peer, small, os.path.join(root, "no-added"))
    job = server.jobs_since(-1)[0]
    cpu, started = cpu_seconds(server.pid), time.time()
    trace = io.StringIO()
    with server.sampled(), round_trips(spark, trace=trace):
        pipeline, submit, run = load(spark, root, base, args.workers)
    cpu, step_cpu = cpu_seconds(server.pid), used(cpu_seconds(server.pid), cpu)
    stages, jobs = stages_since(server, job), jobs_since(server, job, started)
    redo = recompute(peer, base, os.path.join(root, "no-added"))
    redo_cpu = used(cpu_seconds(server.pid), cpu)
    step = submit + run
    phases = ", ".join(f"{k} {v:.1f}" for k, v in sorted(pipeline.timings.items(), key=lambda kv: -kv[1]))
    print(f"{args.events:,} events in one step: {step:.1f} s (submit {submit:.1f}, run {run:.1f}: {phases})")
    print(f"recompute of {', '.join(VIEWS)}: {redo:.1f} s; step / recompute {step / redo:.2f}x")
    print(
        f"server CPU (JVM + Python): step {sum(step_cpu):.1f} s ({step_cpu[0]:.1f} + {step_cpu[1]:.1f}),"
        f" recompute {sum(redo_cpu):.1f} s ({redo_cpu[0]:.1f} + {redo_cpu[1]:.1f});"
        f" step / recompute {sum(step_cpu) / sum(redo_cpu):.2f}x"
    )
    print("the step's jobs:", "; ".join(jobs))
    print("its round trips of a second or more (RPC, start, seconds, thread, call sites):")
    print("".join(f"  {line}\n" for line in trace.getvalue().splitlines() if float(line.split()[2]) >= 1.0), end="")
    print(f"server peak resident {server.rss_peak / 2**30:.2f} GB; {len(stages)} stages, longest first:")
    for s in stages[: args.top]:
        print(
            f"  {s['executorRunTime'] / 1000:7.1f} s  stage {s['stageId']:>4} tasks {s['numTasks']:>3}"
            f" in {s['inputRecords']:>10,} rows {s['inputBytes'] / 1e6:7.1f} MB"
            f" shuffle r/w {s['shuffleReadBytes'] / 1e6:7.1f}/{s['shuffleWriteBytes'] / 1e6:7.1f} MB"
            f" out {s['outputRecords']:>9,}  {s['name'][:60]}"
        )
    print("data files per table:", dict(files_written(root)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--warmup",
        type=int,
        default=1,
        help="first loads of 100,000 events before (warm the server's JIT and code caches)",
    )
    parser.add_argument("--top", type=int, default=15, help="stages to list")
    parser.add_argument("--root", default=None, help="where the pipeline lives (default: a temporary directory)")
    server_arguments(parser)
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="big-step-")
    args.root = args.root or work
    server = Server(work, args.url, args.driver_memory)
    try:
        profile(remote_session(server.url), server, args)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
