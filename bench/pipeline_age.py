"""What a step run reads besides its step, as its pipeline ages.

A Dagster step run, once its steps are committed, reports them: each sink's
materialization (row counts, input offsets, the view's preview) and its asset check
(:func:`dagster_project.factory.step_results`).  Whatever of that grows with the
pipeline's age (its steps so far) grows the resident step worker too: an allocator keeps
the peak a run reached.  The bench runs the built-in demo's pipeline (its SQL views over
Nexmark) with the engine alone, a step of 1,000 events and then one bid a step, and at
each of ``--ages`` runs the run's reports of its latest step in a fresh process: the
resident memory they add there (VmRSS after the reports, less before opening the
pipeline), their seconds, and the most data files any of the pipeline's logs has.  It
prints them at each age, and the oldest age's against the youngest's.

    python bench/pipeline_age.py --ages 10 1000
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import on_spark


def resident_mib() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS"))


def demo_pipeline(spark, root: str):
    from dagster_project.config import BUILT_IN, demo_settings, parse_project
    from storage.pipeline import Pipeline

    spec = parse_project(demo_settings(), BUILT_IN).pipelines[0]
    circuit = spec.circuit_for(spark)
    return spec, Pipeline(spark, root, circuit, workers=spec.workers, views=spec.views, catalog=spec.name)


def reports(url: str, root: str) -> dict:
    """The run's reports of the pipeline's latest step, measured in this (fresh) process."""
    from dagster import AssetKey

    from circuits.spark import remote_session
    from dagster_project.factory import step_results
    from storage.pipeline import status
    from storage.tables import open_table

    spec, pipeline = demo_pipeline(remote_session(url), root)
    last = status(root).committed_step - 1
    keys = {name: AssetKey([spec.name, name]) for name in spec.sink_names}
    before = resident_mib()
    started = time.perf_counter()
    pipeline.open()
    results = list(step_results(spec, pipeline, keys, last, last, range(last, last + 1)))
    figures = {"mib": resident_mib() - before, "seconds": time.perf_counter() - started, "step": last}
    logs = [pipeline.inputs.uri(h) for h in spec.sources] + [pipeline.outputs.uri(s) for s in spec.sink_names]
    logs += [pipeline.divisions.uri, pipeline.state.checkpoints_uri]
    figures["log_files"] = max(len(t.file_uris()) for t in map(open_table, logs) if t is not None)
    assert len(results) == 2 * len(keys), results  # a materialization and a check per sink
    return figures


def run(spark, work: str, args) -> None:
    from circuits.library.nexmark import NexmarkGenerator, nexmark_inputs
    from storage.logs import Range

    root = os.path.join(work, "pipeline")
    _, pipeline = demo_pipeline(spark, root)
    generator = NexmarkGenerator()
    step, figures = 0, {}

    def submit(inputs: dict) -> None:
        nonlocal step
        pipeline.submit(step, inputs, [Range("bench", 0, step, step + 1)])
        pipeline.run()
        step += 1

    submit(nexmark_inputs(spark, list(generator.events(0, 1000))))
    started = time.perf_counter()
    for age in sorted(args.ages):
        while step < age:
            bid = ("bids", (1000 + step % 3, 1000, 10 + step, "Google", generator.start_ms + (1000 + step) * 100))
            submit({"bids": nexmark_inputs(spark, [bid])["bids"]})
            if step % 100 == 0:
                print(f"  step {step} ({time.perf_counter() - started:.0f} s)", flush=True)
        child = subprocess.run(
            [sys.executable, __file__, "--child", args.url, root], capture_output=True, text=True, check=True
        )
        figures[age] = json.loads(child.stdout.strip().splitlines()[-1])
        f = figures[age]
        print(
            f"age {age}: a run's reports of step {f['step']} add {f['mib']:.1f} MiB in {f['seconds']:.2f} s; "
            f"the most files of a log: {f['log_files']}"
        )
    young, old = figures[min(figures)], figures[max(figures)]
    print(
        f"age {max(figures)} / age {min(figures)}: memory the reports add {old['mib'] / young['mib']:.2f}x "
        f"({old['mib']:.1f} / {young['mib']:.1f} MiB), their seconds {old['seconds'] / young['seconds']:.2f}x"
    )


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        print(json.dumps(reports(sys.argv[2], sys.argv[3])))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ages", type=int, nargs="+", default=[10, 1000], help="steps at which to measure")
    parser.add_argument("--url", help="a running Spark Connect server (default: one started for the run)")
    on_spark(run, parser.parse_args(), "dbsp-age-")


if __name__ == "__main__":
    main()
