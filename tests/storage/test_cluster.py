"""A real multi-process Spark: a standalone master and two workers on loopback, launched
from the pyspark package, driven by a Spark Connect server (the mode of every ``dagster dev``
run), the store on an S3-compatible server (no disk shared by the driver, the executors and
the test).  A pipeline runs on it, an executor is killed in the middle of its steps, and
the output log must equal a run on local Spark and Spark batch SQL.  (A classic driver on
a cluster, ``resources.spark.master``, runs the same engine code: the property tests run
on a classic session too, ``tests/circuits/test_classic_session.py``.)"""

import os
import random
import signal
import subprocess
import sys
import time

import pytest

from circuits.daemon import free_port
from circuits.spark import connect_server, stop_connect_server
from storage import location

from ..cluster import standalone_cluster
from ..s3 import s3_server
from . import workload

STEPS, INTERVAL = 4, 2


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """``spark://`` URL of a master with two one-core workers."""
    with standalone_cluster(tmp_path_factory.mktemp("cluster")) as master:
        yield master


@pytest.fixture(scope="module")
def reference(spark, tmp_path_factory):
    """The output log of the workload on the test session's local Spark."""
    return workload.output_log(workload.drive(spark, str(tmp_path_factory.mktemp("local")), 3, STEPS, INTERVAL), STEPS)


def executors() -> list[int]:
    """Pids of the executor JVMs the workers launched."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"CoarseGrainedExecutorBackend" in f.read():
                    found.append(int(pid))
        except OSError:
            continue  # the process ended meanwhile
    return found


def run_killing_an_executor(root: str, spark_url: str, started, env: dict[str, str] | None = None) -> None:
    """Runs the workload at ``root`` on ``spark_url`` in a process of its own and kills one
    executor once ``started()`` (the pipeline is inside its steps); the run must succeed."""
    run = subprocess.Popen(
        [sys.executable, "-m", "tests.storage.workload", root, "3", str(STEPS), str(INTERVAL), spark_url],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, **(env or {})},
    )
    deadline = time.monotonic() + 240
    while not started() and run.poll() is None:
        assert time.monotonic() < deadline, "the pipeline never started its steps"
        time.sleep(0.2)
    time.sleep(random.uniform(0.0, 1.5))
    running = executors()
    assert len(running) == 2 and run.poll() is None, (running, run.poll() is None or run.stderr.read()[-3000:])
    os.kill(random.choice(running), signal.SIGKILL)
    _, errors = run.communicate(timeout=600)
    assert run.returncode == 0, errors.decode()[-3000:]


@pytest.mark.slow
def test_a_spark_connect_server_driving_the_cluster_with_the_store_on_s3_survives_a_killed_executor(
    spark, cluster, reference, tmp_path
):
    """The mode every ``dagster dev`` run uses, with no disk shared by the driver, the
    executors and the test: the Connect server is the cluster's driver, the store a bucket."""
    state_dir, port = str(tmp_path / "connect"), free_port()
    url = connect_server(state_dir, port, master=cluster, driver_memory="1g", conf=workload.TEST_SPARK_CONF)
    try:
        with s3_server() as s3:
            root = f"s3://{s3.bucket()}/pipelines/p"
            s3.reach(root)
            state = f"{root}/state/"

            def started() -> bool:
                return any(location.listdir(state))

            run_killing_an_executor(root, url, started, {workload.S3_ENDPOINT_ENV: s3.endpoint})
            recovered = workload.drive(spark, root, 3, STEPS, INTERVAL)
            assert workload.output_log(recovered, STEPS) == reference
            for handle, (view, integral) in workload.views_match_logs(recovered, STEPS).items():
                assert view and view == integral, handle
            assert workload.batch_sql_differences(spark, recovered, STEPS) == []
    finally:
        stop_connect_server(state_dir, port)
