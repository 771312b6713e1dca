"""Source errors: Kafka (confluent_kafka) failures translated at the sensors boundary."""

from circuits.errors import DbspError


class SourceError(DbspError):
    """Reading from or writing to an input source failed."""


class BrokerUnavailableError(SourceError):
    """No broker at the configured bootstrap servers answered in time."""


class BrokerStalledError(SourceError):
    """A broker answered but stopped acknowledging or delivering records."""


class TopicNotFoundError(SourceError):
    """A topic the pipeline reads does not exist on the broker."""


class OffsetsLostError(SourceError):
    """Offsets a step needs are no longer on the broker: below its log start (retention),
    or above its end (the topic was deleted and created again, or the broker lost its log)."""


class UnsupportedSchemaError(SourceError):
    """An input schema has a column type the JSON decoder does not validate."""
