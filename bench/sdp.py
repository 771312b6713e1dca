"""One of our step runs, launched through Dagster, against one ``spark-pipelines run``
(Spark Declarative Pipelines, SDP) of the same views file over the same data.

The views are the demo's ``circuits/library/nexmark.sql``, unchanged: SDP's project links
to the file itself and reads the inputs persons, auctions and bids from a second file of
temporary views over Parquet files (SDP's own process has no Delta JARs).  The data:
``--state`` Nexmark events (the demo producer's, events ``0..state``) written as Parquet
files, and loaded as step 0 of the demo pipeline directly (``Pipeline.submit`` and
``run`` on the embedded Spark Connect server that ``dbsp dev`` then uses); then, per
round, the next ``--events`` events: produced to the embedded broker, where the offset
sensor cuts a step and launches its run (``bench/dagster_launch.py``), and appended as
one more Parquet file per input for SDP, which then runs once (it truncates and
recomputes every materialized view).  ``--warmup`` rounds come first, unrecorded.
``--warm-steps`` steps of ours (with no SDP run) before them bring the step worker's Spark
server to the steady state of a long-lived one: its JVM compiles the planner's code as
it runs it, and on 2 cores a 1,000-event step takes 30-40 steps to settle (a fresh
server's first ten take 1.3-2x a settled one's: ``bench/server_settling.py``).  SDP's side is a new server each run, as
``spark-pipelines run`` is.

Reported per side: ours, launch to success (queue wait + run, from Dagster's run
records) and the run alone; SDP, the wall time of the ``spark-pipelines run`` process
(which starts a Spark Connect server of its own, as a user's run does) and, from its
log, the time from "Starting run" to "Run is COMPLETED".  Medians and the spread of the
recorded rounds, and the ratios ours / SDP.  A round whose step run did not hold exactly
its ``--events`` events (the sensor cuts a step 3 s after its first record, so a slow
produce splits the round's events) is printed and not recorded.  At the end, each view's
rows as our pipeline maintains them must equal SDP's table.

SDP needs a venv of its own, outside the repository, with the project's PySpark (PyPI):

    python3 -m venv /work/sdp-venv && /work/sdp-venv/bin/pip install "pyspark[pipelines]==4.2.0"

    python bench/sdp.py --sdp-python /work/sdp-venv/bin/python --state 1000000 --events 1000 --runs 3
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import datetime

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import functions as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common import rounded
from dagster_launch import PIPELINE, Served, project

from circuits.daemon import free_port, listening
from circuits.library.nexmark import SCHEMAS, nexmark_records
from circuits.library.nexmark_queries import NEXMARK_SQL
from circuits.zset import WEIGHT, parse_schema
from dagster_project.config import parse_project
from dagster_project.factory import open_pipeline
from dagster_project.resources import SparkResource, StoreResource
from storage.delta import arrow_schema
from storage.logs import Range
from storage.views import read_view

FILE_EVENTS = 100_000  # events per Parquet file of the state, to bound the generator's memory
SDP_PORT = 15002
SDP_LOG = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d): (Starting run|Run is COMPLETED)")


def write_events(data: str, start: int, count: int) -> None:
    """Events ``start..start+count`` of the demo producer as one Parquet file per input."""
    for name, records in nexmark_records(start, count).items():
        os.makedirs(os.path.join(data, name), exist_ok=True)
        table = pa.Table.from_pylist(records, arrow_schema(parse_schema(SCHEMAS[name])))
        pq.write_table(table, os.path.join(data, name, f"events-{start:012d}.parquet"))


def write_state(data: str, events: int) -> None:
    """Events ``0..events`` as :func:`write_events` writes them, :data:`FILE_EVENTS` a file."""
    for start in range(0, events, FILE_EVENTS):
        write_events(data, start, min(FILE_EVENTS, events - start))


def load_state(settings: dict, data: str, events: int) -> None:
    """Step 0 of the demo pipeline: every event under ``data``, read by Spark from the
    Parquet files SDP reads, on the embedded Spark server the pipeline's runs use."""
    spec = parse_project(settings, "the bench's project").pipelines[0]
    resources = settings["resources"]
    pipeline = open_pipeline(spec, SparkResource(**resources["spark"]), StoreResource(**resources["store"]))
    spark = pipeline.spark
    inputs = {
        name: spark.read.schema(parse_schema(ddl)).parquet(os.path.join(data, name)).withColumn(WEIGHT, F.lit(1))
        for name, ddl in SCHEMAS.items()
    }
    pipeline.submit(0, inputs, [Range("bench-load", 0, 0, events)])
    pipeline.run()
    spark.stop()


