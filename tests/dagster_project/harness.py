"""A pipeline served by Dagster against the test broker: produce, tick the sensor, run steps;
and ``dagster dev`` serving one, for the tests that drive the webserver."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator

import yaml
from dagster import DagsterInstance, build_sensor_context
from dagster._core.storage.tags import (
    ASSET_PARTITION_RANGE_END_TAG,
    ASSET_PARTITION_RANGE_START_TAG,
)

from circuits.daemon import free_port
from circuits.library.nexmark import nexmark_records
from circuits.spark import stop_connect_server
from dagster_project.cli import dagster_yaml
from dagster_project.config import POSTGRES_ENV, parse_project
from dagster_project.devserver import create_instance
from dagster_project.factory import build_definitions, step_key
from sensors.broker import ensure_topics
from sensors.kafka import KafkaClient
from storage.pipeline import Pipeline


def project_settings(root: str, bootstrap: str, name: str, spark: dict | None = None, **settings) -> dict:
    return {
        "pipelines": [
            {
                "name": name,
                "circuit": "circuits.library.nexmark_queries:revenue_circuit",
                "sources": {h: f"{name}.{h}" for h in ("persons", "auctions", "bids")},
                "sinks": ["bids_by_category"],
                "max_records_per_step": 100_000,
                "max_wait_seconds": 0,
                "sensor_running": False,
                "lease_wait_seconds": 0,
                **settings,
            }
        ],
        "resources": {"store": {"root": root}, "kafka": {"bootstrap_servers": bootstrap}, "spark": spark or {}},
    }


def tick(sensor, instance, resources, cursor: str | None = None):
    """One evaluation of ``sensor``, with its partition requests applied as the daemon would."""
    result = sensor(build_sensor_context(instance=instance, resources=resources, cursor=cursor))
    for request in getattr(result, "dynamic_partitions_requests", None) or []:
        instance.add_dynamic_partitions(request.partitions_def_name, request.partition_keys)
    return result


class Harness:
    def __init__(
        self,
        tmp_path,
        bootstrap: str,
        instance: DagsterInstance,
        create_topics: bool = True,
        name: str | None = None,
        spark: dict | None = None,
        project: dict | None = None,
        **settings,
    ) -> None:
        """``project``: sections of ``dbsp.yaml`` besides the pipeline (``sources``, ``gateway``);
        ``settings``: the pipeline's."""
        self.name = name or f"p{uuid.uuid4().hex[:8]}"
        self.settings = project_settings(str(tmp_path / "store"), bootstrap, self.name, spark, **settings) | (
            project or {}
        )
        self.project = parse_project(self.settings, "test")
        self.spec = self.project.pipelines[0]
        self.defs = build_definitions(self.project)
        self.instance = instance
        self.resources = self.defs.resources
        self.source = self.resources["kafka"].topics(self.spec)
        self.client = KafkaClient(bootstrap)
        if create_topics:
            ensure_topics(bootstrap, {t: self.spec.topic_partitions for t in self.source.topics.values()})
        self.root = self.resources["store"].pipeline_root(self.name)
        self.sensor = self.defs.resolve_sensor_def(self.spec.sensor_name)
        self.job = self.defs.resolve_job_def(f"{self.name}_step_job")
        self.produced: dict[str, list[dict]] = {h: [] for h in self.source.topics}
        self.events = 0

    def produce(self, count: int, deletes: int = 0) -> None:
        """The next ``count`` Nexmark events, then retractions (weight -1) of ``deletes`` earlier bids."""
        records = nexmark_records(self.events, count)
        self.events += count
        retract = [{**bid, "_weight": -1} for bid in self.produced["bids"][:deletes]]
        records["bids"] = records["bids"] + retract
        for handle, rows in records.items():
            self.send(handle, [json.dumps(r).encode() for r in rows])
            self.produced[handle] += rows

    def send(self, handle: str, values: list[bytes]) -> None:
        self.client.produce(self.source.topics[handle], values)

    def tick(self, cursor: str | None = None):
        """One sensor evaluation, with its partition requests applied as the daemon would."""
        return tick(self.sensor, self.instance, self.resources, cursor)

    def run(self, first: int, last: int | None = None):
        """Materializes steps ``first..=last`` in one run (a single-run backfill when a range)."""
        tags = {}
        if last is not None:
            tags = {ASSET_PARTITION_RANGE_START_TAG: step_key(first), ASSET_PARTITION_RANGE_END_TAG: step_key(last)}
        return self.job.execute_in_process(
            instance=self.instance,
            partition_key=None if last is not None else step_key(first),
            tags=tags,
            raise_on_error=False,
        )

    def pipeline(self, spark) -> Pipeline:
        return Pipeline(spark, self.root, self.spec.circuit_def, workers=self.spec.workers)

    def expected_revenue(self) -> Counter:
        """bids_by_category recomputed in Python from everything produced (weights included)."""
        category = {a["id"]: a["category"] for a in self.produced["auctions"]}
        revenue, count = Counter(), Counter()
        for bid in self.produced["bids"]:
            w = bid.get("_weight", 1)
            if bid["auction"] in category:
                revenue[category[bid["auction"]]] += w * bid["price"]
                count[category[bid["auction"]]] += w
        return Counter({(c, revenue[c], count[c]): 1 for c in count if count[c] != 0})


