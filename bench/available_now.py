"""One run per batch, each a fresh process (what a scheduler does): a step of this engine
against a Structured Streaming (SS) ``Trigger.AvailableNow`` run over the same new rows,
its state in a checkpoint.

Query: ``bids_by_category`` (bids JOIN auctions, revenue and count per category; the
query of ``bench/structured_streaming.py``), data from ``bench/common.py``: ``--state``
bids over ``state // 15`` auctions, written once as Parquet files.  Both sides load them
before any timing: ours as step 0 of a durable pipeline (``storage.pipeline.Pipeline``,
2 workers, the sink's current view kept as a Delta table, as Dagster runs it), SS as its
first AvailableNow run.  Then ``--warmup`` unrecorded and ``--batches`` timed batches of
``--batch-rows`` new bids, each one new Parquet file moved into the bids directory.  For
each batch every mode runs as a fresh Python process (``subprocess``), in an order that
rotates batch by batch so the machine's other load falls on all alike:

* ``ours``: connects to the warm Spark Connect server (started for the run, as ``dbsp``
  starts the embedded one, its pid and log in a private temp dir), reads the batch's file
  and runs one step: input persisted, compute and write, view, checkpoint committed.
* ``ss-connect``: an SS query over the same warm server (a session of its own): file
  streams of the bids and auctions directories (``--ss-join stream``: SS keeps both sides
  of the join in its state, as ours does; ``static``: auctions a static DataFrame, SS keeps
  only the per-category aggregate), update mode, ``foreachBatch`` writing each batch's
  changed rows to ``<out>/batch=<id>`` (an idempotent sink), ``trigger(availableNow=True)``,
  awaited.  Spark's RocksDB state store when this Spark has it, else the default one.
* ``ss-classic``: the same query in a fresh ``local[2]`` JVM, what a scheduler running
  ``spark-submit`` pays.  Its checkpoint is a copy of the loaded one.

Per run: wall seconds from spawn to the Python process's exit (and to the end of every
process holding its stdout: a classic JVM shuts down after its Python process), and,
inside the process, the seconds of the imports, to get a session and of the work (ours:
submit + run; SS: start to termination, with the batch's progress figures).
Per state size and mode: median and p90, and ours / SS.  Finally each SS sink's final
result (each category's last emitted row) and our view must equal Spark batch SQL over
all the files, else the benchmark fails.

    python bench/available_now.py --state 1000000 10000000 --batches 5
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
VIEW = "bids_by_category"
MODES = ("ours", "ss-connect", "ss-classic")
PHASES = ("queryPlanning", "addBatch", "walCommit", "commitOffsets", "latestOffset", "getBatch")  # of an SS batch


# -- the children: one run each, a fresh process --------------------------------------------


def child_ours(job: dict) -> dict:
    started = time.perf_counter()
    sys.path.insert(0, ROOT)
    from pyspark.sql import functions as F

    from circuits.library import nexmark_circuit
    from circuits.spark import remote_session
    from storage.logs import Range
    from storage.pipeline import Pipeline

    imported = time.perf_counter()
    spark = remote_session(job["url"])
    connected = time.perf_counter()
    pipeline = Pipeline(spark, job["root"], nexmark_circuit("bench", (VIEW,)), workers=2, views=(VIEW,))
    new = spark.read.schema(job["schema"]).parquet(*job["files"]).withColumn("_weight", F.lit(1).cast("bigint"))
    inputs = {"bids": new, "auctions": _auctions(spark, job)} if job.get("with_auctions") else {"bids": new}
    step = job["step"]
    with pipeline.timed("submit (input write)"):
        pipeline.submit(step, inputs, [Range("bench", 0, step, step + 1)])
    pipeline.run()
    done = time.perf_counter()
    return {
        "import": imported - started,
        "session": connected - imported,
        "work": done - connected,
        "phases": dict(pipeline.timings),
    }


def _auctions(spark, job: dict):
    from pyspark.sql import functions as F

    return (
        spark.read.schema(job["auction_schema"]).parquet(job["auctions"]).withColumn("_weight", F.lit(1).cast("bigint"))
    )


def child_ss(job: dict, mode: str) -> dict:
    started = time.perf_counter()
    if mode == "ss-classic":
        os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)  # inherited from a Connect parent
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        from pyspark.sql import SparkSession

        imported = time.perf_counter()
        builder = SparkSession.builder.master("local[2]").appName("ss-available-now")
        for key, value in {**job["classic_conf"], **job["ss_conf"]}.items():
            builder = builder.config(key, value)
        spark = builder.getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
    else:
        from pyspark.sql import SparkSession

        imported = time.perf_counter()
        spark = SparkSession.builder.remote(job["ss_url"]).getOrCreate()
        for key, value in job["ss_conf"].items():
            spark.conf.set(key, value)
    connected = time.perf_counter()
    out = job["out"]

    def sink(changes, batch_id):
        changes.write.mode("overwrite").parquet(f"{out}/batch={batch_id}")

    spark.readStream.schema(job["schema"]).parquet(job["bids_dir"]).createOrReplaceTempView("bids")
    if job["ss_join"] == "stream":
        spark.readStream.schema(job["auction_schema"]).parquet(job["auctions"]).createOrReplaceTempView("auctions")
    else:
        spark.read.schema(job["auction_schema"]).parquet(job["auctions"]).createOrReplaceTempView("auctions")
    query = (
        spark.sql(job["sql"])
        .writeStream.outputMode("update")
        .option("checkpointLocation", job["checkpoint"])
        .foreachBatch(sink)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    done = time.perf_counter()
    progress = [json.loads(p.json) if hasattr(p, "json") else dict(p) for p in query.recentProgress]
    for p in progress:  # over Connect the progress has no total: its sources have theirs
        p["rows"] = sum(source.get("numInputRows") or 0 for source in p.get("sources", []))
    ran = [p for p in progress if p["rows"] > 0]
    state = [
        sum(op.get("numRowsTotal", 0) for op in p.get("stateOperators", []))
        for p in progress
        if p.get("stateOperators")
    ]
    figures = {
        "import": imported - started,
        "session": connected - imported,
        "work": done - connected,
        "batches": sorted({p["batchId"] for p in ran}),
        "rows": sum(p["rows"] for p in ran),
        "state_rows": state[-1] if state else None,
        "trigger_s": sum(p["durationMs"].get("triggerExecution", 0) for p in ran) / 1000,
        # Summed over the state store instances (2 per operator and store): the time to load
        # each one's state from the checkpoint, and how many did (0: a warm JVM's copy).
        "rocksdb_load_s": sum(
            op.get("customMetrics", {}).get("rocksdbLoadLatencyMs", 0)
            for p in ran
            for op in p.get("stateOperators", [])
        )
        / 1000,
        "loaded_from_checkpoint": sum(
            op.get("customMetrics", {}).get("rocksdbNumLoadedFromDfs", 0)
            for p in ran
            for op in p.get("stateOperators", [])
        ),
        "duration_s": {k: sum(p["durationMs"].get(k, 0) for p in ran) / 1000 for k in PHASES},
    }
    if mode == "ss-classic":
        spark.stop()
    return figures


# -- the parent ----------------------------------------------------------------------------


def run_child(job: dict, mode: str, log: str) -> dict:
    """Runs ``mode`` on ``job`` in a fresh process; its figures plus ``wall`` (spawn to exit)."""
    result = f"{log}.result"
    command = [
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        mode,
        "--job",
        json.dumps({**job, "result": result}),
    ]
    ended: list = []

    def drain(stream) -> None:  # EOF once every holder of the pipe is gone: a classic JVM too
        ended.append(stream.read())
        ended.append(time.perf_counter() - started)

    started = time.perf_counter()
    with open(log, "ab") as err:
        # In the run's temp dir: a classic JVM may leave a crash log (hs_err_pid*.log) in its cwd.
        child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=err, cwd=os.path.dirname(log))
        reader = threading.Thread(target=drain, args=(child.stdout,))
        reader.start()
        child.wait()
        wall = time.perf_counter() - started
        reader.join()
        err.write(ended[0])
    if child.returncode != 0 or not os.path.exists(result):
        raise RuntimeError(f"{mode} run failed (exit {child.returncode}); see {log}")
    with open(result) as written:
        figures = json.load(written)
    os.remove(result)
    figures["wall"] = wall  # spawn to the Python process's exit
    figures["tree"] = ended[1]  # spawn to the end of the last process holding its stdout (its JVM)
    return figures


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


def measure(spark, url: str, ss_url: str, work: str, state: int, args, log: str) -> dict:
    from collections import Counter

    from common import auctions, bids
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from circuits.library.nexmark import AUCTION_SCHEMA, BID_SCHEMA
    from circuits.library.nexmark_queries import RECOMPUTE_SQL
    from storage.views import read_view

    base = os.path.join(work, f"state-{state}")
    data, staged = os.path.join(base, "input"), os.path.join(base, "staged")
    bids_dir, auctions_dir = os.path.join(data, "bids"), os.path.join(data, "auctions")
    auction_count = max(state // 15, 1)
    started = time.perf_counter()
    auctions(spark, auction_count).drop("_weight").write.parquet(auctions_dir)
    bids(spark, 0, state, auction_count).drop("_weight").repartition(max(1, state // 1_000_000)).write.parquet(bids_dir)
    rounds = args.warmup + args.batches
    batch_files = []
    for i in range(rounds):
        target = os.path.join(staged, f"batch-{i}")
        bids(spark, state + i * args.batch_rows, args.batch_rows, auction_count).drop("_weight").coalesce(
            1
        ).write.parquet(target)
        (part,) = [f for f in os.listdir(target) if f.endswith(".parquet")]
        batch_files.append(os.path.join(target, part))
    print(
        f"\n{state:,} bids over {auction_count:,} auctions and {rounds} batch files written in "
        f"{time.perf_counter() - started:.1f} s",
        flush=True,
    )

    root = os.path.join(base, "ours")
    ckpt, outs = os.path.join(base, "ss-checkpoint"), os.path.join(base, "ss-out")
    common_job = {
        "url": url,
        "ss_url": ss_url,
        "schema": BID_SCHEMA,
        "auction_schema": AUCTION_SCHEMA,
        "auctions": auctions_dir,
        "bids_dir": bids_dir,
        "root": root,
        "sql": RECOMPUTE_SQL[VIEW],
        "ss_join": args.ss_join,
        "ss_conf": args.ss_conf,
        "classic_conf": {
            "spark.driver.memory": args.driver_memory,
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
        },
    }
    loads = {}
    if "ours" in args.modes:
        loads["ours"] = run_child({**common_job, "files": [bids_dir], "step": 0, "with_auctions": True}, "ours", log)
        print(f"ours: step 0 (the load) {loads['ours']['wall']:.1f} s", flush=True)
    ss_modes = [m for m in args.modes if m != "ours"]
    if ss_modes:
        first = ss_modes[0]
        loads["ss"] = run_child({**common_job, "checkpoint": f"{ckpt}-{first}", "out": f"{outs}-{first}"}, first, log)
        for other in ss_modes[1:]:
            shutil.copytree(f"{ckpt}-{first}", f"{ckpt}-{other}")
            shutil.copytree(f"{outs}-{first}", f"{outs}-{other}")
        print(
            f"SS: first AvailableNow run (the load, {first}) {loads['ss']['wall']:.1f} s, "
            f"state rows {loads['ss']['state_rows']}",
            flush=True,
        )

    runs: dict[str, list[dict]] = {m: [] for m in args.modes}
    for i in range(rounds):
        moved = os.path.join(bids_dir, f"batch-{i:04d}.parquet")
        shutil.move(batch_files[i], moved)
        order = args.modes[i % len(args.modes) :] + args.modes[: i % len(args.modes)]
        line = []
        for mode in order:
            if mode == "ours":
                job = {**common_job, "files": [moved], "step": i + 1}
            else:
                job = {**common_job, "checkpoint": f"{ckpt}-{mode}", "out": f"{outs}-{mode}"}
            figures = run_child(job, mode, log)
            if mode != "ours" and (figures["rows"] != args.batch_rows or len(figures["batches"]) != 1):
                raise AssertionError(
                    f"{mode} batch {i}: ran batches {figures['batches']} over {figures['rows']} rows, "
                    f"expected one batch of {args.batch_rows}"
                )
            if i >= args.warmup:
                runs[mode].append(figures)
            line.append(f"{mode} {figures['wall']:.2f} s (work {figures['work']:.2f})")
        print(
            f"batch {i + 1}/{rounds}{' (warm-up)' if i < args.warmup else ''} [load {load()}]: " + ", ".join(line),
            flush=True,
        )

    # Correctness: every side against Spark batch SQL over every file.
    spark.read.schema(BID_SCHEMA).parquet(bids_dir).createOrReplaceTempView("bids")
    spark.read.schema(AUCTION_SCHEMA).parquet(auctions_dir).createOrReplaceTempView("auctions")
    expected = Counter(tuple(r) for r in spark.sql(RECOMPUTE_SQL[VIEW]).collect())
    verdicts = {}
    if "ours" in args.modes:
        view = read_view(root, VIEW).table.to_pylist()
        got = Counter()
        for row in view:
            got[(row["category"], row["revenue"], row["bids"])] += row.get("_weight", 1)
        verdicts["ours"] = +got == expected
    for mode in ss_modes:
        latest = Window.partitionBy("category").orderBy(F.col("batch").desc())
        emitted = spark.read.parquet(f"{outs}-{mode}").withColumn("_rank", F.row_number().over(latest))
        got = Counter(tuple(r) for r in emitted.where("_rank = 1").select("category", "revenue", "bids").collect())
        verdicts[mode] = got == expected
    print(
        f"final result equals Spark batch SQL ({sum(r[2] for r in expected)} bids in {len(expected)} categories): "
        + ", ".join(f"{m} {'yes' if v else 'NO'}" for m, v in verdicts.items()),
        flush=True,
    )
    if not all(verdicts.values()):
        raise AssertionError(f"results differ from Spark batch SQL: {verdicts}")
    return {"runs": runs, "loads": loads}


def table(state: int, result: dict, args) -> list[str]:
    runs = result["runs"]
    lines = [
        f"\n{VIEW}, {state:,} bids of state, {args.batches} batches of {args.batch_rows:,} new bids "
        f"(after {args.warmup} warm-up), each run a fresh process; seconds",
        "| mode | wall median | wall p90 | in-process work median | work p90 | session median | imports median "
        "| ours / this, wall | ours / this, work |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    med = {m: statistics.median(r["wall"] for r in rs) for m, rs in runs.items()}
    work = {m: statistics.median(r["work"] for r in rs) for m, rs in runs.items()}
    for mode, rs in runs.items():
        ratio = "-" if mode == "ours" or "ours" not in runs else f"{med['ours'] / med[mode]:.2f}"
        wratio = "-" if mode == "ours" or "ours" not in runs else f"{work['ours'] / work[mode]:.2f}"
        lines.append(
            f"| {mode} | {med[mode]:.2f} | {pct([r['wall'] for r in rs], 0.9):.2f} | {work[mode]:.2f} "
            f"| {pct([r['work'] for r in rs], 0.9):.2f} | {statistics.median(r['session'] for r in rs):.2f} "
            f"| {statistics.median(r['import'] for r in rs):.2f} | {ratio} | {wratio} |"
        )
    if "ours" in runs:
        phases = sorted({p for r in runs["ours"] for p in r["phases"]})
        lines.append(
            "ours, step phases (median s): "
            + ", ".join(f"{p} {statistics.median(r['phases'].get(p, 0.0) for r in runs['ours']):.2f}" for p in phases)
        )
    for mode in (m for m in runs if m != "ours"):
        rs = runs[mode]
        parts = ", ".join(f"{k} {statistics.median(r['duration_s'][k] for r in rs):.2f}" for k in rs[0]["duration_s"])
        tree = statistics.median(r["tree"] for r in rs)
        lines.append(
            f"{mode}: spawn to the end of the process and its JVM, median {tree:.2f} s "
            f"({tree - med[mode]:+.2f} s after the Python process's exit)"
        )
        lines.append(
            f"{mode}: the batch's triggerExecution median {statistics.median(r['trigger_s'] for r in rs):.2f} s "
            f"({parts}); state rows {rs[-1]['state_rows']:,}; RocksDB load from the checkpoint, summed over "
            f"state store instances: {statistics.median(r['rocksdb_load_s'] for r in rs):.2f} s, "
            f"{statistics.median(r['loaded_from_checkpoint'] for r in rs):g} loaded"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--state", type=int, nargs="+", default=[1_000_000, 10_000_000], help="bids of state (one run each)"
    )
    parser.add_argument("--batches", type=int, default=5, help="timed batches per state size")
    parser.add_argument("--warmup", type=int, default=1, help="unrecorded batches first")
    parser.add_argument("--batch-rows", type=int, default=1000)
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument(
        "--ss-join",
        choices=["stream", "static"],
        default="stream",
        help="SS reads the auctions as a stream (join state kept) or as a static DataFrame",
    )
    parser.add_argument("--driver-memory", default="6g", help="of the Connect server and of each classic SS JVM")
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--job", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        job = json.loads(args.job)
        figures = child_ours(job) if args.child == "ours" else child_ss(job, args.child)
        with open(job["result"], "w") as result:  # not stdout: a classic JVM may write there too
            json.dump(figures, result)
        return

    sys.path.insert(0, ROOT)
    import pyspark

    from circuits.daemon import free_port
    from circuits.spark import connect_server, remote_session, stop_connect_server

    jars = os.path.join(os.path.dirname(pyspark.__file__), "jars")
    has_rocksdb = any(f.startswith("rocksdbjni") for f in os.listdir(jars))
    args.ss_conf = {"spark.sql.shuffle.partitions": "2"}
    if has_rocksdb:
        args.ss_conf["spark.sql.streaming.stateStore.providerClass"] = ROCKSDB
    print("command: python bench/available_now.py " + " ".join(sys.argv[1:]))
    print(
        f"pyspark {pyspark.__version__}; SS state store: {'RocksDB' if has_rocksdb else 'default (HDFS-backed)'}; "
        f"SS join: {args.ss_join}; load average at start: {load()}",
        flush=True,
    )
    work = tempfile.mkdtemp(prefix="dbsp-available-now-")
    server, port = os.path.join(work, "spark"), free_port()
    log = os.path.join(work, "children.log")
    url = connect_server(server, port, driver_memory=args.driver_memory)
    ss_url = f"{url.split('/;')[0]}/;session_id={uuid.uuid4()}"
    print(f"Connect server on port {port} (log {server}); children's stderr in {log}", flush=True)
    failed, spark = False, None
    try:
        spark = remote_session(url)
        for state in args.state:
            result = measure(spark, url, ss_url, work, state, args, log)
            print("\n".join(table(state, result, args)), flush=True)
            shutil.rmtree(os.path.join(work, f"state-{state}"), ignore_errors=True)
    except BaseException:
        failed = True
        raise
    finally:
        if spark is not None:
            spark.stop()  # before its server: a session left open retries the stopped server at exit
        stop_connect_server(server, port)
        print(f"load average at end: {load()}", flush=True)
        if os.path.exists(log):
            with open(log, errors="replace") as children:
                crashes = children.read().count("A fatal error has been detected by the Java Runtime Environment")
            # Seen here: a classic SS JVM's SIGSEGV at exit, RocksDB's native library already deleted.
            print(f"JVM crash reports in the children's output (classic SS JVMs, after their work): {crashes}")
        if failed:
            print(f"kept {work} for inspection", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
