"""Recovery after a crash: time to reopen the last checkpoint and replay ``--steps`` steps,
against the time those same steps took the first time.

Three child processes, each with a fresh SparkSession (its start is timed apart):

1. load: step 0 loads ``--bids`` bids over ``--bids // 15`` auctions and is checkpointed
   in its own run; then the input of steps 1..``--steps`` (``--delta`` new bids each) is
   submitted (division recorded, input persisted), not run.
2. first: ``Pipeline.run()`` runs the steps in one run and is killed with SIGKILL
   (``DBSP_FAULT=after_output:<steps>``) once the last step's output is committed,
   before the run's checkpoint: all the work is done, none of it checkpointed.
3. recover: ``Pipeline.run()`` again: opens the checkpoint of step 0 (restoring every
   state table the crashed run advanced), replays the steps (each step's output, already
   in the output log, is verified and discarded) and commits the checkpoint.  Then the
   result is checked: committed step ``steps + 1``; each step's output exactly once (same
   row count per ``_step`` as the crashed run left); and, for every step ``k``, the
   integral of the output through ``k`` equals Spark batch SQL
   (``RECOMPUTE_SQL[query]``) over every auction and bid submitted through ``k``.

First time: from the start of the crashed ``run()`` to its last output commit (its
``open`` included).  Recovery: the whole ``run()``, split into open/restore (the
constant), replay (open end to the last output commit), checkpoint.  The target is
recovery <= 1.2 x first time + the constant.

    python bench/recovery.py --bids 100000 --delta 1000 --query bids_by_category
    python bench/recovery.py --bids 100000 --delta 1000 --query q4
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

PHASES = ("load", "first", "recover")
EVENT = "@@ "  # a child's stdout line carrying a JSON event for the parent
PROJECT = Path(__file__).resolve().parents[1]
TIMING_KEYS = ("open", "read", "compute_and_write", "output_commit", "checkpoint_commit")


# -- child processes ---------------------------------------------------------------------------


def emit(kind: str, **fields) -> None:
    """Hands an event to the parent at once (the process may be killed right after)."""
    print(EVENT + json.dumps({"kind": kind, **fields}), flush=True)


def auction_count(args: argparse.Namespace) -> int:
    return max(args.bids // 15, 1)


def step_bids(args: argparse.Namespace, step: int) -> tuple[int, int]:
    """The bid ids ``first..end`` (end exclusive) that step ``step`` inserts."""
    if step == 0:
        return 0, args.bids
    first = args.bids + (step - 1) * args.delta
    return first, first + args.delta


def start_child(args: argparse.Namespace):
    from circuits.library import nexmark_circuit
    from circuits.spark import local_session
    from storage.pipeline import Pipeline

    started = time.perf_counter()
    spark = local_session(
        cores=2, app_name=f"bench-recovery-{args.phase}", extra={"spark.driver.memory": args.driver_memory}
    )
    emit("session", seconds=time.perf_counter() - started)
    return spark, Pipeline(spark, args.root, nexmark_circuit("bench", (args.query,)), workers=args.workers)


def instrumented_run(pipeline) -> int:
    """``pipeline.run()``, emitting the end of its ``open`` and every output commit (seconds
    since the run started, with the pipeline's phase timings so far)."""
    import storage.pipeline as pipeline_module

    original_open, original_failpoint = pipeline.open, pipeline_module.failpoint
    started = time.perf_counter()

    def open_() -> None:
        with pipeline.timed("open"):
            original_open()
        emit("opened", at=time.perf_counter() - started)

    def failpoint(point: str, step: int) -> None:
        if point == "after_output":  # the step's output is committed; its checkpoint is not
            emit("step", step=step, at=time.perf_counter() - started, timings=dict(pipeline.timings))
        original_failpoint(point, step)  # DBSP_FAULT=after_output:<step> dies here

    pipeline.open = open_
    pipeline_module.failpoint = failpoint
    try:
        next_step = pipeline.run()
    finally:
        del pipeline.open
        pipeline_module.failpoint = original_failpoint
    emit("done", at=time.perf_counter() - started, next_step=next_step, timings=dict(pipeline.timings))
    return next_step


def load(args: argparse.Namespace) -> None:
    from common import auctions, bids, timed

    from storage.logs import Range

    spark, pipeline = start_child(args)
    count = auction_count(args)
    first, end = step_bids(args, 0)
    pipeline.submit(
        0,
        {"auctions": auctions(spark, count), "bids": bids(spark, first, end - first, count)},
        [Range("bids", 0, first, end)],
    )
    emit("loaded", seconds=timed(pipeline.run))
    started = time.perf_counter()
    for step in range(1, args.steps + 1):
        first, end = step_bids(args, step)
        pipeline.submit(step, {"bids": bids(spark, first, end - first, count)}, [Range("bids", 0, first, end)])
    emit("submitted", seconds=time.perf_counter() - started)
    spark.stop()


def first_run(args: argparse.Namespace) -> None:
    spark, pipeline = start_child(args)
    instrumented_run(pipeline)
    spark.stop()  # only reached when the fault point did not fire: the parent reports it


def recover(args: argparse.Namespace) -> None:
    from common import auctions, bids, rounded
    from deltalake import DeltaTable

    from circuits.library.nexmark_queries import RECOMPUTE_SQL
    from storage.delta import delta_tables
    from storage.pipeline import status

    spark, pipeline = start_child(args)
    run_started = time.time() * 1000
    next_step = instrumented_run(pipeline)

    # What the run did besides the steps: Delta restores (at open) and checks.
    restored = sum(
        1
        for uri in delta_tables(args.root)
        for entry in DeltaTable(uri).history()
        if entry.get("operation") == "RESTORE" and entry.get("timestamp", 0) >= run_started
    )
    rows = [r.asDict() for r in pipeline.outputs.read(args.query, 0, args.steps).collect()]
    per_step = Counter(r["_step"] for r in rows)
    count = auction_count(args)
    auctions(spark, count).drop("_weight").createOrReplaceTempView("auctions")
    mismatches = []
    integral: Counter = Counter()
    for step in range(args.steps + 1):
        bids(spark, 0, step_bids(args, step)[1], count).drop("_weight").createOrReplaceTempView("bids")
        batch = spark.sql(RECOMPUTE_SQL[args.query])
        columns, reference = batch.columns, batch.collect()
        for r in rows:
            if r["_step"] == step:
                integral[tuple(r[c] for c in columns)] += r["_weight"]
        ours = Counter({row: w for row, w in integral.items() if w != 0})
        expected = Counter(tuple(r) for r in reference)
        if rounded(ours) != rounded(expected):
            mismatches.append({"step": step, "expected": str(sorted(expected)), "got": str(sorted(ours.items()))})
    emit(
        "verified",
        next_step=next_step,
        committed_step=status(args.root).committed_step,
        rows_per_step={str(k): v for k, v in sorted(per_step.items())},
        mismatches=mismatches,
        restored_tables=restored,
    )
    spark.stop()


# -- the parent ----------------------------------------------------------------------------------


def child(args: argparse.Namespace, phase: str, fault: str | None = None) -> tuple[list[dict], int, float]:
    """Runs ``phase`` in a child process; returns its events, exit code and wall time.
    Afterwards nothing of it is left running (its JVM included: same process group)."""
    command = [
        sys.executable,
        __file__,
        "--phase",
        phase,
        "--query",
        args.query,
        "--bids",
        str(args.bids),
        "--delta",
        str(args.delta),
        "--steps",
        str(args.steps),
        "--workers",
        str(args.workers),
        "--root",
        args.root,
        "--driver-memory",
        args.driver_memory,
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT), os.environ.get("PYTHONPATH")]))}
    env.pop("DBSP_FAULT", None)
    if fault:
        env["DBSP_FAULT"] = fault
    events: list[dict] = []
    started = time.perf_counter()
    with tempfile.TemporaryFile() as stderr:
        process = subprocess.Popen(
            command, cwd=PROJECT, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True, start_new_session=True
        )
        try:
            for line in process.stdout:
                if line.startswith(EVENT):
                    events.append(json.loads(line[len(EVENT) :]))
                    progress(phase, events[-1])
                else:
                    print(f"  [{phase}] {line}", end="", flush=True)
            process.wait()
        finally:
            reap(process)
        wall = time.perf_counter() - started
        if process.returncode not in (0, -signal.SIGKILL):
            stderr.seek(0)
            tail = stderr.read().decode(errors="replace")[-4000:]
            raise SystemExit(f"{phase} failed (exit {process.returncode}):\n{tail}")
    return events, process.returncode, wall