def sql_harness(tmp_path, bootstrap: str, instance: DagsterInstance, spark: dict, views: str, **settings) -> Harness:
    """A :class:`Harness` of a pipeline defined by the SQL ``views`` (written to
    ``tmp_path/views.sql``); ``settings``: the pipeline's others."""
    (tmp_path / "views.sql").write_text(views)
    sql = {"circuit": None, "sql": str(tmp_path / "views.sql"), "sinks": []}
    return Harness(tmp_path, bootstrap, instance, spark=spark, **sql, **settings)


def integral(df) -> Counter:
    """The Z-set a change log (with ``_weight``, ``_step``) adds up to."""
    total = Counter()
    columns = [c for c in df.columns if c not in ("_weight", "_step")]
    for row in df.collect():
        total[tuple(row[c] for c in columns)] += row["_weight"]
    return Counter({row: w for row, w in total.items() if w != 0})


LOCATION = "dagster_project.definitions"
LOCATIONS = """{ workspaceOrError { ... on Workspace { locationEntries { name loadStatus
  locationOrLoadError { __typename ... on PythonError { message } } } } } }"""


LAUNCH = """
mutation($params: ExecutionParams!) {
  launchRun(executionParams: $params) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on PythonError { message }
    ... on RunConfigValidationInvalid { errors { message } }
  }
}"""
RUN = """query($id: ID!) { runOrError(runId: $id) { __typename ... on Run { status } } }"""


