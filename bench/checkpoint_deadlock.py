"""Why the engine's shared frames are checkpointed eagerly: concurrent jobs over a lazily
checkpointed frame deadlock Spark's scheduler.

A step's planners (``circuits.circuit.PLANNERS`` threads) share frames that later nodes
read, and a node's planning runs its broadcasts' jobs, so several jobs run over one shared
frame at once.  With a lazy local checkpoint (``localCheckpoint(eager=False)``), the first
of them to end marks the frame checkpointed (``RDDCheckpointData.checkpoint``: its lock,
then the frame's), while the scheduler submitting another job over the frame holds the
frame's lock and asks for the checkpoint's (``DAGScheduler.getCacheLocs``): the two wait
for each other forever, and every later call of the session queues behind them.

Per round, a new frame of ``--rows`` rows is checkpointed (lazily, or eagerly: computed by
a job of its own before anything reads it), then ``--threads`` threads at once each plan a
broadcast join of a slice of it (whose broadcast runs a job over the frame).  Each of
``--modes`` runs ``--rounds`` rounds, on one Spark Connect server started for the run; a
round that does not end within ``--wait`` seconds is a hang, and the server's threads are
dumped (``jstack``) to name the deadlock.  Prints per mode the rounds run, the median seconds of a
round, and the hang, if any.

    python bench/checkpoint_deadlock.py --rounds 1000
    python bench/checkpoint_deadlock.py --rounds 5000 --modes lazy
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, wait

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from circuits.daemon import Daemon, free_port
from circuits.spark import connect_server, remote_session, stop_connect_server


def rounds(spark: SparkSession, pool: ThreadPoolExecutor, args: argparse.Namespace, eager: bool) -> tuple[str, bool]:
    """Runs the rounds of one mode: a line saying how they went, and whether one hung."""
    seconds: list[float] = []
    for r in range(args.rounds):
        began = time.monotonic()
        frame = spark.range(0, args.rows, 1, 8).withColumn("k", F.col("id") % args.threads)
        frame = frame.localCheckpoint(eager=eager)

        def read(i: int, frame=frame) -> None:
            part = F.broadcast(frame.filter(F.col("k") == i))
            spark.range(args.rows // 10).join(part, "id").localCheckpoint(eager=False)

        futures = [pool.submit(read, i) for i in range(args.threads)]
        done, running = wait(futures, timeout=args.wait)
        if running:
            return f"{len(seconds)} rounds, then round {r + 1} hung (no end in {args.wait:g} s)", True
        for future in done:
            future.result()
        seconds.append(time.monotonic() - began)
    return f"{len(seconds)} rounds, none hung; median round {statistics.median(seconds):.3f} s", False


def deadlock(state_dir: str, port: int) -> str:
    """What the server's thread dump says of a deadlock."""
    pid = Daemon("spark-connect", port, state_dir).pid()
    dump = subprocess.run(["jstack", str(pid)], capture_output=True, text=True, timeout=120).stdout
    found = dump.find("Found one Java-level deadlock")
    if found < 0:
        return "jstack found no Java-level deadlock"
    return dump[found : dump.find("Java stack information", found)].strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=12)
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--wait", type=float, default=60.0)
    parser.add_argument("--modes", nargs="+", default=["eager", "lazy"], choices=["eager", "lazy"])
    args = parser.parse_args()
    state_dir, port = tempfile.mkdtemp(prefix="dbsp-deadlock-"), free_port()
    spark = remote_session(connect_server(state_dir, port, driver_memory="2g"))
    pool = ThreadPoolExecutor(args.threads)
    try:
        for mode in args.modes:
            line, hung = rounds(spark, pool, args, eager=mode == "eager")
            print(f"{mode} checkpoint, {args.threads} threads: {line}", flush=True)
            if hung:
                print(deadlock(state_dir, port), flush=True)
                break
    finally:
        # A deadlocked server answers no call: stop it without closing the session.
        pool.shutdown(wait=False, cancel_futures=True)
        stop_connect_server(state_dir, port)


if __name__ == "__main__":
    main()
