"""The source gateway's footprint (issue 31): what a started gateway process loads and holds.

Two processes, each started fresh against one bundled broker, with ``--sources`` generator
sources writing a line a second each:

* ``gateway module``: a process that imports ``gateway.gateway`` (and the cursor table of
  ``storage.cursors``, which the gateway is handed) and runs a ``Gateway``;
* ``dbsp gateway``: the command a user runs (``dagster_project.cli``'s ``gateway``).

For each: seconds from the process's start until its control endpoint answered a flush,
resident memory then (``VmRSS`` of ``/proc/<pid>/status``), the modules loaded when the
endpoint came up, and which of PySpark, delta-rs and pyarrow are among them.

    python bench/gateway_footprint.py --sources 100
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import yaml

from gateway.control import call, running_url
from sensors.broker import LocalBroker, ensure_topics

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEAVY = ("pyspark", "deltalake", "pyarrow")
TOPIC = "footprint"

REPORTER = """
import json, os, sys, threading, time


def _report(state, out):
    # Once the control endpoint is up (its state file written): the modules loaded so far.
    while not os.path.exists(state):
        time.sleep(0.05)
    with open(out, "w") as f:
        json.dump(sorted(sys.modules), f)


threading.Thread(target=_report, args=(os.environ["FOOTPRINT_STATE"], os.environ["FOOTPRINT_OUT"]), daemon=True).start()
"""

MODULE_CHILD = f"""
from gateway.config import GatewaySpec, GeneratorSpec
from gateway.gateway import Gateway
from storage.cursors import CursorStore

bootstrap, sources, home = sys.argv[1], int(sys.argv[2]), sys.argv[3]
spec = GatewaySpec(buffers=2 * sources + 16)
group = GeneratorSpec(kind="generator", name="g", topic="{TOPIC}", count=sources, lines=10**9, rate=1.0)
config = {{}}
gateway = Gateway(spec, [group], bootstrap, config, home, CursorStore.of_gateway(spec.cursors, home), timeout=60)
gateway.start()
sys.stdin.read()
gateway.stop()
"""

CLI_CHILD = """
from dagster_project.cli import main

sys.exit(main(sys.argv[1:]))
"""


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        kib = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return round(kib / 1024, 1)


def measure(child: str, args: list[str], home: str, env: dict) -> dict:
    """Starts ``child`` (after :data:`REPORTER`) and waits until its gateway answers a flush."""
    out = home + ".modules.json"
    env = env | {"FOOTPRINT_STATE": os.path.join(home, "gateway.json"), "FOOTPRINT_OUT": out}
    command = [sys.executable, "-c", REPORTER + child, *args]
    began = time.perf_counter()
    process = subprocess.Popen(command, env=env, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    try:
        while running_url(home) is None or not os.path.exists(out):
            if process.poll() is not None:
                raise SystemExit(f"the gateway process ended with {process.returncode}: {' '.join(args)}")
            time.sleep(0.05)
        call(running_url(home), "/flush", timeout=60)
        started = time.perf_counter() - began
        rss = rss_mib(process.pid)
        with open(out) as f:
            modules = json.load(f)
    finally:
        process.stdin.close()
        process.terminate()
        process.wait(60)
    heavy = [h for h in HEAVY if any(m == h or m.startswith(h + ".") for m in modules)]
    return {"started_seconds": round(started, 2), "rss_mib": rss, "modules": len(modules), "heavy": heavy}


def dbsp_config(directory: str, bootstrap: str, sources: int) -> str:
    settings = {
        "pipelines": [
            {
                "name": "footprint",
                "circuit": "circuits.library.nexmark_queries:nexmark_circuit",
                "sources": {"persons": f"{TOPIC}.persons", "auctions": f"{TOPIC}.auctions", "bids": TOPIC},
                "sinks": ["q3"],
            }
        ],
        "sources": [{"kind": "generator", "name": "g", "topic": TOPIC, "count": sources, "lines": 10**9, "rate": 1.0}],
        "gateway": {"buffers": 2 * sources + 16},
        "resources": {
            "kafka": {
                "bootstrap_servers": bootstrap,
                "config": {},
            },
            "store": {"root": os.path.join(directory, "store")},
        },
    }
    path = os.path.join(directory, "dbsp.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(settings, f)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sources", type=int, default=100)
    args = parser.parse_args()
    env = os.environ | {"PYTHONPATH": ROOT}
    with LocalBroker() as broker, tempfile.TemporaryDirectory() as directory:
        ensure_topics(broker.bootstrap, {TOPIC: 2})
        home = os.path.join(directory, "module")
        dbsp_home = os.path.join(directory, "home")
        cli = ["--config", dbsp_config(directory, broker.bootstrap, args.sources), "gateway", "--report-every", "60"]
        rows = {
            "gateway module": measure(MODULE_CHILD, [broker.bootstrap, str(args.sources), home], home, env),
            "dbsp gateway": measure(CLI_CHILD, cli, os.path.join(dbsp_home, "gateway"), env | {"DBSP_HOME": dbsp_home}),
        }
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
