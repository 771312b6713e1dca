"""Crash injection: kill -9 a pipeline process at every named fault point and at random
moments; after recovery the output log equals that of a run without crashes, step by step.

Each recovered run's current views must equal the integrals of their change logs too.
``DBSP_CRASH_RUNS`` sets how many crash runs (default 8: every fault point once, plus
a random kill at any moment); the full campaign is ``DBSP_CRASH_RUNS=50``.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from storage.faults import POINTS

from ..conftest import CLASSIC
from . import workload

STEPS, INTERVAL = 3, 2  # checkpoints after steps 1 and 2
RUNS = int(os.environ.get("DBSP_CRASH_RUNS", "8"))
PROJECT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def reference(spark, tmp_path_factory):
    root = str(tmp_path_factory.mktemp("reference"))
    return workload.output_log(workload.drive(spark, root, 0, STEPS, INTERVAL), STEPS)


@pytest.fixture(scope="module")
def worker_spark(request) -> str:
    """Where a crash worker computes: a session of its own on the test session's Spark
    Connect server, as a ``dbsp step`` or the step worker has (the server outlives the
    killed client, and so may its last Spark job: delta-rs commits in the client, so
    what that job writes is never committed); ``local[1]`` on a classic run."""
    return "local[1]" if os.environ.get(CLASSIC) else request.getfixturevalue("connect_url")


def scenarios(count: int):
    """Every fault point at a step, then random kills after a random delay."""
    rng = random.Random(2026)
    for i in range(count):
        if i < len(POINTS):
            # every point is reached at the last step of a checkpoint interval
            yield f"{POINTS[i]}:{rng.choice([INTERVAL - 1, STEPS - 1])}", None
        else:
            yield None, rng.uniform(1, 12)


def crash(root: str, fault: str | None, kill_after: float | None, master: str) -> bool:
    """Runs the workload on ``master`` in a subprocess that dies at ``fault`` or is killed
    after ``kill_after`` seconds.  Returns whether it died (it may finish first)."""
    env = {**os.environ, "PYTHONPATH": str(PROJECT)}
    if fault:
        env["DBSP_FAULT"] = fault
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.storage.workload", root, "0", str(STEPS), str(INTERVAL), master],
        cwd=PROJECT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        process.wait(timeout=kill_after if kill_after else 300)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGKILL)
        process.wait()
    if process.returncode not in (0, -signal.SIGKILL):
        raise AssertionError(f"worker failed: {process.stderr.read().decode()[-3000:]}")
    return process.returncode == -signal.SIGKILL


@pytest.mark.slow
def test_recovery_after_kill_9_matches_a_run_without_crashes(spark, reference, worker_spark, tmp_path):
    crashes, covered, mismatches = 0, set(), 0
    for i, (fault, kill_after) in enumerate(scenarios(RUNS)):
        root = str(tmp_path / f"run{i}")
        if crash(root, fault, kill_after, worker_spark):
            crashes += 1
            covered.add(fault.split(":")[0] if fault else "random")
        pipeline = workload.drive(spark, root, 0, STEPS, INTERVAL)
        for handle, (view, integral) in workload.views_match_logs(pipeline, STEPS).items():
            assert view == integral, (
                f"run {i} ({fault or 'random kill'}): view {handle} differs from its log's integral"
            )
        if i == 0:  # every table the engine wrote, read back by Spark's own Delta reader, also by time travel
            assert workload.delta_spark_differences(spark, root) == []
        recovered = workload.output_log(pipeline, STEPS)
        if recovered != reference:
            mismatches += 1
            for handle in reference:
                assert recovered[handle] == reference[handle], (
                    f"run {i} ({fault or f'killed after {kill_after:.1f}s'}), output {handle}: "
                    f"missing {dict(reference[handle] - recovered[handle])}, extra {dict(recovered[handle] - reference[handle])}"
                )
    print(
        f"\ncrash runs: {RUNS}, crashes injected: {crashes}, fault points covered: {sorted(covered)}, mismatches: {mismatches}"
    )
    assert covered >= set(POINTS) or RUNS < len(POINTS)
    assert mismatches == 0


@pytest.mark.slow
def test_a_spark_connect_server_that_dies_mid_step_fails_it_and_the_next_run_recovers(spark, reference, tmp_path):
    """A worker process runs the workload over a Spark Connect server of its own, which is
    killed (SIGKILL) as soon as the first checkpoint is committed, while the worker submits
    and runs the last step.  The worker fails within seconds with an error; the next run
    (here on the test session's server) ends with the same output log."""
    from circuits.daemon import Daemon, free_port
    from circuits.spark import connect_server

    state_dir, port, root = str(tmp_path / "spark"), free_port(), str(tmp_path / "store")
    url = connect_server(state_dir, port, driver_memory="1g", conf=workload.TEST_SPARK_CONF)
    worker = subprocess.Popen(
        [sys.executable, "-m", "tests.storage.workload", root, "0", str(STEPS), str(INTERVAL), url],
        cwd=PROJECT,
        env={**os.environ, "PYTHONPATH": str(PROJECT)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 300
        while not os.path.exists(os.path.join(root, "_checkpoints")) and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(Daemon("spark-connect", port, state_dir).pid(), signal.SIGKILL)
        started = time.monotonic()
        worker.wait(timeout=120)
        assert worker.returncode > 0, "the worker finished before the server died, or did not fail by an error"
        assert time.monotonic() - started < 60
    finally:
        worker.kill()
        Daemon("spark-connect", port, state_dir).stop()
    recovered = workload.drive(spark, root, 0, STEPS, INTERVAL)
    assert workload.output_log(recovered, STEPS) == reference
