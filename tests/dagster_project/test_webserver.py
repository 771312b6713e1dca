"""Steps launched the way the UI launches them: GraphQL calls to ``dagster dev`` (webserver
and daemon, with the Dagster home ``dbsp`` writes), whose runs execute in their own
processes (own SparkSession) against the test broker."""

import pytest
from dagster import DagsterInstance
from dagster._core.instance.ref import InstanceRef

from storage.pipeline import status

from .harness import LOCATION, Harness, dagster_dev, graphql, integral, wait_for

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


@pytest.fixture
def webserver(tmp_path, broker):
    """A Dagster webserver serving one pipeline; yields (port, Dagster home, pipeline name)."""
    with dagster_dev(tmp_path, broker.bootstrap, "served") as (port, home):
        yield port, home, "served"


@pytest.mark.slow
def test_backfill_and_run_launched_through_graphql(spark, spark_resource, broker, tmp_path, webserver):
    port, home, name = webserver
    instance = DagsterInstance.from_ref(InstanceRef.from_dir(str(home)))
    served = Harness(
        tmp_path, broker.bootstrap, instance, name=name, spark=spark_resource
    )  # the pipeline the webserver serves
    for _ in range(2):
        served.produce(200)
        assert served.tick().run_requests
    steps = [f"{s:010d}" for s in range(2)]

    backfill = graphql(
        port,
        BACKFILL,
        {
            "params": {
                "assetSelection": [{"path": [name, "bids_by_category"]}],
                "partitionNames": steps,
            }
        },
    )["launchPartitionBackfill"]
    assert backfill["__typename"] == "LaunchBackfillSuccess", backfill
    wait_for(lambda: status(served.root).committed_step == 2, 300, "the backfill to commit steps 0 and 1")
    runs = instance.get_runs()
    assert len(runs) == 1, [r.tags for r in runs]  # one run for the whole range: one checkpoint
    assert status(served.root).checkpoint_version == 1
    assert integral(served.pipeline(spark).outputs.read("bids_by_category", 0, 1)) == served.expected_revenue()

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
                "executionMetadata": {"tags": [{"key": "dagster/partition", "value": steps[1]}]},
            }
        },
    )["launchRun"]
    assert launched["__typename"] == "LaunchRunSuccess", launched
    run_id = launched["run"]["runId"]
    final = wait_for(
        lambda: (s := graphql(port, RUN, {"id": run_id})["runOrError"]["status"]) in ("SUCCESS", "FAILURE") and s,
        300,
        "the launched run to finish",
    )
    assert final == "SUCCESS"
    assert status(served.root).checkpoint_version == 1  # a committed step again: nothing changed
