"""Source errors: Kafka (confluent_kafka) failures translated at the sensors boundary."""

from circuits.errors import DbspError


class SourceError(DbspError):
    """Reading from or writing to an input source failed."""


class BrokerUnavailableError(SourceError):
    """No broker at the configured bootstrap servers answered in time."""


class TopicNotFoundError(SourceError):
    """A topic the pipeline reads does not exist on the broker."""


class OffsetsLostError(SourceError):
    """Offsets a step needs are no longer on the broker (retention, or the memory-only
    embedded broker restarted), or the broker did not deliver them in time."""


class UnsupportedSchemaError(SourceError):
    """An input schema has a column type the JSON decoder does not validate."""
