"""What the demo's views cost compiled from SQL (``circuits/library/nexmark.sql``, the
default demo pipeline) against the hand-built ``nexmark_circuit``, measured in one run.

Both circuits run durably (Delta state, input and output logs, a checkpoint per step) in
one classic ``local[2]`` session, on the same ``--events`` Nexmark events per step, their
steps interleaved so that both see the same warm JVM; ``--warmup`` steps are not recorded.
Reports the median wall seconds of a step (submit + run) of each and their ratio, and
checks that both maintain the same outputs.

    python bench/sql_vs_hand_built.py --events 1000 --steps 8
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from circuits.library import nexmark_circuit
from circuits.library.nexmark import NexmarkGenerator, nexmark_inputs
from circuits.library.nexmark_queries import nexmark_sql_circuit
from circuits.spark import local_session
from storage.logs import Range
from storage.pipeline import Pipeline


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    spark = local_session(2)
    root = tempfile.mkdtemp(prefix="sql_vs_hand_built_")
    circuits = {"hand-built": nexmark_circuit(), "sql": nexmark_sql_circuit(spark)}
    pipelines = {k: Pipeline(spark, os.path.join(root, k.replace("-", "_")), c, workers=2) for k, c in circuits.items()}
    seconds: dict[str, list[float]] = {k: [] for k in pipelines}
    generator = NexmarkGenerator()
    for step in range(args.warmup + args.steps):
        batch = list(generator.events(step * args.events, args.events))
        for kind, pipeline in pipelines.items():
            started = time.perf_counter()
            pipeline.submit(step, nexmark_inputs(spark, batch), [Range("bench", 0, step, step + 1)])
            pipeline.run()
            if step >= args.warmup:
                seconds[kind].append(time.perf_counter() - started)
    last = args.warmup + args.steps - 1
    for view in circuits["hand-built"].outputs:
        want, got = (sorted(p.outputs.read(view, 0, last).collect()) for p in pipelines.values())
        assert want == got, f"{view}: the SQL circuit's output log differs from the hand-built one's"
    median = {k: statistics.median(v) for k, v in seconds.items()}
    print(f"events per step {args.events}, steps {args.steps} after {args.warmup} warm-up, classic local[2], durable")
    for kind, value in median.items():
        print(f"  {kind:<11} median step {value:.3f} s  ({', '.join(f'{s:.2f}' for s in seconds[kind])})")
    print(f"  sql / hand-built: {median['sql'] / median['hand-built']:.2f}x; outputs equal: yes")


if __name__ == "__main__":
    main()
