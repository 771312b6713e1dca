"""What compiling the demo's views costs a run process, with and without Spark's answers
kept from an earlier compile (``$DBSP_HOME/sql/<pipeline>.analyses.json``): under
``dagster dev`` every step run is a new process that loads the project and compiles its
pipeline's SQL before the step starts.  Alternates the two ways on one server: "asked"
compiles in a fresh ``$DBSP_HOME`` (every answer from Spark, as each run did before),
"kept" in one whose answers an earlier compile saved.

    python bench/sql_compile.py --rounds 10
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common import on_spark

from circuits.spark import round_trips
from dagster_project.config import DEMO, parse_project


def compile_once(spark, home: str) -> tuple[float, Counter]:
    """Seconds and round trips of loading the demo project and compiling its views, as a run does."""
    os.environ["DBSP_HOME"] = home
    started = time.perf_counter()
    with round_trips(spark) as calls:
        parse_project(DEMO, "bench").pipelines[0].circuit_for(spark)
    return time.perf_counter() - started, calls


def run(spark, work: str, args) -> None:
    kept = os.path.join(work, "kept")
    compile_once(spark, kept)  # saves the answers "kept" reads
    figures: dict[str, list[float]] = {"asked": [], "kept": []}
    calls: dict[str, Counter] = {}
    for _ in range(args.rounds):
        for way, home in (("asked", tempfile.mkdtemp(dir=work)), ("kept", kept)):
            seconds, calls[way] = compile_once(spark, home)
            figures[way].append(seconds)
    for way, samples in figures.items():
        print(
            f"{way}: median {statistics.median(samples):.3f} s (min {min(samples):.3f}, max {max(samples):.3f}), "
            f"round trips {dict(calls[way])}"
        )
    print(f"kept / asked: {statistics.median(figures['kept']) / statistics.median(figures['asked']):.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--url", help="a running Spark Connect server (default: start one)")
    on_spark(run, parser.parse_args(), "dbsp-sql-compile-")


if __name__ == "__main__":
    main()
