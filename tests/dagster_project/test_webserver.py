"""Steps launched the way the UI launches them: GraphQL calls to ``dagster dev`` (webserver
and daemon, with the Dagster home ``dbsp`` writes), whose runs execute in their own
processes (own SparkSession) against the test broker."""

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
import yaml
from dagster import DagsterInstance
from dagster._core.instance.ref import InstanceRef

from circuits.daemon import free_port
from circuits.spark import stop_connect_server
from dagster_project.cli import DAGSTER_YAML
from storage.pipeline import status

from .harness import Harness, integral, project_settings

LOCATION = "dagster_project.definitions"
BACKFILL = """
mutation($params: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $params) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on PythonError { message }
    ... on InvalidSubsetError { message }
  }
}"""
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
LOCATIONS = """{ workspaceOrError { ... on Workspace { locationEntries { name loadStatus
  locationOrLoadError { __typename ... on PythonError { message } } } } } }"""


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


@pytest.fixture
def webserver(tmp_path, broker):
    """A Dagster webserver serving one pipeline; yields (port, harness settings)."""
    home = tmp_path / "dagster"
    home.mkdir()
    (home / "dagster.yaml").write_text(DAGSTER_YAML)
    name = "served"
    config = tmp_path / "dbsp.yaml"
    # The runs use the embedded Spark Connect server, as ``dbsp dev`` does: the first run
    # starts it (pid and log under $DBSP_HOME/spark), the next one reuses it.
    spark_port = free_port()
    settings = project_settings(str(tmp_path / "store"), broker.bootstrap, name, {"embedded_port": spark_port})
    config.write_text(yaml.safe_dump(settings))
    port = free_port()
    env = {**os.environ, "DAGSTER_HOME": str(home), "DBSP_CONFIG": str(config), "DBSP_HOME": str(tmp_path)}
    log = open(tmp_path / "webserver.log", "wb")
    server = subprocess.Popen(
        [os.path.join(os.path.dirname(sys.executable), "dagster"), "dev", "-m", LOCATION, "-h", "127.0.0.1", "-p", str(port)],
        env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path, start_new_session=True,
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
        yield port, home, name
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # dagster dev and the webserver, daemon and code servers it started
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
        log.close()
        stop_connect_server(str(tmp_path / "spark"), spark_port)


def test_backfill_and_run_launched_through_graphql(spark, spark_resource, broker, tmp_path, webserver):
    port, home, name = webserver
    instance = DagsterInstance.from_ref(InstanceRef.from_dir(str(home)))
    served = Harness(tmp_path, broker.bootstrap, instance, name=name, spark=spark_resource)  # the pipeline the webserver serves
    for _ in range(2):
        served.produce(200)
        assert served.tick().run_requests
    steps = [f"{s:010d}" for s in range(2)]

    backfill = graphql(port, BACKFILL, {"params": {
        "assetSelection": [{"path": [name, "bids_by_category"]}], "partitionNames": steps, 
    }})["launchPartitionBackfill"]
    assert backfill["__typename"] == "LaunchBackfillSuccess", backfill
    wait_for(lambda: status(served.root).committed_step == 2, 300, "the backfill to commit steps 0 and 1")
    runs = instance.get_runs()
    assert len(runs) == 1, [r.tags for r in runs]  # one run for the whole range: one checkpoint
    assert status(served.root).checkpoint_version == 1
    assert integral(served.pipeline(spark).outputs.read("bids_by_category", 0, 1)) == served.expected_revenue()

    launched = graphql(port, LAUNCH, {"params": {
        "selector": {"repositoryLocationName": LOCATION, "repositoryName": "__repository__", "jobName": f"{name}_step_job"},
        "executionMetadata": {"tags": [{"key": "dagster/partition", "value": steps[1]}]},
    }})["launchRun"]
    assert launched["__typename"] == "LaunchRunSuccess", launched
    run_id = launched["run"]["runId"]
    final = wait_for(
        lambda: (s := graphql(port, RUN, {"id": run_id})["runOrError"]["status"]) in ("SUCCESS", "FAILURE") and s,
        300, "the launched run to finish",
    )
    assert final == "SUCCESS"
    assert status(served.root).checkpoint_version == 1  # a committed step again: nothing changed
