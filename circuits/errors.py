"""The project's one error hierarchy.

Every error the engine raises on purpose derives from :class:`DbspError`.  Lower
layers (Spark, Delta, Kafka) raise their own exceptions; each layer translates them
at its boundary into one of these, naming what the user can act on.
"""


class DbspError(Exception):
    """Root of every error this project raises."""


class CircuitDefinitionError(DbspError):
    """The circuit is built wrongly (bad names, bad arguments, unknown streams)."""


class SchemaMismatchError(DbspError):
    """An input delta does not match the schema its input handle declared."""


class ExpressionError(DbspError):
    """An operator's expression cannot be evaluated (for example a missing column)."""


class CircuitChangedError(DbspError):
    """A circuit whose fingerprint differs from the one that wrote the state."""


class SparkUnavailableError(DbspError):
    """No Spark to run steps on: the Connect server is unreachable or did not start."""
