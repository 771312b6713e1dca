"""The Spark the engine runs on: a Spark Connect server (the embedded local default, or a
cluster's ``sc://`` endpoint), or a classic in-process session; the settings the engine
relies on; and one Spark idiom it uses throughout.

The engine uses only APIs that work both over Spark Connect and in a classic session: no
``_jdf``, ``sparkContext``, accumulators or RDDs.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TextIO
from urllib.parse import urlparse

import pyspark
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from .daemon import HOST, Daemon, listening
from .errors import SparkUnavailableError
from .jvm import SPARK, decoder_jar, jars
from .zset import add

ENGINE_CONF = {
    # A step is small and keyed by vnode: broadcasting a trace or letting AQE re-plan
    # partitions would move rows away from the worker that owns their vnode.
    "spark.sql.adaptive.enabled": "false",
    "spark.sql.autoBroadcastJoinThreshold": "-1",
    # Joins and groupings include the exchange's partition column among their keys;
    # this lets Spark reuse that partitioning instead of shuffling again.
    "spark.sql.requireAllClusterKeysForCoPartition": "false",
    "spark.sql.session.timeZone": "UTC",
    # A small step's frames sit in one partition, and a join of two such frames needs no
    # exchange; Spark 4 shuffles them anyway when a side's estimated size passes this, and
    # a checkpointed frame's size is unknown, so it always passes the default (128 MB).
    "spark.sql.maxSinglePartitionBytes": str(2**62),
    # Checkpointed state carries the constraints of the plan that wrote it; propagating them
    # step after step grows the optimizer's work without bound.
    "spark.sql.constraintPropagation.enabled": "false",
    # A trace is a union of parts and a lookup semi-joins it with the step's keys. Pushing
    # joins into the union copies the (large) key subtree once per part, and chained
    # operators multiply those copies.
    "spark.sql.optimizer.pushDownJoinThroughUnion.enabled": "false",
    "spark.sql.optimizer.excludedRules": "org.apache.spark.sql.catalyst.optimizer.PushDownLeftSemiAntiJoin",
    # Below this value, rows sent to a Python worker (the step's writer) are batched by size
    # too, which sums the Arrow buffers of every column, nested ones included, before each
    # row: a sixth of a 100,000-row step's task time.  Batches stay bounded by
    # spark.sql.execution.arrow.maxRecordsPerBatch (10,000 rows).
    "spark.sql.execution.arrow.maxBytesPerBatch": str(2**31 - 1),
}

INTERPRETED = {
    # A small step is one task over a few thousand rows, planned anew each step: compiling
    # its operators' code (thousands of classes a step, the codegen cache holds 100) cost
    # more than half its time; interpreting its rows costs far less.
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
}
"""Settings of a step of few rows (see :data:`circuits.runner.INTERPRETED_STEP_ROWS`)."""
COMPILED = {"spark.sql.codegen.wholeStage": "true", "spark.sql.codegen.factoryMode": "FALLBACK"}
"""Settings of any other step: Spark's defaults."""

SERVER_CONF = {
    # PySpark records the Python call site of every Column and DataFrame call for Spark's
    # error messages: a stack walk, a failed IPython import and four JVM calls each, which
    # made up most of a step's planning.  The engine names the user's call site itself.
    "spark.python.sql.dataFrameDebugging.enabled": "false",
    "spark.ui.enabled": "false",
    # A small step runs all its operators in one task, and each hash aggregate, join and
    # sort takes a page of memory at least: at the default size (up to 64 MB) a step
    # allocated gigabytes, and the collector spent a second a step freeing them.
    "spark.buffer.pageSize": "2m",
    "spark.ui.showConsoleProgress": "false",
    # A step's shared frames are local checkpoints: blocks of RDDs no longer referenced
    # once the step ends.  The cleaner frees them after a JVM garbage collection; ask for
    # one every minute rather than every 30.
    "spark.cleaner.periodicGC.interval": "1min",
    # A large step runs compiled (see circuits.runner.INTERPRETED_STEP_ROWS).  Its classes
    # should stay cached for the next step of the same plan; with the default 100 entries,
    # other queries between steps can evict them (100,000-row steps at 1M state, the peer's
    # queries in between: 1.41 and 1.28 s, against 1.24 and 1.26 s with 5,000).
    "spark.sql.codegen.cache.maxEntries": "5000",
}
"""Settings of the Spark application itself (a classic session's, or a Connect server's)."""

DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}
"""Delta Lake's SQL extension and catalog: ``format("delta")``, ``VERSION AS OF`` and Delta
tables by name."""


def application_conf() -> dict[str, str]:
    """The Spark application's settings: :data:`SERVER_CONF`, Delta's, and the JARs of
    :data:`circuits.jvm.SPARK` (Delta's and Spark's Kafka connectors, resolved on first use)
    and the engine's own (:func:`circuits.jvm.decoder_jar`)."""
    # A folder of JARs (DBSP_JARS_DIR) may hold a copy of the decoder's: the one compiled here wins.
    paths = {os.path.basename(p): p for p in [*jars(SPARK), decoder_jar()]}
    return {**SERVER_CONF, **DELTA_CONF, "spark.jars": ",".join(paths.values())}


CONNECT_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
CONNECT_PORT = 15002


def local_session(cores: int = 2, app_name: str = "dbsp", extra: dict[str, str] | None = None) -> SparkSession:
    """A classic local-mode session with the engine's settings (``cores`` threads in one JVM)."""
    return session(f"local[{cores}]", app_name, extra)


def session(master: str, app_name: str = "dbsp", extra: dict[str, str] | None = None) -> SparkSession:
    """A classic session on ``master`` (``local[N]``, ``spark://host:7077``, ``k8s://...``,
    ``yarn``) with the engine's settings; an existing session in this process is reused."""
    # Python workers (mapInArrow) must run the interpreter that has this project's packages.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # PySpark's mark of a Spark Connect process (see remote_session), inherited from a parent
    # that used Connect, makes the classic builder refuse: this process is a classic one.
    os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in {**ENGINE_CONF, **application_conf(), **(extra or {})}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    # The classic driver's own log level: the one use of sparkContext, outside the engine.
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def remote_session(
    url: str, extra: dict[str, str] | None = None, setting: str = "resources.spark.remote"
) -> SparkSession:
    """This process's session on the Spark Connect server at ``url`` (``sc://host:port``,
    with ``/;session_id=...`` to join a named session) with the engine's settings.  Fails at
    once, naming ``setting``, when nothing answers there; a server that stops answering
    mid-step fails the step within seconds, not minutes.  A named session that has been
    closed (a client stopped it) cannot be joined again: the process then takes its own."""
    from pyspark.sql.connect.client.retries import DefaultPolicy
    from pyspark.sql.connect.session import SparkSession as RemoteSession

    parsed = urlparse(url)
    if parsed.scheme != "sc" or not parsed.hostname:
        raise SparkUnavailableError(f"{setting}={url!r}: expected a Spark Connect URL such as sc://host:15002")
    port = parsed.port or CONNECT_PORT
    if not listening(port, parsed.hostname, timeout=5):
        raise SparkUnavailableError(
            f"no Spark Connect server answers at {url} ({setting}); start one there "
            "(pyspark's sbin/start-connect-server.sh) or remove the setting to use the embedded local server"
        )
    # What SparkSession.builder.remote() does too: PySpark's functions build Connect columns.
    os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
    spark = RemoteSession.builder.remote(_joinable(url)).config(map={**ENGINE_CONF, **(extra or {})}).getOrCreate()
    # The default policy retries an unreachable server for ten minutes.
    spark.client.set_retry_policies([DefaultPolicy(max_retries=4, initial_backoff=100, max_backoff=2000)])
    return spark


def _joinable(url: str) -> str:
    """``url``, or ``url`` without its session when that session was closed: it cannot be
    joined again.  Asked with a bare client: a session object made for a closed session
    hangs the interpreter's exit."""
    from pyspark.errors.exceptions.connect import SparkConnectException

    if ";session_id=" not in url:
        return url
    try:
        with bare_client(url) as client:
            client.get_configs("spark.app.id")
        return url
    except SparkConnectException as e:
        if "INVALID_HANDLE.SESSION_CLOSED" not in str(e):
            raise
        return unnamed(url)


def unnamed(url: str) -> str:
    """``url`` without the server session it names: a client of it starts a session of its own."""
    return re.sub(r";session_id=[^;]*", "", url)


@contextmanager
def bare_client(url: str, **options) -> Iterator:
    """A Spark Connect client of no session object, closed after use.  PySpark registers
    every client's exit hook with ``atexit``, which keeps a closed client (its channel, stubs
    and thread pools) alive as long as the process: a resident worker asking per run grew
    without bound.  The hook goes with the close."""
    import atexit

    from pyspark.sql.connect.client import SparkConnectClient

    client = SparkConnectClient(url, **options)
    try:
        yield client
    finally:
        client.close()
        atexit.unregister(client._on_exit)


