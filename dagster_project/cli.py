"""``dbsp``: the project's command line."""

from __future__ import annotations

import argparse
import sys

from .demo import run_demo

def demo(args: argparse.Namespace) -> int:
    """Runs the Nexmark views step by step and checks q4 against a Spark batch recomputation."""
    result = run_demo(args.steps, args.events_per_step, args.workers, args.seed, args.cores, log=print)
    print("\nq4, average closing price per category (incrementally maintained):")
    for category, avg_final in sorted(result.q4):
        print(f"  category {category}: {avg_final:,.2f}")
    print(f"\nq4 equals a Spark batch recomputation over all {result.events} events: {result.q4_matches}")
    return 0 if result.q4_matches else 1


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
