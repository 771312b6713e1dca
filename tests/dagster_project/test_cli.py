"""The ``dbsp`` command as a user runs it: the installed script, in a minimal environment
(no venv on PATH), its demo's terminal output, and ``dbsp dev`` stopped by a Ctrl-C."""

import contextlib
import json
import os
import pty
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import dagster as dg
import pytest
import yaml

from circuits.daemon import free_port, listening
from dagster_project.cli import dagster_yaml
from dagster_project.devserver import create_instance
from dagster_project.event_log import LocalEventLogStorage

PROJECT = Path(__file__).resolve().parents[2]
DBSP = str(Path(sys.executable).parent / "dbsp")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def minimal_env(tmp_path, **extra) -> dict:
    """What a fresh login shell has: no venv activated, no PYTHONPATH, no DAGSTER_HOME
    (JAVA_HOME kept where set: Spark needs it on machines without java on PATH)."""
    java = {"JAVA_HOME": os.environ["JAVA_HOME"]} if "JAVA_HOME" in os.environ else {}
    return {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "DBSP_HOME": str(tmp_path / "dbsp"), **java, **extra}


def demo_config(tmp_path, spark_resource: dict, name: str) -> Path:
    """The built-in demo pipeline on an embedded broker of its own (a free port, stopped
    by :func:`stop_daemons`) and the test session's Spark."""
    settings = {
        "pipelines": [
            {
                "name": name,
                "circuit": "circuits.library.nexmark_queries:nexmark_circuit",
                "sources": {h: f"{name}.{h}" for h in ("persons", "auctions", "bids")},
                "sinks": ["bids_by_category", "q3", "q4", "q15"],
                "producer": "circuits.library.nexmark:nexmark_records",
            }
        ],
        "resources": {"kafka": {"embedded_port": free_port()}, "spark": spark_resource},
    }
    path = tmp_path / "dbsp.yaml"
    path.write_text(yaml.safe_dump(settings))
    return path


def stop_daemons(config: Path, env: dict) -> None:
    subprocess.run([DBSP, "--config", str(config), "stop"], env=env, capture_output=True, timeout=60)


@pytest.fixture
def demo_env(tmp_path):
    """A minimal environment; the embedded daemons its commands start are stopped after."""
    env = minimal_env(tmp_path, TERM="xterm", COLUMNS="120")
    yield env
    for config in tmp_path.glob("dbsp.yaml"):
        stop_daemons(config, env)


