"""The operator interface shared by every family."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

from pyspark.sql import Column, DataFrame

from ..context import NodeContext


class Operator(ABC):
    """One node of a circuit: turns the step's input deltas into its output delta.

    ``arity`` is the number of input streams; ``params`` is what identifies the
    operator in the circuit's fingerprint.
    """

    name: ClassVar[str]
    arity: ClassVar[int] = 1
    stateful: ClassVar[bool] = False
    """Keeps state between steps."""
    consolidates: ClassVar[bool] = False
    """The output is always consolidated (no equal rows, no zero weights)."""
    keeps_consolidation: ClassVar[bool] = False
    """The output is consolidated whenever the (single) input is."""
    zero_preserving: ClassVar[bool] = True
    """An empty delta on every input gives an empty output and stages no state change."""
    keeps_append_only: ClassVar[bool] = False
    """The output stream never retracts a row while no input stream does (see
    :attr:`circuits.context.NodeContext.append_only`)."""
    reads_once: ClassVar[bool] = False
    """A unary operator whose input delta appears once in its plan, one relation deep (a
    projection, a filter): see :meth:`circuits.circuit.Circuit.plan`."""
    executor_errors: ClassVar[tuple[type[Exception], ...]] = ()
    """The project's errors (:class:`circuits.errors.DbspError`) this operator's code may
    raise on the executors: a step whose Spark job fails with one raises it (see
    :func:`circuits.errors.raised_on_executor`), not Spark's exception."""

    def params(self) -> dict[str, Any]:
        return {}

    @abstractmethod
    def evaluate(self, ctx: NodeContext, *deltas: DataFrame) -> DataFrame:
        """This step's output delta (lazy: plans Spark work, runs none)."""


def expr_text(expr: Column | str) -> str:
    """A stable text for a column expression, for fingerprints and messages."""
    return expr if isinstance(expr, str) else str(expr)
