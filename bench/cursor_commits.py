"""The gateway's periodic cursor commits (issue 28): what one commit of the cursor table
costs at N sources, against the default interval between two commits
(``gateway.cursor_commit_seconds``, 1 s), in one run.

Each round commits the cursors of N file sources on two partitions (``CursorStore.commit``,
a Delta overwrite of the whole table, as ``Gateway`` makes it every second while the
broker acknowledges bytes) and loads them back once at the end, as a restart does.

    python bench/cursor_commits.py --sources 100 1000 10000 --commits 30
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from gateway.config import GatewaySpec
from storage.cursors import CursorStore


def measure(sources: int, commits: int) -> dict:
    with tempfile.TemporaryDirectory() as directory:
        store = CursorStore(f"{directory}/cursors")
        seconds = []
        for i in range(commits):
            positions = {("t", f"/landing/f{s:06d}.log"): 1000 * i + s for s in range(sources)}
            began = time.perf_counter()
            store.commit(positions, {("t", 0): i, ("t", 1): i})
            seconds.append(time.perf_counter() - began)
        began = time.perf_counter()
        assert len(store.load().positions) == sources
        load = time.perf_counter() - began
    interval = GatewaySpec().cursor_commit_seconds
    median = statistics.median(seconds)
    return {
        "sources": sources,
        "commit_ms_p50": round(1000 * median, 1),
        "commit_ms_max": round(1000 * max(seconds), 1),
        "share_of_interval": round(median / interval, 4),
        "load_ms": round(1000 * load, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sources", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--commits", type=int, default=30)
    args = parser.parse_args()
    for sources in args.sources:
        print(measure(sources, args.commits), flush=True)


if __name__ == "__main__":
    main()
