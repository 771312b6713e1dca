import os

import pytest

from circuits.daemon import free_port
from circuits.spark import connect_server, local_session, remote_session, stop_connect_server

pytest_plugins = ["tests.hung"]

CLASSIC = "DBSP_TEST_CLASSIC"
"""Set (to anything) to run the tests on a classic in-process session instead of Spark
Connect.  One process cannot hold both kinds: PySpark picks the kind of its columns and
functions per process."""

# Test data is tiny: compiling generated code costs more than it saves.
TEST_CONF = {"spark.sql.codegen.wholeStage": "false", "spark.sql.codegen.factoryMode": "NO_CODEGEN"}


@pytest.fixture(scope="session")
def connect_url(tmp_path_factory):
    """A Spark Connect server of the test session's own (started the way ``dbsp`` starts
    the embedded one), stopped at the end."""
    if os.environ.get(CLASSIC):
        pytest.skip("a Spark Connect test; this run is classic")
    state_dir, port = str(tmp_path_factory.mktemp("spark")), free_port()
    url = connect_server(state_dir, port, driver_memory="2g", conf=TEST_CONF)
    yield url
    stop_connect_server(state_dir, port)


@pytest.fixture(scope="session")
def spark(request):
    """One SparkSession for the whole test session: over Spark Connect, or classic when
    :data:`CLASSIC` is set."""
    if os.environ.get(CLASSIC):
        session = local_session(cores=2, app_name="dbsp-tests", extra=TEST_CONF)
    else:
        session = remote_session(request.getfixturevalue("connect_url"))
    yield session
    session.stop()


@pytest.fixture(scope="session")
def spark_resource(request) -> dict:
    """The Dagster ``resources.spark`` settings for the test session's Spark."""
    if os.environ.get(CLASSIC):
        return {"master": "local[2]", "conf": TEST_CONF}
    return {"remote": request.getfixturevalue("connect_url")}


@pytest.fixture(scope="session")
def broker():
    """One local Apache Kafka node for the whole test session (its log in a temporary
    directory, removed after)."""
    from sensors.broker import LocalBroker

    with LocalBroker() as local:
        yield local


@pytest.fixture(scope="module")
def s3():
    """An S3-compatible server (moto's, ``tests/s3.py``) for the module's tests."""
    from .s3 import s3_server

    with s3_server() as server:
        yield server
