"""The project's one error hierarchy.

Every error the engine raises on purpose derives from :class:`DbspError`.  Lower
layers (Spark, Delta, Kafka) raise their own exceptions; each layer translates them
at its boundary into one of these, naming what the user can act on.

An error the engine's code raises on a Spark executor reaches the driver as text inside
Spark's own exception; :func:`raised_on_executor` recovers it there.
"""

from __future__ import annotations

import re
from collections.abc import Iterator


class DbspError(Exception):
    """Root of every error this project raises."""


class CircuitDefinitionError(DbspError):
    """The circuit is built wrongly (bad names, bad arguments, unknown streams)."""


class SchemaMismatchError(DbspError):
    """An input delta does not match the schema its input handle declared."""


class ExpressionError(DbspError):
    """An operator's expression cannot be evaluated (for example a missing column)."""


class RecordError(DbspError):
    """A value made a view's expression fail, and no single input record causes it."""


class CircuitChangedError(DbspError):
    """A circuit whose fingerprint differs from the one that wrote the state."""


class SparkUnavailableError(DbspError):
    """No Spark to run steps on: the Connect server is unreachable or did not start."""


def raised_on_executor(error: BaseException, *kinds: type[DbspError]) -> DbspError | None:
    """The error of one of ``kinds`` that Python code on an executor raised, recovered from
    ``error`` (the Spark exception that failed the job, or one of ours that wraps it: the
    text of every exception in its chain is searched), or None.  Spark passes an
    executor's Python exception on as text, ``<module>.<Name>: <message>``: the first such
    line of a class in ``kinds`` gives the error, with that message."""
    text = "\n".join(str(e) for e in chain(error))
    found = [
        (m.start(), kind, m.group(1)) for kind in kinds for m in [re.search(rf"\b{kind.__name__}: (.*)", text)] if m
    ]
    if not found:
        return None
    _, kind, message = min(found, key=lambda f: f[0])
    return kind(message.strip())


def lost_with_an_executor(error: BaseException) -> bool:
    """Whether ``error`` (or an exception of its chain) is Spark's failure to find the rows
    of a local checkpoint (a step's shared frame) that a lost executor held: unlike a lost
    shuffle's, Spark cannot compute them again, but the step can be run again."""
    return any("CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND" in str(e) for e in chain(error))


def chain(error: BaseException) -> Iterator[BaseException]:
    """``error``, then each exception it was raised from or while handling, once each."""
    seen, e = set(), error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__
