"""Errors of the SQL front end."""

from __future__ import annotations

from sqlglot import exp

from ..errors import DbspError


class SqlError(DbspError):
    """A SQL file that does not load: a syntax error, an unknown name, a type error, a
    construct the engine cannot maintain incrementally, two views of one name, a cycle.
    The message names the file, the line, the view and the construct."""

    def __init__(self, message: str, node: object = None, line: int | None = None) -> None:
        super().__init__(message)
        self.node = node
        """The construct refused (a sqlglot expression), whose line the message names."""
        self.line = line
        """The line in the file, when no construct names it (Spark's analysis)."""


def located(file: str, line: int, view: str | None, message: str) -> SqlError:
    where = f"{file}:{line}" + (f", view {view!r}" if view else "")
    return SqlError(f"{where}: {message}")


def construct(node: exp.Expression) -> str:
    """``node`` as Spark SQL, whole, for a message: a refusal names what it refuses."""
    return node.sql("spark")
