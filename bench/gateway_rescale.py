"""Live rescale of the gateway's workers (ICADD, docs/gateway.md) against a stop-the-world
rescale, in the same run against the same local Kafka node.

The scenario is the live test's (``tests/gateway/test_rescale_live.py``,
:func:`grow_and_rescale`): ``--sources`` files, each growing by ``--rounds`` lines per
second, through a gateway rescaled 2 -> 3 -> 1 I/O threads, once with ICADD
(``Gateway.rescale``: only the moving sources stop, one Collect / Acquire each) and once
stopping the world (every source stops, the layout changes, every source restarts at its
cursor on its new owner).  Each line carries its write time; a consumer tailing the topic
notes when it sees it.  Printed per mode:

* the migrations' wall time and keys moved;
* the stall: for the lines in flight during a migration (written before its end, seen
  after its trigger), the max and p99 of write -> seen in the topic, apart for the files
  it moved (all of them when stopping the world) and those it did not; p50 and p99 of
  all the other lines (the floor: the directory scan every 20 ms, the demand flush, the
  broker round trip);
* the throughput dip: lines seen per 100 ms, the lowest bucket from the trigger to 0.5 s
  after the end, against the median and lowest buckets outside the migrations; and the
  lines missing from those buckets below the median, in seconds of the median rate (the
  lines come later, none is lost: the writer's rate is fixed);
* the view (unless ``--no-view``): after both runs, each run's topic goes through a durable
  pipeline (:func:`check_view`: the step reader frames the gateway's messages, one step
  from each migration's start to its end and one between them, a view holding each line
  as a row), which must hold every line of every file on disk exactly once, no dead
  letter, and each file in order (at every step's end a prefix of the file); any breach
  fails the run (an ``AssertionError`` naming the lines, exit status 1).  Spark Connect
  starts only then (or use ``--url``), so it does not load the machine during the runs.

Usage: ``.venv/bin/python bench/gateway_rescale.py [--sources 1000] [--rounds 2]`` (not
``python -O``: the checks are asserts).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import on_spark
from sensors.broker import LocalBroker
from tests.gateway.test_rescale_live import check_view, grow_and_rescale

BUCKET = 100_000_000  # ns


def figures(result: dict) -> dict:
    windows = [(a, b, f["keys"]) for a, b, f in result["windows"]]

    def during(t: int, slack: int = 0) -> bool:
        return any(a <= t <= b + slack for a, b, _ in windows)

    def crossing(file: str, wrote: int, seen: int, moved: bool | None = None) -> bool:
        """In flight at some moment of a migration (of a file it moved, or did not)."""
        return any(wrote <= b and seen >= a and (moved is None or (file in keys) == moved) for a, b, keys in windows)

    def ms(values: list[float], q: float) -> float | None:
        return round(values[int(q * (len(values) - 1))], 1) if values else None

    stalls, unmoved = [], []
    for file, wrote, seen in result["seen"]:
        if crossing(file, wrote, seen, True):
            stalls.append((seen - wrote) / 1e6)
        elif crossing(file, wrote, seen, False):
            unmoved.append((seen - wrote) / 1e6)
    others = sorted((seen - wrote) / 1e6 for file, wrote, seen in result["seen"] if not crossing(file, wrote, seen))
    stalls.sort()
    unmoved.sort()
    buckets: dict[int, int] = {}
    for _, _, seen in result["seen"]:
        buckets[seen // BUCKET] = buckets.get(seen // BUCKET, 0) + 1
    first, last = min(buckets), max(buckets)
    series = {b: buckets.get(b, 0) for b in range(first + 2, last - 1)}  # whole buckets only
    dip = [n for b, n in series.items() if during(b * BUCKET, 500_000_000) or during(b * BUCKET + BUCKET - 1)]
    steady = [n for b, n in series.items() if not (during(b * BUCKET, 500_000_000) or during(b * BUCKET + BUCKET - 1))]
    return {
        "migrations": [(f["from"], f["to"], f["moved"], f["seconds"]) for _, _, f in result["windows"]],
        "lines": result["lines"],
        "during": len(stalls),
        "stall_max_ms": ms(stalls, 1.0),
        "stall_p99_ms": ms(stalls, 0.99),
        "unmoved": len(unmoved),
        "unmoved_max_ms": ms(unmoved, 1.0),
        "unmoved_p99_ms": ms(unmoved, 0.99),
        "other_p50_ms": round(statistics.median(others), 1) if others else None,
        "other_p99_ms": round(others[int(0.99 * (len(others) - 1))], 1) if others else None,
        "steady_lines_per_100ms": statistics.median(steady) if steady else None,
        "lowest_lines_per_100ms": min(dip) if dip else None,
        "lowest_steady_lines_per_100ms": min(steady) if steady else None,
        "dip_seconds": round(
            sum(max(0.0, statistics.median(steady) - n) for n in dip) / statistics.median(steady) / 10, 2
        )
        if steady and dip
        else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sources", type=int, default=1000)
    parser.add_argument("--rounds", type=float, default=2.0, help="lines per second per file")
    parser.add_argument("--settle", type=float, default=1.5, help="seconds before, between and after the migrations")
    parser.add_argument(
        "--no-view",
        dest="view",
        action="store_false",
        help="skip the check of the view of a durable pipeline over each run's topic",
    )
    parser.add_argument("--url", help="Spark Connect server for the view check (default: one started for it)")
    args = parser.parse_args()
    if not __debug__:
        sys.exit("run without -O: the bench's checks are asserts")
    with LocalBroker() as broker, tempfile.TemporaryDirectory() as tmp:
        results = {}
        for name, stopped in (("icadd", False), ("stop-the-world", True)):
            result = results[name] = grow_and_rescale(
                broker.bootstrap,
                Path(tmp) / name,
                sources=args.sources,
                stopped=stopped,
                rounds=args.rounds,
                settle=args.settle,
            )
            f = figures(result)
            moves = ", ".join(f"{a}->{b}: {m} moved in {s * 1000:.0f} ms" for a, b, m, s in f["migrations"])
            print(f"{name:15s} {moves}; {f['lines']} lines, every one once and in order")
            print(
                f"{'':15s} write->seen of the lines in flight during a migration: of the files it moved "
                f"({f['during']} lines) max {f['stall_max_ms']} ms, p99 {f['stall_p99_ms']} ms; of the files it did "
                f"not move ({f['unmoved']}) max {f['unmoved_max_ms']} ms, p99 {f['unmoved_p99_ms']} ms; the other "
                f"lines: p50 {f['other_p50_ms']} ms, p99 {f['other_p99_ms']} ms; lines seen per 100 ms: "
                f"median {f['steady_lines_per_100ms']} and lowest {f['lowest_steady_lines_per_100ms']} outside the "
                f"migrations, lowest {f['lowest_lines_per_100ms']} around them (to 0.5 s after); throughput lost around "
                f"them: {f['dip_seconds']} s of the median rate",
                flush=True,
            )
        if args.view:
            on_spark(lambda spark, work, _: views(spark, broker.bootstrap, results, work), args, "gateway-rescale-")


def views(spark, bootstrap: str, results: dict[str, dict], work: str) -> None:
    for name, result in results.items():
        offsets = " | ".join(",".join(str(c[p]) for p in sorted(c)) for c in result["cuts"])
        v = check_view(
            spark, bootstrap, result, os.path.join(work, name)
        )  # raises on any line lost, repeated, out of order
        print(
            f"{name:15s} view: all {v['lines']} lines of the {v['files']} files exactly once, each file in order "
            f"(a prefix at every step's end), no dead letter; {v['steps']} steps ending at offsets {offsets} "
            f"(partition 0,1); {v['seconds']} s",
            flush=True,
        )


if __name__ == "__main__":
    main()
