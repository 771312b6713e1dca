"""A large step's input log write, each table to writers of its own (``apart``) against
all tables packed into one union, alternated on one server (issue 30).

The input log chooses by its division's records (``storage.delta.APART_ROWS``); this
writes the same ``--events`` Nexmark events (the Parquet ``big_step.py`` reads) into new
input logs with a division of one record (packed) and of ``--events`` records (apart),
``--rounds`` times, and prints each write's wall time and the server's CPU seconds.

    python bench/input_log_write.py --events 1000000 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile

from big_step import cpu_seconds, events, used
from common import timed
from state_scale import Server, peer_inputs, server_arguments, weighted

from circuits.library.nexmark import SCHEMAS
from circuits.spark import remote_session
from storage.delta import apart
from storage.logs import InputLog


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    server_arguments(parser)
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="input-log-write-")
    server = Server(work, args.url, args.driver_memory)
    try:
        spark = remote_session(server.url)
        base = peer_inputs(spark, args.data, args.events)
        for r in range(args.rounds):
            for records in (1, args.events):
                log = InputLog(spark, os.path.join(work, f"log-{r}-{records}"), SCHEMAS)
                before = cpu_seconds(server.pid)
                wall = timed(
                    lambda log=log, records=records: log.persist(0, weighted(events(spark, base)), records=records)
                )
                jvm, python = used(cpu_seconds(server.pid), before)
                way = "apart " if apart(records) else "packed"
                print(
                    f"round {r} {way} wall {wall:6.1f} s, server CPU {jvm + python:6.1f} s ({jvm:.1f} + {python:.1f})"
                )
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
