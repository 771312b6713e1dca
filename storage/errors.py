"""Storage errors: Delta Lake and file-system failures translated at this boundary."""

from circuits.errors import DbspError


class StorageError(DbspError):
    """State, input or output storage failed."""


class CorruptTableError(StorageError):
    """A table's data file or log entry is missing or unreadable."""


class OutputMismatchError(StorageError):
    """Replaying a step produced output that differs from the output already written."""


class StepOrderError(StorageError):
    """A step was written or read out of order (a gap, or a step beyond the next one)."""


class DivisionConflictError(StorageError):
    """A step's division of input was recorded already, differently."""


class StaleWriterError(StorageError):
    """Another writer committed first: this writer's view of the pipeline is out of date."""


class InputTimeoutError(StorageError):
    """A step's input did not arrive in time."""


class CancelledError(StorageError):
    """A blocking read was cancelled."""


class LeaseHeldError(StorageError):
    """Another run holds the pipeline's lease: only one run may advance a pipeline at a time."""


class StateFormatError(StorageError):
    """The state was written in a state format this engine does not read."""


class ViewError(StorageError):
    """A sink's current view (``views/<sink>``) cannot be read as asked: no such view, or a
    step that is not committed or no longer retained."""


class NegativeViewError(ViewError):
    """A sink's change log adds up to a negative count for some row: the circuit, or the
    input's retractions, deleted rows that were never there.  The view is not updated."""


class StoreUnreachableError(StorageError):
    """The store's object storage refused or did not answer; ``setting`` is the store's
    setting to fix (``endpoint``, ``root``: its bucket, or ``access_key_id``: the credentials)."""

    def __init__(self, setting: str, message: str):
        super().__init__(message)
        self.setting = setting
