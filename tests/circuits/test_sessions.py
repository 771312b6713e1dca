"""Every process on the embedded Spark Connect server joins one session of it (its Python
workers are per session), and a process whose named session was closed takes its own."""

import gc
import os
import subprocess
import sys
import uuid
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql.connect.client import SparkConnectClient

from circuits.spark import _probe, remote_session, unnamed

PROJECT = Path(__file__).resolve().parents[2]
CHILD = """
import sys
from circuits.spark import remote_session
spark = remote_session(sys.argv[1])
print(spark.range(7).count(), spark.client._server_session_id)
"""


def _session_of_child(url: str) -> tuple[int, str]:
    run = subprocess.run(
        [sys.executable, "-c", CHILD, url],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(PROJECT)},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    count, session = run.stdout.split()[-2:]
    return int(count), session


def _server_session(url: str) -> str:
    client = SparkConnectClient(url)
    try:
        client.get_configs("spark.app.id")
        return client._server_session_id
    finally:
        client.close()


def test_processes_join_the_embedded_servers_session(connect_url):
    assert ";session_id=" in connect_url
    assert _session_of_child(connect_url) == (7, _server_session(connect_url))


def test_a_client_of_the_unnamed_url_has_settings_of_its_own(spark, connect_url):
    """Settings belong to a server session: a benchmark's peer (Spark batch SQL at Spark's
    defaults) joining the engine's session would turn on adaptive execution in the engine's steps."""
    other = SparkSession.builder.remote(unnamed(connect_url)).create()
    try:
        other.conf.set("spark.sql.adaptive.enabled", "true")
        assert other.client._server_session_id != _server_session(connect_url)
        assert spark.conf.get("spark.sql.adaptive.enabled") == "false"
    finally:
        other.stop()
        spark.conf.set("spark.sql.adaptive.enabled", "false")


def _live_clients() -> int:
    gc.collect()
    return sum(isinstance(o, SparkConnectClient) for o in gc.get_objects())


def test_connecting_again_and_again_keeps_no_client_alive(connect_url):
    """A resident step worker connects once per run (the server's probe, the session's
    check): every client it asked with must be freed, or the worker grows run by run."""
    remote_session(connect_url)
    before = _live_clients()
    for _ in range(5):
        _probe(connect_url.split("/;")[0], "the server's log")
        remote_session(connect_url)
    assert _live_clients() == before


def test_a_process_whose_named_session_was_closed_takes_its_own(connect_url):
    named = f"{connect_url.split('/;')[0]}/;session_id={uuid.uuid4()}"
    closing = SparkConnectClient(named)
    closing.get_configs("spark.app.id")
    closed = closing._server_session_id
    closing.release_session()
    closing.close()
    count, session = _session_of_child(named)
    assert count == 7 and session != closed


def test_the_embedded_server_logs_warnings_only_into_a_rolling_file(connect_url, tmp_path_factory):
    # The test session's server, started by connect_server as dbsp starts the embedded one.
    port = connect_url.split(":")[2].split("/")[0]
    [log] = tmp_path_factory.getbasetemp().glob(f"spark[0-9]*/spark-connect-{port}.log")
    settings = Path(f"{log.parent}/spark-connect-{port}.log4j2.properties").read_text()
    assert "rootLogger.level = WARN" in settings and f"appender.file.fileName = {log}" in settings
    assert "SizeBasedTriggeringPolicy" in settings
    text = log.read_text()
    assert " INFO " not in text, text[:2000]  # at INFO, Spark says which version it runs, first thing