def connect_server(
    state_dir: str,
    port: int = CONNECT_PORT,
    master: str = "local[2]",
    driver_memory: str = "4g",
    conf: dict[str, str] | None = None,
    timeout: float = 120.0,
    log_level: str = "WARN",
) -> str:
    """The URL of the embedded Spark Connect server on 127.0.0.1:``port``, started (detached,
    from the pyspark wheel, pid and log in ``state_dir``) unless a healthy one listens there.

    Every process of the machine then shares this one warm JVM: a Dagster run connects in
    well under a second instead of starting its own Spark.  They share one session of it
    too (the URL names it): the server starts Python workers (``mapInArrow``) per session,
    and keeps them after the session ends, so a session per run cost each run a second
    to start them and left three processes behind.  Its log holds ``log_level`` and above
    (Spark's INFO lines fill a megabyte in minutes) and rolls over (:meth:`~circuits.daemon.Daemon.write_logging`)."""
    url = f"sc://{HOST}:{port}"
    application: list[str] = []
    daemon = Daemon("spark-connect", port, state_dir)
    daemon.write_logging(log_level)
    home = os.path.dirname(pyspark.__file__)
    settings = {
        **application_conf(),
        "spark.connect.grpc.binding.address": HOST,
        "spark.connect.grpc.binding.port": str(port),
        # The shared session lives as long as the server.
        "spark.connect.session.manager.defaultSessionTimeout": "-1",
        **(conf or {}),
    }
    command = [
        os.path.join(home, "bin", "spark-submit"),
        "--class",
        CONNECT_CLASS,
        "--name",
        "dbsp",
        "--master",
        master,
        "--driver-memory",
        driver_memory,
        "--driver-java-options",
        daemon.logging_option,
        *[arg for key, value in settings.items() for arg in ("--conf", f"{key}={value}")],
    ]

    decoder = os.path.basename(os.path.dirname(decoder_jar()))  # named after its sources

    def ready(process: subprocess.Popen | None) -> None:
        deadline = time.monotonic() + (timeout if process is not None else 10.0)
        while not listening(port, timeout=0.5):
            if process is not None and process.poll() is not None:
                raise SparkUnavailableError(
                    f"the embedded Spark Connect server exited with code {process.returncode} while starting; "
                    f"see {daemon.log_path}"
                )
            if time.monotonic() > deadline:
                raise SparkUnavailableError(
                    f"the embedded Spark Connect server did not listen on {HOST}:{port} within "
                    f"{timeout:g} s; see {daemon.log_path}"
                )
            time.sleep(0.1)
        found, jars = _probe(url, daemon.log_path)
        if process is None and decoder not in {os.path.basename(os.path.dirname(j)) for j in (jars or "").split(",")}:
            # Started by another version of the engine, whose decoder takes other arguments:
            # the daemon stops it and starts this one's.
            raise SparkUnavailableError(f"the Spark Connect server at {url} has another engine's decoder: {jars}")
        application.append(found)

    # Python workers (mapInArrow) must run the interpreter that has this project's packages.
    daemon.ensure(command, ready, env={"SPARK_HOME": home, "PYSPARK_PYTHON": sys.executable})
    # Named after the server's application: a server started anew has new sessions.
    return f"{url}/;session_id={uuid.uuid5(uuid.NAMESPACE_URL, f'{url} {application[-1]}')}"


def _probe(url: str, log_path: str) -> tuple[str, str | None]:
    """The application id and the JARs of the server at ``url``: a listening but hung
    server fails to say."""
    try:
        # A bare client: a session of this process would outlive the probe.
        with bare_client(url, retry_policy={"max_retries": 2}) as probe:
            found, jars = probe.get_configs("spark.app.id", "spark.jars")
            return found, jars
    except Exception as e:
        raise SparkUnavailableError(f"the Spark Connect server at {url} does not answer ({e}); see {log_path}") from e


def stop_connect_server(state_dir: str, port: int = CONNECT_PORT) -> bool:
    """Stops the server :func:`connect_server` started; whether one was running."""
    return Daemon("spark-connect", port, state_dir).stop()


