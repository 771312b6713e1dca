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


class DeltaInputError(SourceError):
    """A Delta table input cannot be taken as the pipeline needs it: the message names the
    table and what to do."""


class DeltaTableMissingError(DeltaInputError):
    """No Delta table is at an input's path."""


class ChangeFeedMissingError(DeltaInputError):
    """A Delta table input has no change data feed for versions a step must read."""


class ChangesVacuumedError(DeltaInputError):
    """The change files (or log entries) of versions a step must read were removed by a
    vacuum or the log's retention."""


class TableRewrittenError(DeltaInputError):
    """A Delta table input was overwritten, replaced or restored to an older version (or
    deleted and created again): its versions no longer continue what earlier steps read."""


class InputColumnsChangedError(DeltaInputError):
    """A column the circuit reads was dropped from a Delta table input, or retyped."""
