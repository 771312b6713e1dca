"""DBSP circuits on Spark: Z-sets, incremental operators, the circuit builder and step runner."""

from . import agg
from .circuit import Circuit, GroupedStream, Stream
from .errors import (
    CircuitChangedError,
    CircuitDefinitionError,
    DbspError,
    ExpressionError,
    SchemaMismatchError,
)
from .runner import StepResult, StepRunner
from .sharding import DEFAULT_VNODES, Layout
from .state import InMemoryStateStore, StateStore
from .zset import WEIGHT, add, consolidate, from_rows, negate

__all__ = [
    "DEFAULT_VNODES",
    "WEIGHT",
    "Circuit",
    "CircuitChangedError",
    "CircuitDefinitionError",
    "DbspError",
    "ExpressionError",
    "GroupedStream",
    "InMemoryStateStore",
    "Layout",
    "SchemaMismatchError",
    "StateStore",
    "StepResult",
    "StepRunner",
    "Stream",
    "add",
    "agg",
    "consolidate",
    "from_rows",
    "negate",
]
