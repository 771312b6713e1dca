import pytest

from circuits.spark import local_session


@pytest.fixture(scope="session")
def spark():
    """One SparkSession for the whole test session (starting one takes seconds)."""
    session = local_session(
        cores=2,
        app_name="dbsp-tests",
        # Test data is tiny: compiling generated code costs more than it saves.
        extra={"spark.sql.codegen.wholeStage": "false", "spark.sql.codegen.factoryMode": "NO_CODEGEN"},
    )
    yield session
    session.stop()


@pytest.fixture(scope="session")
def broker():
    """One local Kafka broker (tansu) for the whole test session (memory-only, gone after)."""
    from sensors.broker import LocalBroker

    with LocalBroker() as local:
        yield local