@pytest.mark.slow
def test_the_installed_command_runs_without_an_activated_venv(tmp_path, demo_env):
    env = demo_env
    helped = subprocess.run([DBSP, "--help"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert helped.returncode == 0, helped.stderr
    assert "demo" in helped.stdout and "dev" in helped.stdout
    # dbsp dev starts Dagster from dbsp's own interpreter, not a `dagster` looked up on PATH.
    dev_help = subprocess.run(
        [DBSP, "dev", "--help"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert dev_help.returncode == 0, dev_help.stderr
    assert "dagster dev [OPTIONS]" in dev_help.stdout

    config = demo_config(tmp_path, {}, "bare")
    status = subprocess.run(
        [DBSP, "--config", str(config), "status"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert status.returncode == 0, status.stderr
    assert status.stdout.startswith("pipeline bare\ncommitted through step -1 (next step 0)")


def run_in_terminal(command: list[str], env: dict, cwd, timeout: float) -> tuple[int, str]:
    """Runs ``command`` with a pseudo-terminal as stdout and stderr (as in a shell); its output."""
    leader, follower = pty.openpty()
    process = subprocess.Popen(command, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=follower, stderr=follower)
    os.close(follower)
    chunks, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: every writer closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    try:
        return process.wait(timeout=max(1, deadline - time.monotonic())), b"".join(chunks).decode(errors="replace")
    finally:
        process.kill()


@pytest.mark.slow
def test_the_demo_shows_progress_a_line_per_step_and_logs_the_rest(tmp_path, demo_env, spark_resource):
    config = demo_config(tmp_path, spark_resource, "demo")
    code, output = run_in_terminal(
        [DBSP, "--config", str(config), "demo", "--steps", "2", "--events-per-step", "300"],
        demo_env,
        tmp_path,
        timeout=600,
    )
    assert code == 0, output[-3000:]
    # What stays on the screen: the live line is redrawn in place (carriage returns,
    # erase-line codes) and erased at the end.
    (tmp_path / "terminal.txt").write_text(output)
    screen = [ANSI.sub("", line.rstrip("\r").rsplit("\r", 1)[-1]) for line in output.split("\n")]
    screen = [line for line in screen if line.strip()]
    assert len(output.split("\n")) <= 40, output
    assert "DEBUG" not in output
    steps = [line for line in screen if line.startswith("step ")]
    assert len(steps) == 2, screen
    assert re.match(r"step 0: events 0\.\.300, rows 300 in / \d+ out, [\d.]+ s \(.*compute [\d.]+", steps[0]), steps
    assert steps[1].startswith("step 1: events 300..600, rows 300 in /"), steps
    for view in ("bids_by_category", "q3", "q4", "q15"):
        assert f"{view} equals Spark batch SQL: yes" in screen, screen
    assert "asset checks: 8 of 8 passed" in screen  # 2 steps x 4 views
    assert any("Kafka broker on port" in line and "`dbsp stop` stops it" in line for line in screen), screen
    assert "⠋" in output or "0:00:0" in output, "no live progress line was drawn"

    log = Path(screen[-1].split(": ", 1)[1])
    assert log.parent == tmp_path / "dbsp" / "logs" and log.name.startswith("demo-"), screen[-1]
    text = log.read_text()
    # Dagster's events (its console logger), in plain text, and the lines the screen got.
    assert text.count("ASSET_MATERIALIZATION") == 8 and "DEBUG" in text and "\x1b[" not in text
    assert all(line in text for line in steps)


VIEWS = """\
CREATE TEMPORARY VIEW priced AS SELECT b.price, a.category FROM bids b JOIN auctions a ON b.auction = a.id;
CREATE MATERIALIZED VIEW revenue AS SELECT category, sum(price) AS revenue, count(*) AS bids FROM priced GROUP BY category;
CREATE MATERIALIZED VIEW busy AS SELECT category FROM revenue WHERE bids > 3 AND category IN (SELECT category FROM auctions);
CREATE MATERIALIZED VIEW sellers AS SELECT DISTINCT p.state FROM persons p JOIN auctions a ON a.seller = p.id;
"""


@pytest.mark.slow
def test_the_demo_runs_the_views_of_a_sql_file_checks_each_and_prints_plain_lines_off_a_terminal(
    tmp_path, demo_env, spark_resource
):
    config = demo_config(tmp_path, spark_resource, "sqldemo")
    (tmp_path / "mine.sql").write_text(VIEWS)
    # This tree's CLI (the installed `dbsp` may be another checkout's).
    command = [sys.executable, "-m", "dagster_project.cli", "--config", str(config), "demo", "--sql", "mine.sql"]
    done = subprocess.run(
        [*command, "--steps", "2", "--events-per-step", "200"],
        env={**demo_env, "PYTHONPATH": str(PROJECT)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # Not on a terminal: plain lines, no live line redrawn, nothing on stderr.
    assert "\x1b" not in done.stdout and "\r" not in done.stdout and done.stderr == ""
    lines = done.stdout.splitlines()
    assert [line for line in lines if line.startswith("step ")][0].startswith("step 0: events 0..200"), lines
    assert [line for line in lines if " equals Spark batch SQL: " in line] == [
        f"{view} equals Spark batch SQL: yes" for view in ("revenue", "busy", "sellers")
    ], lines


@pytest.mark.slow
def test_a_sql_file_spark_cannot_analyse_fails_the_demo_before_anything_is_written(tmp_path, demo_env, spark_resource):
    config = demo_config(tmp_path, spark_resource, "badsql")
    (tmp_path / "bad.sql").write_text(VIEWS.replace("sum(price)", "sum(prize)"))
    command = [
        sys.executable,
        "-m",
        "dagster_project.cli",
        "--config",
        str(config),
        "demo",
        "--sql",
        "bad.sql",
        "--steps",
        "1",
    ]
    done = subprocess.run(
        command, env={**demo_env, "PYTHONPATH": str(PROJECT)}, cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "bad.sql:2, view 'revenue'" in done.stdout and "prize" in done.stdout, done.stdout
    assert not (tmp_path / "dbsp" / "pipelines" / "badsql").exists()


def served(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=2):
            return True
    except OSError:
        return False


def session_processes(sid: int) -> list[tuple[int, str]]:
    """Live processes of session ``sid``, with their command lines."""
    found = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[3]) == sid and fields[0] != "Z":
            found.append((int(name), cmdline[:120]))
    return found


def dev_config(tmp_path) -> Path:
    """The project's example configuration with its state, broker and Dagster under tmp_path."""
    settings = yaml.safe_load((PROJECT / "dbsp.example.yaml").read_text())
    settings["resources"]["store"]["root"] = str(tmp_path / "pipelines")
    settings["resources"]["kafka"]["embedded_port"] = free_port()
    for pipeline in settings["pipelines"]:
        pipeline["sensor_interval_seconds"] = 1  # a tick (and its broker start) while we wait
    path = tmp_path / "dbsp.yaml"
    path.write_text(yaml.safe_dump(settings))
    return path


@pytest.mark.slow
def test_ctrl_c_stops_dbsp_dev_and_everything_it_started_within_10_s(tmp_path):
    config, port = dev_config(tmp_path), free_port()
    env = minimal_env(tmp_path, DBSP_CONFIG=str(config))
    log = open(tmp_path / "dev.log", "w+")
    dev = subprocess.Popen(
        [DBSP, "dev", "-h", "127.0.0.1", "-p", str(port)],
        env=env,
        cwd=tmp_path,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # its own group, as a terminal's job
    try:
        deadline = time.monotonic() + 180
        while not served(port):
            assert dev.poll() is None and time.monotonic() < deadline, (tmp_path / "dev.log").read_text()[-3000:]
            time.sleep(1)
        # The daemon ticks the sensor, whose code server starts the embedded broker (its JARs
        # resolved first, once per home): Ctrl-C once it serves, so that the note names it.
        broker = yaml.safe_load(config.read_text())["resources"]["kafka"]["embedded_port"]
        while not listening(broker):
            assert dev.poll() is None and time.monotonic() < deadline, (tmp_path / "dev.log").read_text()[-3000:]
            time.sleep(1)
        started = session_processes(dev.pid)
        assert len(started) >= 5, started  # dbsp, dagster dev, webserver, daemon, code server(s)

        os.killpg(dev.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        stopping = time.monotonic()
        # The session holds every descendant but the embedded daemons (which detach on purpose).
        while session_processes(dev.pid) and time.monotonic() - stopping < 10:
            time.sleep(0.2)
        left = session_processes(dev.pid)
        assert not left, f"still running {time.monotonic() - stopping:.0f} s after Ctrl-C: {left}"
        assert dev.wait(timeout=1) == 130
        log.seek(0)
        said = log.read()
        assert "dbsp dev: stopped." in said and "`dbsp stop` stops" in said, said[-2000:]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(dev.pid, signal.SIGKILL)
        log.close()
        # The embedded broker the sensor started runs in a session of its own on purpose.
        subprocess.run([DBSP, "stop"], env=env, cwd=tmp_path, capture_output=True, timeout=60)


def test_dbsp_dev_on_a_port_in_use_says_so_once(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        done = subprocess.run(
            [DBSP, "dev", "-p", str(port)],
            env=minimal_env(tmp_path),
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        seconds = time.monotonic() - started
        # Asking for help is not serving: dagster dev's help, whatever the port.
        helped = subprocess.run(
            [DBSP, "dev", "-p", str(port), "--help"],
            env=minimal_env(tmp_path, PYTHONPATH=str(PROJECT)),
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 2
    assert done.stderr.count("address already in use") == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"127.0.0.1:{port}" in done.stderr and seconds < 30
    assert helped.returncode == 0 and "dagster dev [OPTIONS]" in helped.stdout, helped.stderr


def served_jobs(port: int) -> set[str]:
    query = {"query": "{ repositoriesOrError { ... on RepositoryConnection { nodes { jobs { name } } } } }"}
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/graphql", json.dumps(query).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        nodes = json.load(answer)["data"]["repositoriesOrError"]["nodes"]
    return {job["name"] for node in nodes for job in node["jobs"]}


@pytest.mark.slow
def test_dbsp_dev_serves_the_configuration_given_with_config(tmp_path):
    settings = yaml.safe_load(dev_config(tmp_path).read_text())
    for pipeline in settings["pipelines"]:
        pipeline["sensor_running"] = False  # no broker needed
    given = tmp_path / "given.yaml"
    given.write_text(yaml.safe_dump(settings))
    # What dbsp dev finds by itself: ./dbsp.yaml (a decoy here: without it, the built-in
    # demo on the default ports).
    settings["pipelines"] = [{**settings["pipelines"][0], "name": "decoy"}]
    (tmp_path / "dbsp.yaml").write_text(yaml.safe_dump(settings))
    port = free_port()
    # The tree under test, not the one the venv's dbsp script was installed from.
    env = minimal_env(tmp_path, PYTHONPATH=str(PROJECT))
    with open(tmp_path / "dev.log", "w") as log:
        dev = subprocess.Popen(
            [DBSP, "--config", str(given), "dev", "-h", "127.0.0.1", "-p", str(port)],
            env=env,
            cwd=tmp_path,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 180
        while not served(port):
            assert dev.poll() is None and time.monotonic() < deadline, (tmp_path / "dev.log").read_text()[-3000:]
            time.sleep(1)
        jobs = served_jobs(port)
        assert {"nexmark_step_job", "revenue_step_job"} <= jobs and "decoy_step_job" not in jobs, jobs
        assert (tmp_path / "dbsp" / "dagster" / "history" / "event_log.db").exists()  # one database for all runs
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(dev.pid, signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            dev.wait(timeout=15)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(dev.pid, signal.SIGKILL)


GATEWAY_PATH = """
import sys

from dagster_project.cli import main
from dagster_project.config import load_project
from dagster_project.kafka import kafka_settings

assert main(["--config", sys.argv[1], "gateway", "status"]) == 2  # parsed, dispatched: no gateway runs
kafka = kafka_settings(load_project(sys.argv[1], circuits=False))  # what a gateway run reads before it starts
print(kafka.bootstrap_servers, *sorted({m.split(".")[0] for m in sys.modules} & {"pyspark", "dagster"}))
"""


def test_the_gateway_command_loads_neither_dagster_nor_pyspark(tmp_path):
    config = tmp_path / "dbsp.yaml"
    pipeline = {"name": "p", "circuit": "circuits.library.nexmark_queries:nexmark_circuit", "sinks": ["q4"]}
    pipeline["sources"] = {h: f"t.{h}" for h in ("persons", "auctions", "bids")}
    source = {"kind": "generator", "name": "g", "topic": "t.bids", "count": 1}
    config.write_text(
        yaml.safe_dump(
            {"pipelines": [pipeline], "sources": [source], "resources": {"kafka": {"bootstrap_servers": "k:9092"}}}
        )
    )
    env = minimal_env(tmp_path, PYTHONPATH=str(PROJECT), DBSP_HOME=str(tmp_path / "home"))
    done = subprocess.run(
        [sys.executable, "-c", GATEWAY_PATH, str(config)], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["k:9092"]  # the settings read, and no pyspark or dagster module among those loaded


OPEN_INSTANCE = """
import sys
from dagster import DagsterInstance
DagsterInstance.from_config(sys.argv[1]).dispose()
"""


@pytest.mark.slow
def test_a_new_dagster_home_keeps_every_runs_events_in_one_database_made_before_dagster_starts(tmp_path):
    home = tmp_path / "dagster"
    home.mkdir()
    (home / "dagster.yaml").write_text(dagster_yaml(str(home)))
    create_instance(str(home))
    assert (home / "history" / "event_log.db").exists()
    # dagster dev's webserver, daemon and code server open it at once.
    openers = [subprocess.Popen([sys.executable, "-c", OPEN_INSTANCE, str(home)]) for _ in range(3)]
    assert [p.wait(timeout=120) for p in openers] == [0, 0, 0]

    @dg.op
    def one() -> None:
        pass

    @dg.job
    def only_one() -> None:
        one()

    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert isinstance(instance.event_log_storage, LocalEventLogStorage)
        result = only_one.execute_in_process(instance=instance)
        assert result.success
    assert not list((home / "history").glob(f"**/{result.run_id}.db"))
    with dg.DagsterInstance.from_config(str(home)) as instance:  # as another process reads them
        stored = instance.all_logs(result.run_id)
    assert {e.dagster_event_type for e in stored} >= {dg.DagsterEventType.RUN_START, dg.DagsterEventType.RUN_SUCCESS}


@pytest.mark.slow
def test_a_dagster_home_on_postgres_that_does_not_answer_or_was_written_for_sqlite_is_named(tmp_path):
    closed = f"postgresql://dbsp:secret@127.0.0.1:{free_port()}/dagster"
    unanswered = subprocess.run(
        [DBSP, "dev", "-p", str(free_port())],
        env=minimal_env(tmp_path, DBSP_DAGSTER_POSTGRES_URL=closed),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert unanswered.returncode == 2
    assert "DBSP_DAGSTER_POSTGRES_URL" in unanswered.stderr and "Connection refused" in unanswered.stderr
    assert "secret" not in unanswered.stderr and "Traceback" not in unanswered.stderr, unanswered.stderr
    assert "DBSP_DAGSTER_POSTGRES_URL" in (tmp_path / "dbsp" / "dagster" / "dagster.yaml").read_text()

    # A home written for SQLite is not switched over silently.
    sqlite_home = tmp_path / "other" / "dagster"
    sqlite_home.mkdir(parents=True)
    (sqlite_home / "dagster.yaml").write_text(dagster_yaml(str(sqlite_home)))
    env = minimal_env(tmp_path, DAGSTER_HOME=str(sqlite_home), DBSP_DAGSTER_POSTGRES_URL=closed)
    mismatch = subprocess.run([DBSP, "status"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert mismatch.returncode == 2 and "Traceback" not in mismatch.stderr, mismatch.stderr
    assert f"{sqlite_home / 'dagster.yaml'} (written before)" in mismatch.stderr
