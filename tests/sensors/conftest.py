import uuid

import pytest

from sensors.broker import ensure_topics
from sensors.kafka import KafkaClient


@pytest.fixture
def client(broker):
    """A client of the session's broker."""
    return KafkaClient(broker.bootstrap, timeout=5)


@pytest.fixture
def new_topic(broker):
    """Creates a topic with a unique name: ``new_topic(partitions) -> name``."""

    def create(partitions: int = 1) -> str:
        name = f"t-{uuid.uuid4().hex[:12]}"
        ensure_topics(broker.bootstrap, {name: partitions}, timeout=5)
        return name

    return create