@contextmanager
def round_trips(spark: SparkSession, trace: TextIO | None = None, seconds: Counter | None = None) -> Iterator[Counter]:
    """Counts the round trips ``spark`` (a Spark Connect session) makes to its server
    during the block, by RPC: ``ExecutePlan`` runs an action or a command, ``AnalyzePlan``
    asks for a schema (or caches a frame), ``Config`` reads or sets a setting.

    With ``trace`` or ``seconds``, each call is timed to its end (a streamed answer is
    read whole): ``seconds[rpc]`` sums those times (the wall time the client waited on
    the server), and ``trace`` gets a line per call: the RPC, its start (seconds into the
    block), its seconds, its thread, and the project's call sites that made it (innermost
    first)."""
    calls: Counter = Counter()
    opened = time.perf_counter()
    stub = spark.client._stub
    originals = {name: getattr(stub, name) for name in ("ExecutePlan", "AnalyzePlan", "Config")}

    counting = threading.Lock()  # a step plans several nodes at once

    def counted(name: str, method):
        def call(*args, **kwargs):
            with counting:
                calls[name] += 1
            if trace is None and seconds is None:
                return method(*args, **kwargs)
            started = time.perf_counter()
            answer = method(*args, **kwargs)
            answer = list(answer) if name == "ExecutePlan" else answer
            if seconds is not None:
                with counting:
                    seconds[name] += time.perf_counter() - started
            if trace is None:
                return answer
            sites = [
                f"{os.path.relpath(f.filename, _PROJECT)}:{f.lineno}:{f.name}"
                for f in traceback.extract_stack()
                if f.filename.startswith(_PROJECT) and "site-packages" not in f.filename and f.filename != __file__
            ]
            print(
                f"{name} +{started - opened:.3f} {time.perf_counter() - started:.3f} {threading.current_thread().name}"
                f" {' < '.join(reversed(sites[-3:]))}",
                file=trace,
            )
            return answer

        return call

    for name, method in originals.items():
        setattr(stub, name, counted(name, method))
    try:
        yield calls
    finally:
        for name, method in originals.items():
            setattr(stub, name, method)


_PROJECT = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def set_all(spark: SparkSession, settings: dict[str, str]) -> None:
    """Sets ``settings`` in ``spark``: over Spark Connect in one round trip (one Config
    request carries any number of them, but the public ``conf.set`` sends one each, which a
    step's first settings paid three times); in a classic session, by ``conf.set`` (no
    round trip)."""
    set_many = getattr(spark.conf, "_set_all", None)  # the Connect client's, PySpark 4
    if set_many is None:
        for key, value in settings.items():
            spark.conf.set(key, value)
    else:
        set_many(settings, silent=False)


def aggregate_each(frames: Sequence[DataFrame], *aggregates: Column) -> list[tuple | None]:
    """``aggregates`` over each of ``frames`` (which have the same columns), all computed by
    one Spark job: a tuple per frame, or None for a frame without rows."""
    if not frames:
        return []
    labelled = [df.select(F.lit(i).alias("_frame"), "*") for i, df in enumerate(frames)]
    rows = add(*labelled).groupBy("_frame").agg(*aggregates).collect()
    found = {row[0]: tuple(row[1:]) for row in rows}
    return [found.get(i) for i in range(len(frames))]


def map_in_arrow(df: DataFrame, func: Callable, schema: T.StructType, columns: Sequence[str]) -> DataFrame:
    """``df.mapInArrow(func, schema)`` for a ``df`` whose columns are ``columns``.  Over Spark
    Connect, PySpark's own ``mapInArrow`` asks the server for ``df``'s columns first: an
    analysis of ``df``'s whole plan, which the job then analyses again."""
    if not is_remote(df):
        return df.mapInArrow(func, schema)
    from pyspark.sql.connect.dataframe import DataFrame as RemoteFrame
    from pyspark.sql.connect.plan import MapPartitions
    from pyspark.sql.connect.udf import UserDefinedFunction
    from pyspark.util import PythonEvalType

    udf = UserDefinedFunction(func, returnType=schema, evalType=PythonEvalType.SQL_MAP_ARROW_ITER_UDF)
    mapped = RemoteFrame(MapPartitions(df._plan, udf, list(columns), False, None), session=df.sparkSession)
    mapped._cached_schema = schema
    return mapped


def is_remote(df: DataFrame | SparkSession) -> bool:
    """Whether ``df`` is a Spark Connect frame (or session)."""
    return type(df).__module__.startswith("pyspark.sql.connect")
