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
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone

from common import peer_session, timed
from deltalake import DeltaTable
from state_scale import VIEWS, Server, peer_inputs, recompute, server_arguments, weighted

from circuits.library import nexmark_circuit
from circuits.library.nexmark import SCHEMAS
from circuits.spark import remote_session, round_trips
from storage import database, delta, logs
from storage.delta import add_actions, delta_tables
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


def round_trip_sites(trace: str) -> list[str]:
    """The traced round trips summed by RPC and innermost call site, most seconds first."""
    count: Counter = Counter()
    spent: Counter = Counter()
    for line in trace.splitlines():
        rpc, _, seconds, _, *sites = line.split()
        site = (rpc, sites[0] if sites else "?")
        count[site] += 1
        spent[site] += float(seconds)
    return [f"{count[site]:>3} {seconds:7.2f} s  {site[0]} {site[1]}" for site, seconds in spent.most_common()]


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


def written(root: str, events: int) -> list[str]:
    """Per Delta table under ``root``: its data files, rows and bytes, and rows and bytes per
    input event (what a first load writes per row it takes)."""
    lines = []
    for uri in sorted(delta_tables(root)):
        adds = add_actions(DeltaTable(uri))
        rows, size = sum(adds.column("num_records").to_pylist()), sum(adds.column("size_bytes").to_pylist())
        lines.append(
            f"  {os.path.relpath(uri, root):40} {adds.num_rows:>3} files {rows:>11,} rows {size / 1e6:8.1f} MB"
            f"  per event {rows / events:5.2f} rows {size / events:6.1f} B"
        )
    return lines


def tasks_by_table(server: Server, stage: dict, tables: list[str]) -> list[str]:
    """The write stage's task time per table: its tasks run the union of the tables'
    writers, branch after branch, so task ``i`` belongs to the branch its index falls in."""
    tasks = server.rest(f"stages/{stage['stageId']}/{stage['attemptId']}/taskList?length=10000")
    per = len(tasks) // max(len(tables), 1)
    spent: Counter = Counter()
    for task in tasks:
        metrics = task.get("taskMetrics", {})
        spent[tables[min(task["index"] // per, len(tables) - 1)]] += metrics.get("executorRunTime", 0) / 1000
    return [f"  {seconds:7.1f} s  {name}" for name, seconds in spent.most_common()]


@contextmanager
def recorded_writes(order: list) -> Iterator[None]:
    """Appends to ``order`` the tables of each :func:`storage.delta.write_tables` call of the
    step (its writers' order), for the per-table profile of the write stage."""
    original = delta.write_tables

    def recording(parts, *args, **kwargs):
        order.append([os.path.relpath(uri, os.path.dirname(os.path.dirname(uri))) for uri, _ in parts.values()])
        return original(parts, *args, **kwargs)

    modules = [database, logs]
    for module in modules:
        module.write_tables = recording
    try:
        yield
    finally:
        for module in modules:
            module.write_tables = original


def events(spark, base: str) -> dict:
    """The peer's Parquet inputs, read by the step too: both start from the same files."""
    return {name: spark.read.schema(SCHEMAS[name]).parquet(os.path.join(base, name, "base")) for name in SCHEMAS}


def load(spark, root: str, base: str, events_count: int, workers: int) -> tuple[Pipeline, float, float]:
    """A new pipeline at ``root`` whose first step is the ``events_count`` events under
    ``base`` (its division: that many offsets of one partition); the seconds its input took
    to persist, then to run."""
    pipeline = Pipeline(spark, root, nexmark_circuit("big", VIEWS), workers=workers)
    submit = timed(lambda: pipeline.submit(0, weighted(events(spark, base)), [Range("bench", 0, 0, events_count)]))
    return pipeline, submit, timed(pipeline.run)


def profile(spark, server: Server, args: argparse.Namespace) -> None:
    root = os.path.join(args.root, f"big-{args.events}")
    shutil.rmtree(root, ignore_errors=True)
    peer = peer_session(spark, server.url)
    base = peer_inputs(peer, args.data, args.events)
    for warm in range(args.warmup):  # the smallest cached input, loaded on pipelines of their own and recomputed
        small = peer_inputs(peer, args.data, 100_000)
        load(spark, os.path.join(args.root, f"warm-{warm}"), small, 100_000, args.workers)
        recompute(peer, small, os.path.join(root, "no-added"))
    job = server.jobs_since(-1)[0]
    cpu, started = cpu_seconds(server.pid), time.time()
    trace = io.StringIO()
    order = []  # the tables of each write, in the order its writers' tasks run
    with server.sampled(), round_trips(spark, trace=trace), recorded_writes(order):
        pipeline, submit, run = load(spark, root, base, args.events, args.workers)
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
    print("its round trips by RPC and innermost call site (count, seconds):")
    print("".join(f"  {line}\n" for line in round_trip_sites(trace.getvalue())), end="")
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
    print("the longest stage's task time per table (if it is the step's write):")
    print("\n".join(tasks_by_table(server, stages[0], order[-1])))
    print("written per table (files, rows, bytes; per input event):")
    print("\n".join(written(root, args.events)))


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