def reap(process: subprocess.Popen) -> None:
    """Ends what is left of the child's process group (a killed driver's JVM exits by
    itself once its stdin closes; give it a few seconds, then kill it)."""
    if process.poll() is None:
        process.kill()
        process.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.killpg(process.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def progress(phase: str, event: dict) -> None:
    kind = event["kind"]
    if kind == "step":
        print(f"  [{phase}] step {event['step']} output committed at {event['at']:.1f} s", flush=True)
    elif kind in ("session", "loaded", "submitted"):
        print(f"  [{phase}] {kind}: {event['seconds']:.1f} s", flush=True)
    elif kind in ("opened", "done"):
        print(f"  [{phase}] {kind} at {event['at']:.1f} s", flush=True)


def output_log(root: str, query: str) -> dict:
    """The committed output log (delta-rs, no Spark): its Delta version, the last step it
    recorded, and its rows per ``_step`` (a step whose output is empty has none)."""
    from deltalake import DeltaTable

    from storage.logs import output_uri

    table = DeltaTable(output_uri(root, query))
    steps = table.to_pyarrow_table(columns=["_step"]).column("_step").to_pylist()
    return {
        "version": table.version(),
        "last_step": table.transaction_version("output"),
        "rows_per_step": {str(k): v for k, v in sorted(Counter(steps).items())},
    }


def only(events: list[dict], kind: str) -> dict:
    found = [e for e in events if e["kind"] == kind]
    if len(found) != 1:
        raise SystemExit(f"expected one {kind!r} event from the child, got {len(found)}")
    return found[0]


def run_figures(events: list[dict], steps: int) -> dict:
    """From a run's events: open end, per-step seconds, and the last output commit."""
    opened = only(events, "opened")["at"]
    marks = {e["step"]: e for e in events if e["kind"] == "step"}
    if sorted(marks) != list(range(1, steps + 1)):
        raise SystemExit(f"expected output commits of steps 1..{steps}, got {sorted(marks)}")
    at = [opened] + [marks[s]["at"] for s in range(1, steps + 1)]
    return {
        "opened": opened,
        "last_output": at[-1],
        "per_step": [b - a for a, b in itertools.pairwise(at)],
        "timings": marks[steps]["timings"],
    }


def parent(args: argparse.Namespace) -> None:
    from storage.pipeline import status

    shutil.rmtree(args.root, ignore_errors=True)
    print(
        f"{args.query}: {args.bids:,} bids over {auction_count(args):,} auctions in step 0, then {args.steps} steps "
        f"of {args.delta:,} bids; {args.workers} workers; root {args.root}",
        flush=True,
    )

    loaded, _, load_wall = child(args, "load")
    fault = f"after_output:{args.steps}"
    crashed, code, first_wall = child(args, "first", fault)
    if code != -signal.SIGKILL:
        raise SystemExit(f"the first run was not killed at {fault} (exit {code})")
    if status(args.root).committed_step != 1:
        raise SystemExit(f"after the crash the committed step is {status(args.root).committed_step}, expected 1")
    log_before = output_log(args.root, args.query)
    recovered, _, recover_wall = child(args, "recover")

    first = run_figures(crashed, args.steps)
    replay = run_figures(recovered, args.steps)
    done = only(recovered, "done")
    verified = only(recovered, "verified")
    first_s = first["last_output"]
    open_s = replay["opened"]
    replay_s = replay["last_output"] - replay["opened"]
    total_s = done["at"]
    checkpoint_s = total_s - replay["last_output"]

    print(
        f"\n{args.query}, {args.bids:,} bids of state, {args.steps} steps of {args.delta:,} bids, {args.workers} workers\n"
    )
    print(
        "| first s | recovery s | open/restore s | replay s | checkpoint s | (recovery - open)/first | replay/first steps |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    print(
        f"| {first_s:.1f} | {total_s:.1f} | {open_s:.2f} | {replay_s:.1f} | {checkpoint_s:.2f} "
        f"| {(total_s - open_s) / first_s:.2f} | {replay_s / (first_s - first['opened']):.2f} |"
    )
    print(
        "\nfirst s: the crashed run from its start to step "
        f"{args.steps}'s output commit (its own open: {first['opened']:.2f} s); replay/first steps leaves both opens out."
    )
    sessions = {
        phase: only(events, "session")["seconds"] for phase, events in zip(PHASES, (loaded, crashed, recovered))
    }
    print(
        f"SparkSession start s: load {sessions['load']:.1f}, first {sessions['first']:.1f}, recover {sessions['recover']:.1f}; "
        f"process wall s: load {load_wall:.1f}, first {first_wall:.1f}, recover {recover_wall:.1f} (recover includes the checks)"
    )
    print(
        f"step 0 run: {only(loaded, 'loaded')['seconds']:.1f} s; submitting steps 1..{args.steps}: "
        f"{only(loaded, 'submitted')['seconds']:.1f} s"
    )

    print("\n| step | first s | replay s |")
    print("| ---: | ---: | ---: |")
    for step, (a, b) in enumerate(zip(first["per_step"], replay["per_step"]), start=1):
        print(f"| {step} | {a:.2f} | {b:.2f} |")
    print("\n| phase (Pipeline.timings) | first s | recovery s |")
    print("| --- | ---: | ---: |")
    for key in TIMING_KEYS:
        print(f"| {key} | {first['timings'].get(key, 0.0):.2f} | {done['timings'].get(key, 0.0):.2f} |")
    print(
        "(first: up to the last step's output commit; recovery: the whole run. Recovery's output_commit includes "
        "verifying each replayed output against the one logged before.)"
    )

    log_after = output_log(args.root, args.query)
    problems = []
    if verified["next_step"] != args.steps + 1 or verified["committed_step"] != args.steps + 1:
        problems.append(
            f"committed step {verified['committed_step']} (run returned {verified['next_step']}), "
            f"expected {args.steps + 1}"
        )
    if log_before["last_step"] != args.steps:
        problems.append(
            f"before the recovery the output log's last step is {log_before['last_step']}, expected {args.steps}"
        )
    if log_after != log_before:  # the replay must commit nothing to the output log
        problems.append(f"the recovery changed the output log: before {log_before}, after {log_after}")
    if verified["rows_per_step"] != log_after["rows_per_step"]:
        problems.append(
            f"rows per step read by Spark {verified['rows_per_step']} != delta-rs {log_after['rows_per_step']}"
        )
    problems += [
        f"step {m['step']}: output integral {m['got']} (row, weight) differs from batch SQL {m['expected']}"
        for m in verified["mismatches"]
    ]
    print(
        f"\nstate tables restored at open: {verified['restored_tables']}; output log: Delta version "
        f"{log_after['version']}, last step {log_after['last_step']}, rows per step {log_after['rows_per_step']}"
    )
    if problems:
        raise SystemExit("verification FAILED:\n  " + "\n  ".join(problems))
    print(
        f"verified: committed step {args.steps + 1}; output log of steps 0..{args.steps} untouched by the replay "
        "(same Delta version and rows per step as the crash left); output integral through every step = "
        "RECOMPUTE_SQL over its inputs"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--query", choices=["bids_by_category", "q4"], default="bids_by_category")
    parser.add_argument("--bids", type=int, default=100_000, help="bids loaded in step 0")
    parser.add_argument("--delta", type=int, default=1000, help="new bids per step")
    parser.add_argument("--steps", type=int, default=10, help="steps run, crashed, and replayed")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--root", default="/tmp/dbsp-bench-recovery")
    parser.add_argument("--driver-memory", default="8g")
    parser.add_argument("--phase", choices=PHASES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    {"load": load, "first": first_run, "recover": recover, None: parent}[args.phase](args)


if __name__ == "__main__":
    main()
