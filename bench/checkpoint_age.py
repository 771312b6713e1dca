"""What a run's open and checkpoint, and a sensor tick's status, cost as a pipeline ages,
against the same at a young age, measured in the same run (no Spark: the state has no
tables, so what is measured is the checkpoint table and the logs' bookkeeping).

A pipeline gains a checkpoint per run.  For each age in ``--ages``, the pipeline is
advanced to that many checkpoints, then ``--samples`` runs each open the latest
checkpoint, record one division, and commit the next checkpoint (what every Dagster run
does besides its Spark work), and ``storage.pipeline.status`` is read as a sensor tick
does.  Prints the median milliseconds per age and each age's ratio to the first.

    python bench/checkpoint_age.py --ages 10 100 1000
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from storage.database import DeltaStateStore
from storage.logs import DivisionLog, Range
from storage.pipeline import status


def run(store: DeltaStateStore, divisions: DivisionLog) -> None:
    """One run's bookkeeping: open the latest checkpoint, record a step, checkpoint it."""
    store.open()
    step = store.get_step()
    divisions.record(step, [Range("bench", 0, step, step + 1)])
    store.set_step(step + 1)
    store.commit()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ages", nargs="+", type=int, default=[10, 100, 1000], help="checkpoints before measuring")
    parser.add_argument("--samples", type=int, default=20, help="measured runs per age (medians)")
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="dbsp-age-")
    try:
        store, divisions = DeltaStateStore(None, root), DivisionLog(root)
        rows = []
        for age in sorted(args.ages):
            while store.get_step() < age:
                run(store, divisions)
            runs, ticks = [], []
            for _ in range(args.samples):
                started = time.perf_counter()
                run(store, divisions)
                runs.append(time.perf_counter() - started)
                started = time.perf_counter()
                status(root)
                ticks.append(time.perf_counter() - started)
            rows.append((store.get_step(), statistics.median(runs) * 1000, statistics.median(ticks) * 1000))
        print(f"{'checkpoints':>11} {'run ms':>8} {'x first':>7} {'status ms':>9} {'x first':>7}")
        for age, run_ms, tick_ms in rows:
            print(f"{age:>11,} {run_ms:>8.1f} {run_ms / rows[0][1]:>7.2f} {tick_ms:>9.1f} {tick_ms / rows[0][2]:>7.2f}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