def sdp_project(directory: str, views: str, inputs: dict[str, str]) -> str:
    """An SDP project: the ``views`` file itself (linked), a second file of the inputs as
    temporary views (``inputs``: per name what it selects from, such as a Parquet folder's
    ``parquet.`path```), and the spec.  Returns the spec's path."""
    os.makedirs(directory)
    os.symlink(views, os.path.join(directory, "views.sql"))
    with open(os.path.join(directory, "sources.sql"), "w") as f:
        for name, relation in inputs.items():
            f.write(f"CREATE TEMPORARY VIEW {name} AS SELECT * FROM {relation};\n")
    spec = os.path.join(directory, "spark-pipeline.yml")
    with open(spec, "w") as f:
        f.write(
            f"name: views\nstorage: file://{directory}/storage\nlibraries:\n"
            "  - glob:\n      include: views.sql\n  - glob:\n      include: sources.sql\n"
        )
    return spec


def run_sdp(python: str, spec: str, log: str, jars: list[str] = (), conf: dict[str, str] | None = None) -> dict:
    """One ``spark-pipelines run`` (with ``jars`` on its driver's class path and the Spark
    settings ``conf``): its wall seconds, and those from "Starting run" to "Run is
    COMPLETED" in its log.  The hive catalog lets a second run replace the tables (the
    default in-memory catalog fails with LOCATION_ALREADY_EXISTS)."""
    if listening(SDP_PORT):
        # PySpark's client of the server SDP starts always dials localhost:15002.
        raise RuntimeError(f"port {SDP_PORT} is taken: spark-pipelines would run on that server; stop it (dbsp stop)")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "SPARK_HOME")}
    env["PYSPARK_PYTHON"] = python
    command = [os.path.join(os.path.dirname(python), "spark-pipelines"), "run", "--spec", spec]
    if jars:  # for the JVM its Python process starts for the session (--conf would reach only the first)
        env["PYSPARK_SUBMIT_ARGS"] = f"--driver-class-path {':'.join(jars)} pyspark-shell"
    settings = {"spark.sql.catalogImplementation": "hive", **(conf or {})}
    command += [*(f for k, v in settings.items() for f in ("--conf", f"{k}={v}")), "--driver-memory", "4g"]
    started = time.perf_counter()
    with open(log, "w") as out:
        subprocess.run(command, cwd=os.path.dirname(spec), env=env, stdout=out, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - started
    with open(log) as f:
        stamps = {m[2]: datetime.fromisoformat(m[1]) for m in map(SDP_LOG.match, f) if m}
    if "Run is COMPLETED" not in stamps:
        raise RuntimeError(f"spark-pipelines run did not complete; see {log}")
    return {"wall": wall, "run": (stamps["Run is COMPLETED"] - stamps["Starting run"]).total_seconds()}


def shifted(state: int):
    """The demo producer continuing after the ``state`` events loaded directly."""
    return lambda start, count, seed: nexmark_records(state + start, count, seed)


def same_rows(pipeline_root: str, warehouse: str) -> dict[str, bool]:
    """Per materialized view: whether our current view holds exactly SDP's table's rows."""
    found = {}
    for view in os.listdir(warehouse):
        ours = read_view(pipeline_root, view).table
        theirs = pq.read_table(os.path.join(warehouse, view)).select(ours.column_names)
        found[view] = rounded(Counter(tuple(r.values()) for r in ours.to_pylist())) == rounded(
            Counter(tuple(r.values()) for r in theirs.to_pylist())
        )
    return found


def spread(values: list[float]) -> str:
    return f"median {statistics.median(values):6.2f} s (min {min(values):.2f}, max {max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sdp-python", required=True, help="the python of a venv with pyspark[pipelines]")
    parser.add_argument("--state", type=int, default=1_000_000, help="events loaded before the runs")
    parser.add_argument("--events", type=int, default=1000, help="events added per run")
    parser.add_argument("--runs", type=int, default=3, help="recorded rounds (one run of each side)")
    parser.add_argument("--warmup", type=int, default=1, help="unrecorded rounds first")
    parser.add_argument("--warm-steps", type=int, default=0, help="steps of ours alone before the rounds")
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="dbsp-sdp-")
    data = os.path.join(root, "data")
    write_state(data, args.state)
    spec = sdp_project(
        os.path.join(root, "sdp"), str(NEXMARK_SQL), {n: f"parquet.`{os.path.join(data, n)}`" for n in SCHEMAS}
    )
    broker, spark = free_port(), free_port()
    settings = project(root, args.events, broker, spark)
    os.environ["DBSP_HOME"] = os.path.join(root, "home")  # as Served sets it: one embedded Spark server
    started = time.perf_counter()
    load_state(settings, data, args.state)
    print(f"state: {args.state:,} events loaded as step 0 in {time.perf_counter() - started:.1f} s", flush=True)
    served = Served(root, args.events, broker, spark)
    ours, sdp = [], []
    try:
        for i in range(args.warm_steps):
            served.step(args.events, shifted(args.state))
            print(f"warm step {i + 1} of {args.warm_steps}", end="\r", flush=True)
        if args.warm_steps:  # SDP's input gets the same events, in one file per input
            write_events(data, args.state, args.warm_steps * args.events)
        for i in range(args.warmup + args.runs):
            first = args.state + (args.warm_steps + i) * args.events
            step = served.step(args.events, shifted(args.state))
            write_events(data, first, args.events)
            run = run_sdp(args.sdp_python, spec, os.path.join(root, f"sdp-{i}.log"))
            whole = step["rows_in"] == args.events
            print(
                f"round {i}: ours {step['queue']:.2f} + {step['run']:.2f} s ({step['rows_in']:,} rows), "
                f"SDP {run['wall']:.2f} s"
                + ("" if whole else ": the step did not hold the round's events, not recorded"),
                flush=True,
            )
            if i >= args.warmup and whole:
                ours.append(step)
                sdp.append(run)
        equal = same_rows(os.path.join(root, "pipelines", PIPELINE), os.path.join(root, "sdp", "spark-warehouse"))
    finally:
        served.stop()
    if not ours:
        raise SystemExit("no round's step held exactly its round's events: the sensor cut them otherwise")
    launch = [s["queue"] + s["run"] for s in ours]
    print(
        f"{args.state:,} events of state, +{args.events:,} per run, {len(ours)} of {args.runs} rounds after {args.warmup} warm-up"
        f" and {args.warm_steps} warm steps of ours"
    )
    print(f"  ours, launch to success     {spread(launch)}")
    print(f"  ours, the run alone         {spread([s['run'] for s in ours])}")
    for phase in ours[0]["phases"]:
        print(f"    the step's {phase:18s}{spread([s['phases'].get(phase, 0.0) for s in ours])}")
    print(f"  SDP, spark-pipelines run    {spread([r['wall'] for r in sdp])}")
    print(f"  SDP, Starting run..COMPLETED {spread([r['run'] for r in sdp])}")
    ratios = [o / r["wall"] for o, r in zip(launch, sdp)]
    print(
        f"  ours / SDP (launch to success / spark-pipelines run): {statistics.median(launch) / statistics.median([r['wall'] for r in sdp]):.2f}x"
        f" (per round {min(ratios):.2f}..{max(ratios):.2f})"
    )
    print(
        f"  ours / SDP (run alone / Starting run..COMPLETED): "
        f"{statistics.median([s['run'] for s in ours]) / statistics.median([r['run'] for r in sdp]):.2f}x"
    )
    print(
        "  views equal to SDP's tables: " + ", ".join(f"{v} {'yes' if e else 'NO'}" for v, e in sorted(equal.items()))
    )
    shutil.rmtree(root, ignore_errors=True)
    if not all(equal.values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
