"""Steps launched the way the UI launches them: GraphQL calls to ``dbsp dev`` (webserver
and daemon, with the Dagster home ``dbsp`` writes, on PostgreSQL), whose runs execute in
the resident step worker (its own SparkSession) against the test broker."""

import contextlib

import psycopg2
import pytest
from dagster import DagsterEventType, DagsterInstance
from dagster._core.instance.ref import InstanceRef

from dagster_project.config import POSTGRES_ENV
from dagster_project.run_coordinator import PIPELINE_TAG
from dagster_project.step_worker import NEW_PROCESS, WORKER_TAG
from storage.pipeline import status

from ..postgres import postgres_server
from .harness import Harness, dagster_dev, finish, graphql, integral, launch, wait_for

BACKFILL = """
mutation($params: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $params) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on PythonError { message }
    ... on InvalidSubsetError { message }
  }
}"""


@pytest.fixture
def webserver(tmp_path, broker, monkeypatch):
    """A Dagster webserver serving one pipeline, its instance in a PostgreSQL server of the
    test's own (``dbsp dev`` started with ``DBSP_DAGSTER_POSTGRES_URL``, as a shared
    deployment runs; the other ``dbsp dev`` tests keep the SQLite home); yields (port,
    Dagster home, pipeline name, the database)."""
    with postgres_server() as database:
        monkeypatch.setenv(POSTGRES_ENV, database.url)  # this process's instance reads the same database
        with dagster_dev(tmp_path, broker.bootstrap, "served", postgres=database.url) as (port, home):
            yield port, home, "served", database


@pytest.mark.slow
def test_backfill_and_run_launched_through_graphql(spark, spark_resource, broker, tmp_path, webserver):
    port, home, name, database = webserver
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
    # The commit is seen before the run ends: the runs below must find nothing ahead.
    assert finish(port, runs[0].run_id, "the backfill's run") == "SUCCESS"
    assert runs[0].tags[WORKER_TAG] != NEW_PROCESS  # handed to the step worker, which ran its step in its own process
    assert not instance.all_logs(runs[0].run_id, of_type=DagsterEventType.STEP_WORKER_STARTING)
    assert status(served.root).checkpoint_version == 1
    assert integral(served.pipeline(spark).outputs.read("bids_by_category", 0, 1)) == served.expected_revenue()

    assert not instance.all_logs(runs[0].run_id, of_type=DagsterEventType.RUN_ENQUEUED)  # nothing was ahead
    assert runs[0].tags[PIPELINE_TAG] == name  # the asset page's job carries none: the coordinator tags it

    # Two runs at once: the first launches at once, the second queues behind it (one per pipeline).
    first, second = launch(port, name, 1), launch(port, name, 1)
    assert [finish(port, run_id, "a run of a committed step") for run_id in (first, second)] == ["SUCCESS"] * 2
    assert not instance.all_logs(first, of_type=DagsterEventType.RUN_ENQUEUED)
    assert instance.all_logs(second, of_type=DagsterEventType.RUN_ENQUEUED)
    assert status(served.root).checkpoint_version == 1  # a committed step again: nothing changed

    # The webserver, daemon, step worker and this process shared the database: no SQLite in the home.
    assert not list(home.rglob("*.db"))
    with contextlib.closing(psycopg2.connect(database.url)) as db, db.cursor() as cursor:
        cursor.execute("SELECT status FROM runs ORDER BY create_timestamp")
        assert [row[0] for row in cursor.fetchall()] == ["SUCCESS"] * 3
        cursor.execute(
            "SELECT partition FROM event_logs WHERE run_id = %s AND dagster_event_type = 'ASSET_MATERIALIZATION'",
            (runs[0].run_id,),
        )
        assert sorted(row[0] for row in cursor.fetchall()) == steps  # the backfill's, a step each