def graphql(port: int, query: str, variables: dict | None = None) -> dict:
    body = json.dumps({"query": query, "variables": variables or {}}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/graphql", body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            answer = json.load(response)
    except urllib.error.HTTPError as e:
        raise AssertionError(f"GraphQL answered {e.code}: {e.read().decode()[:2000]}") from None
    assert "errors" not in answer, answer
    return answer["data"]


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def launch_step(port: int, name: str, step: int) -> tuple[str, str]:
    """Launches pipeline ``name``'s run of ``step`` as the UI does; returns its id and final status."""
    run_id = launch(port, name, step)
    return run_id, finish(port, run_id, f"step {step}'s run")


def launch(port: int, name: str, step: int) -> str:
    """Launches pipeline ``name``'s run of ``step`` as the UI does; returns its id."""
    launched = graphql(
        port,
        LAUNCH,
        {
            "params": {
                "selector": {
                    "repositoryLocationName": LOCATION,
                    "repositoryName": "__repository__",
                    "jobName": f"{name}_step_job",
                },
                "executionMetadata": {"tags": [{"key": "dagster/partition", "value": step_key(step)}]},
            }
        },
    )["launchRun"]
    assert launched["__typename"] == "LaunchRunSuccess", launched
    return launched["run"]["runId"]


def finish(port: int, run_id: str, what: str) -> str:
    """Run ``run_id``'s final status, once it has one (SUCCESS or FAILURE)."""
    seen: list[str] = []

    def finished() -> str | None:
        seen.append(graphql(port, RUN, {"id": run_id})["runOrError"]["status"])
        return seen[-1] if seen[-1] in ("SUCCESS", "FAILURE") else None

    try:
        return wait_for(finished, 300, f"{what} to finish")
    except AssertionError as e:
        raise AssertionError(f"{e} (run {run_id}, its status: {' -> '.join(dict.fromkeys(seen))})") from None


LOG_TAIL = 150  # lines of dbsp dev's log printed when a test under it fails


@contextlib.contextmanager
def dagster_dev(
    tmp_path,
    bootstrap: str,
    name: str,
    spark: dict | None = None,
    env: dict | None = None,
    postgres: str | None = None,
    **settings,
) -> Iterator[tuple[int, object]]:
    """``dbsp dev`` (``dagster dev``'s webserver, daemon and code server, and the resident step
    worker) serving one pipeline ``name`` with the Dagster home ``dbsp`` writes, until the
    block ends; yields (port, Dagster home).

    Without ``spark``, the runs use the embedded Spark Connect server, as ``dbsp dev`` does:
    the first run starts it (pid and log under $DBSP_HOME/spark), the next ones reuse it, and
    it is stopped at the end.  ``env``: more environment variables for its processes;
    ``settings`` are the pipeline's (see :func:`project_settings`).  With ``postgres`` (a
    database's URL), ``dbsp dev`` writes the home itself, its storage in that database."""
    home = tmp_path / "dagster"
    home.mkdir()
    if postgres is None:
        (home / "dagster.yaml").write_text(dagster_yaml(str(home)))
        create_instance(str(home))
    config = tmp_path / "dbsp.yaml"
    spark_port = None if spark else free_port()
    spark = spark or {"embedded_port": spark_port}
    config.write_text(yaml.safe_dump(project_settings(str(tmp_path / "store"), bootstrap, name, spark, **settings)))
    port = free_port()
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "DBSP_CONFIG": str(config),
        "DBSP_HOME": str(tmp_path),
        **({POSTGRES_ENV: postgres} if postgres else {}),
        **(env or {}),
    }
    log = open(tmp_path / "webserver.log", "wb")
    server = subprocess.Popen(
        [sys.executable, "-m", "dagster_project.cli", "dev", "-h", "127.0.0.1", "-p", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=tmp_path,
        start_new_session=True,
    )

    def loaded():
        try:
            entries = graphql(port, LOCATIONS)["workspaceOrError"]["locationEntries"]
        except OSError:
            return False
        return entries and entries[0]["loadStatus"] == "LOADED" and entries[0]

    try:
        entry = wait_for(loaded, 120, "the webserver to load the code location")
        assert entry["locationOrLoadError"]["__typename"] == "RepositoryLocation", entry
        yield port, home
    except BaseException:
        # CI keeps only pytest's output: the failure's report carries what Dagster's processes said.
        log.flush()
        lines = (tmp_path / "webserver.log").read_bytes().decode(errors="replace").splitlines()
        print(f"--- the last {LOG_TAIL} lines of dbsp dev's log ---", *lines[-LOG_TAIL:], sep="\n")
        raise
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # dbsp dev, and every process it started
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
        log.close()
        if spark_port:
            stop_connect_server(str(tmp_path / "spark"), spark_port)


def python_without_spark(code: str, *args: str) -> str:
    """What ``code`` prints in a new Python process of this project, which starts no Spark
    unless ``code`` does (as a code server, when it loads the definitions).  PySpark's mark
    of a Spark Connect process, which this test process sets once its session is open, is
    not inherited: the new process has no session of either kind."""
    project = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {k: v for k, v in os.environ.items() if k != "SPARK_CONNECT_MODE_ENABLED"}
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=project,
        env={**env, "PYTHONPATH": project},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout
