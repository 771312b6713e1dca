"""How a step's time settles as a new Spark Connect server runs steps: the demo's SQL
pipeline (``circuits/library/nexmark.sql``, as ``dbsp dev`` runs it) at ``--state`` events
of state, then ``--steps`` steps of ``--events`` events each on a server started for the
run, each step's input kept in the process as a Dagster run keeps it (one checkpoint per
input, read back by the step, not from the input log).

Per step: compute and write (the pipeline's own phase), and the frames the step shared
(``StepContext.share``'s local checkpoints, counted at the step's release).  At the end,
the medians of compute and write by the server's age in steps, and against the last band
(a settled server): the JVM compiles Spark's planner code as it runs it, so a new server's
first steps are slower.  ``--root`` keeps the loaded state for a later run (on a new
server again); ``--url`` runs on a server already up instead.

    python bench/server_settling.py --state 1000000 --events 1000 --steps 64 --root DIR
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import types

import pyarrow as pa
from pyspark.sql import functions as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dagster_launch import project
from sdp import load_state, write_state

from circuits.context import StepContext
from circuits.daemon import free_port
from circuits.library.nexmark import SCHEMAS, nexmark_records
from circuits.spark import stop_connect_server
from circuits.zset import WEIGHT, parse_schema
from dagster_project.config import parse_project
from dagster_project.factory import open_pipeline
from dagster_project.resources import SparkResource, StoreResource
from storage.delta import arrow_schema
from storage.logs import Range

BANDS = ((1, 1), (2, 5), (6, 10), (11, 20), (21, 30), (31, 40), (41, None))
"""Ages of the server in steps (first, last; None: to the end) whose steps are summed up together."""
LOADED = "loaded"


def kept_reader(frames: dict):
    """A step reader (:data:`storage.pipeline.StepReader`) giving ``frames`` (per input,
    checkpointed): the step computes from them, as a Dagster run computes from its read."""

    @contextlib.contextmanager
    def read(spark, division, schemas, taken):
        yield types.SimpleNamespace(inputs=frames, dead_letters=None, taken=None, rest=None)

    return read


def counting_shares(counts: list[int]) -> None:
    """Appends to ``counts`` how many frames each step shared, as the step releases them."""
    release = StepContext.release

    def counted(self: StepContext) -> None:
        counts.append(len(self.shared))
        release(self)

    StepContext.release = counted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--state", type=int, default=1_000_000, help="events loaded before the steps")
    parser.add_argument("--events", type=int, default=1000, help="events per step")
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--root", help="where the pipeline lives (kept; loaded once)")
    parser.add_argument("--port", type=int, help="a Spark Connect server already up (default: a new one)")
    args = parser.parse_args()
    root = args.root or tempfile.mkdtemp(prefix="dbsp-settling-")
    os.makedirs(root, exist_ok=True)
    port = args.port or free_port()
    settings = project(root, args.events, free_port(), port)
    os.environ["DBSP_HOME"] = os.path.join(root, "home")  # the embedded server's state, under the root
    spec = parse_project(settings, "the bench's project").pipelines[0]
    resources = settings["resources"]
    if not os.path.exists(os.path.join(root, LOADED)):
        data = os.path.join(root, "data")
        write_state(data, args.state)
        load_state(settings, data, args.state)
        open(os.path.join(root, LOADED), "w").close()
    pipeline = open_pipeline(spec, SparkResource(**resources["spark"]), StoreResource(**resources["store"]))
    spark = pipeline.spark
    shared: list[int] = []
    counting_shares(shared)
    figures = []
    try:
        first = args.state + (pipeline.run() - 1) * args.events  # step 0 is the load
        for i in range(args.steps):
            step = pipeline.state.get_step()
            records = nexmark_records(first, args.events, 0)
            frames = {
                name: spark.createDataFrame(pa.Table.from_pylist(rows, arrow_schema(parse_schema(SCHEMAS[name]))))
                .withColumn(WEIGHT, F.lit(1))
                .localCheckpoint(eager=True)
                for name, rows in records.items()
                if rows
            }
            pipeline.divisions.record(step, [Range("bench", 0, first, first + args.events)])
            pipeline.timings.clear()
            shared.clear()
            pipeline.run_steps(kept_reader(frames), step, step)
            first += args.events
            figures.append((pipeline.timings["compute_and_write"], sum(shared)))
            print(
                f"step {i + 1} of the server: compute and write {figures[-1][0]:.2f} s, {figures[-1][1]} shared frames"
            )
    finally:
        spark.stop()
        if args.port is None:
            stop_connect_server(os.path.join(root, "home", "spark"), port)
    bands = {
        f"steps {low}..{high or len(figures)}": [seconds for seconds, _ in figures[low - 1 : high]]
        for low, high in BANDS
        if figures[low - 1 : high]
    }
    settled = statistics.median(list(bands.values())[-1])
    for name, band in bands.items():
        median = statistics.median(band)
        print(
            f"{name}: compute and write median {median:.2f} s ({min(band):.2f}..{max(band):.2f}), "
            f"{median / settled:.2f}x the last band's"
        )
    print(f"pipeline under {root}")


if __name__ == "__main__":
    main()
