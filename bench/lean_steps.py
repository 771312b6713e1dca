"""What a step of the demo circuit costs over Spark Connect, against the same steps in a
classic in-process session, measured in the same run.

The demo circuit (four views: bids_by_category, q3, q4, q15) runs durably (Delta state,
input and output logs, a checkpoint per step) on ``--events`` Nexmark events per step,
for ``--steps`` steps after ``--warmup`` unrecorded ones, and then on one-row steps (one
bid each).  Each mode runs in a process of its own (PySpark holds one kind of session per
process): ``connect`` on a Spark Connect server started for the run (as ``dbsp`` starts
the embedded one), ``classic`` in a ``local[2]`` session.  Per mode and kind of step:
median wall seconds of the step (submit + run: input write, plan, job, commits), of its
compute-and-write phase, and, over Connect, round trips to the server per step by kind
(ExecutePlan runs a job or a command, AnalyzePlan asks for a schema or caches, Config
sets a setting).  Finally it checks each mode's maintained q4 against Spark batch SQL
over its input log.  ``--stores local s3`` runs each mode with the store on the local disk
and on an S3-compatible server (moto's, started for the run: ``tests/s3.py``); ``--modes
connect cluster`` runs the Connect server on ``local[2]`` and as the driver of a standalone
cluster of two one-core workers (``tests/cluster.py``); each prints the ratio of the steps.

    python bench/lean_steps.py --events 1000 --steps 5
    python bench/lean_steps.py --events 1000 --steps 5 --modes connect --stores local s3
    python bench/lean_steps.py --events 100000 --steps 3 --warmup 1 --modes connect cluster

``LEAN_TRACE=1`` prints every round trip (RPC, seconds, call site) to stderr, see
:func:`circuits.spark.round_trips`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from circuits.library import nexmark_circuit
from circuits.library.nexmark import NexmarkGenerator, nexmark_inputs
from circuits.library.nexmark_queries import RECOMPUTE_SQL
from storage.logs import Range, read_steps
from storage.pipeline import Pipeline
from tests.s3 import s3_server


def measure(mode: str, url: str | None, events: int, steps: int, warmup: int, root: str) -> dict:
    from circuits.spark import local_session, remote_session, round_trips

    spark = remote_session(url) if mode == "connect" else local_session(2)
    with contextlib.ExitStack() as stack:
        calls = Counter()
        if mode == "connect":
            calls = stack.enter_context(round_trips(spark, sys.stderr if os.environ.get("LEAN_TRACE") else None))
        return _steps(spark, calls, events, steps, warmup, root)


def _steps(spark, calls: Counter, events: int, steps: int, warmup: int, root: str) -> dict:
    pipeline = Pipeline(spark, root, nexmark_circuit(), workers=2)
    generator = NexmarkGenerator()
    figures: dict[str, list] = {
        "step": [],
        "compute": [],
        "one_row_step": [],
        "one_row_compute": [],
        "rpcs": [],
        "one_row_rpcs": [],
    }
    step, first = 0, 0

    def run(inputs: dict, kind: str) -> None:
        nonlocal step
        pipeline.timings.clear()
        before = Counter(calls)
        started = time.perf_counter()
        pipeline.submit(step, inputs, [Range("bench", 0, step, step + 1)])
        pipeline.run()
        wall = time.perf_counter() - started
        if kind:
            figures[kind].append(wall)
            figures["compute" if kind == "step" else "one_row_compute"].append(pipeline.timings["compute_and_write"])
            figures["rpcs" if kind == "step" else "one_row_rpcs"].append(dict(calls - before))
        step += 1

    for i in range(warmup + steps):
        batch = list(generator.events(first, events))
        first += events
        run({name: df for name, df in nexmark_inputs(spark, batch).items()}, "step" if i >= warmup else "")
    for i in range(warmup + steps):
        bid = [("bids", (1000 + i % 3, 1000, 10 + i, "Google", generator.start_ms + first * 100))]
        run({"bids": nexmark_inputs(spark, bid)["bids"]}, "one_row_step" if i >= warmup else "")
    last = step - 1
    for handle in pipeline.circuit.inputs:
        _integral(read_steps(spark, pipeline.inputs.uri(handle), 0, last)).createOrReplaceTempView(handle)
    recomputed = Counter(tuple(round(v, 6) for v in r) for r in spark.sql(RECOMPUTE_SQL["q4"]).collect())
    maintained = Counter(
        tuple(round(v, 6) for v in r) for r in _integral(pipeline.outputs.read("q4", 0, last)).collect()
    )
    figures["q4_matches"] = recomputed == maintained
    return figures


def _integral(changes):
    from dagster_project.demo import integral

    return integral(changes)


def summary(mode: str, figures: dict) -> list[str]:
    def rpcs(samples: list[dict]) -> str:
        kinds = sorted({k for s in samples for k in s})
        return ", ".join(f"{k} {statistics.median(s.get(k, 0) for s in samples):g}" for k in kinds) or "-"

    return [
        f"{mode:8s} {statistics.median(figures['step']):7.2f} s step  {statistics.median(figures['compute']):6.2f} s compute+write"
        f"  | one-row {statistics.median(figures['one_row_step']):5.2f} s step  {statistics.median(figures['one_row_compute']):5.2f} s compute+write"
        f"  | q4 equals batch SQL: {figures['q4_matches']}",
        f"{'':8s} round trips per step: {rpcs(figures['rpcs'])}; one-row: {rpcs(figures['one_row_rpcs'])}",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1000, help="Nexmark events per step")
    parser.add_argument("--steps", type=int, default=5, help="measured steps of each kind (medians)")
    parser.add_argument("--warmup", type=int, default=2, help="unrecorded steps of each kind first")
    parser.add_argument("--modes", nargs="+", default=["connect", "classic"], choices=["connect", "classic", "cluster"])
    parser.add_argument("--stores", nargs="+", default=["local"], choices=["local", "s3"])
    parser.add_argument("--mode", help=argparse.SUPPRESS)  # a child process measuring one mode
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--s3", help=argparse.SUPPRESS)  # the child's store: this S3 server's new bucket
    args = parser.parse_args()
    if args.mode:
        print(json.dumps(child_figures(args)))
        return
    lines = [f"demo circuit, {args.events} events per step, {args.steps} steps after {args.warmup} warm-up, medians"]
    steps: dict[tuple[str, str], float] = {}
    with contextlib.ExitStack() as stack:
        s3 = stack.enter_context(s3_server()) if "s3" in args.stores else None
        for mode in args.modes:
            url = stack.enter_context(connect_server_on(mode)) if mode != "classic" else ""
            for store in args.stores:
                child = [sys.executable, __file__, "--mode", "classic" if mode == "classic" else "connect"]
                child += ["--url", url, "--events", str(args.events), "--steps", str(args.steps)]
                child += ["--warmup", str(args.warmup), *(["--s3", s3.endpoint] if store == "s3" else [])]
                # A trace goes to the terminal; otherwise the children's Spark logging is dropped.
                err = None if os.environ.get("LEAN_TRACE") else subprocess.DEVNULL
                out = subprocess.run(child, check=True, stdout=subprocess.PIPE, stderr=err, text=True).stdout
                figures = json.loads(out.strip().splitlines()[-1])
                steps[mode, store] = statistics.median(figures["step"])
                lines += summary(mode if len(args.stores) == 1 else f"{mode}/{store}", figures)
    for mode in args.modes:
        if len(args.stores) == 2:
            ratio = steps[mode, "s3"] / steps[mode, "local"]
            lines.append(f"{mode}: a step with the store on S3 / on the local disk: {ratio:.2f}x")
    for store in args.stores:
        if {"cluster", "connect"} <= set(args.modes):
            ratio = steps["cluster", store] / steps["connect", store]
            lines.append(f"{store} store: a step on the two-worker standalone cluster / on local[2]: {ratio:.2f}x")
    print("\n".join(lines))


@contextlib.contextmanager
def connect_server_on(mode: str):
    """A Spark Connect server for ``mode``: on ``local[2]`` (connect), or as the driver of a
    standalone cluster of two one-core workers (cluster), stopped after."""
    from circuits.daemon import free_port
    from circuits.spark import connect_server, stop_connect_server
    from tests.cluster import standalone_cluster

    work = tempfile.mkdtemp(prefix=f"dbsp-lean-{mode}-server-")
    with contextlib.ExitStack() as stack:
        # Each of the cluster's executors has half the heap of the local server's one JVM.
        cluster = mode == "cluster"
        master = stack.enter_context(standalone_cluster(Path(work), memory="2g")) if cluster else "local[2]"
        port = free_port()
        url = connect_server(work, port, master=master, conf={"spark.executor.memory": "2g"} if cluster else None)
        try:
            yield url
        finally:
            stop_connect_server(work, port)


def child_figures(args) -> dict:
    """One mode's figures, the store in a new temporary folder or bucket."""
    if args.s3:
        from tests.s3 import S3Server

        server = S3Server(args.s3)
        root = f"s3://{server.bucket()}/lean"
        server.reach(root)
        return measure(args.mode, args.url, args.events, args.steps, args.warmup, root)
    root = tempfile.mkdtemp(prefix=f"dbsp-lean-{args.mode}-")
    try:
        return measure(args.mode, args.url, args.events, args.steps, args.warmup, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
