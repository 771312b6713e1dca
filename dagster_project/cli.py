"""``dbsp``: the project's command line."""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter

from circuits import InMemoryStateStore, StepRunner
from circuits.library import NexmarkGenerator, nexmark_circuit, nexmark_inputs
from circuits.spark import local_session

RECOMPUTE_Q4 = """
SELECT category, avg(final) AS avg_final FROM (
  SELECT a.id, a.category, max(b.price) AS final FROM auctions a JOIN bids b ON a.id = b.auction
  WHERE b.date_time BETWEEN a.date_time AND a.expires GROUP BY a.id, a.category)
GROUP BY category
"""


def demo(args: argparse.Namespace) -> int:
    """Runs Nexmark views step by step and checks q4 against a Spark batch recomputation."""
    spark = local_session(cores=args.cores, app_name="dbsp-demo")
    circuit = nexmark_circuit()
    runner = StepRunner(circuit, spark, InMemoryStateStore(), workers=args.workers)
    generator = NexmarkGenerator(seed=args.seed)
    integral: dict[str, Counter] = {name: Counter() for name in circuit.outputs}
    events = []
    for step in range(args.steps):
        batch = list(generator.events(step * args.events_per_step, args.events_per_step))
        events.extend(batch)
        started = time.perf_counter()
        outputs = runner.step(nexmark_inputs(spark, batch)).collect_outputs()
        elapsed = time.perf_counter() - started
        for name, rows in outputs.items():
            for *row, w in rows:
                integral[name][tuple(row)] += w
        changes = ", ".join(f"{name} {len(rows)}" for name, rows in outputs.items())
        print(f"step {step}: {len(batch)} events in, changes out: {changes} ({elapsed:.1f} s)", flush=True)

    for name, rows in nexmark_inputs(spark, events).items():
        rows.drop("_weight").createOrReplaceTempView(name)
    recomputed = Counter(tuple(r) for r in spark.sql(RECOMPUTE_Q4).collect())
    maintained = +integral["q4"]
    print("\nq4, average closing price per category (incrementally maintained):")
    for category, avg_final in sorted(maintained):
        print(f"  category {category}: {avg_final:,.2f}")
    same = _rounded(maintained) == _rounded(recomputed)
    print(f"\nq4 equals a Spark batch recomputation over all {len(events)} events: {same}")
    return 0 if same else 1


def _rounded(z: Counter) -> Counter:
    return Counter({tuple(round(v, 6) if isinstance(v, float) else v for v in row): w for row, w in z.items()})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dbsp", description="Incremental views with distributed DBSP on Spark.")
    commands = parser.add_subparsers(dest="command", required=True)
    d = commands.add_parser("demo", help="run the Nexmark example views step by step on local Spark")
    d.add_argument("--steps", type=int, default=5)
    d.add_argument("--events-per-step", type=int, default=1000)
    d.add_argument("--workers", type=int, default=2, help="workers (Spark partitions) the vnodes are spread over")
    d.add_argument("--cores", type=int, default=2, help="local Spark threads")
    d.add_argument("--seed", type=int, default=0)
    d.set_defaults(run=demo)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
