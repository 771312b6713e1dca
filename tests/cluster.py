"""A standalone Spark cluster of the tests' (and benchmarks') own: a master and one-core
workers on loopback, launched from the pyspark package, killed with their executors after."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyspark

from circuits.daemon import free_port

SPARK_CLASS = os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-class")


def alive_workers(ui_port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json", timeout=2) as response:
            return sum(w["state"] == "ALIVE" for w in json.load(response)["workers"])
    except OSError:
        return 0


@contextmanager
def standalone_cluster(work: Path, workers: int = 2, memory: str = "1g") -> Iterator[str]:
    """``spark://`` URL of a master with ``workers`` one-core workers (logs in ``work``)."""
    port, ui = free_port(), free_port()
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    master = f"spark://127.0.0.1:{port}"
    commands = [["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port)]]
    commands[0] += ["--webui-port", str(ui)]
    for i in range(workers):
        commands.append(["org.apache.spark.deploy.worker.Worker", master, "--host", "127.0.0.1", "--cores", "1"])
        commands[-1] += ["--memory", memory, "--webui-port", "0", "--work-dir", str(work / f"worker{i}")]
    with open(work / "cluster.log", "wb") as log:
        daemons = [
            subprocess.Popen(
                [SPARK_CLASS, *command], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
            for command in commands
        ]
        try:
            deadline = time.monotonic() + 90
            while alive_workers(ui) < workers:
                if time.monotonic() > deadline:
                    raise RuntimeError((work / "cluster.log").read_text()[-3000:])
                time.sleep(1)
            yield master
        finally:
            for daemon in daemons:
                os.killpg(daemon.pid, signal.SIGKILL)  # the daemons and the executors they started
                daemon.wait()
