"""The SQL front end: a file of Spark SQL views compiled into one circuit.

Parsing (:mod:`.parse`, sqlglot only) loads no Spark, so a configuration's views are
checked where Spark is not wanted (``dbsp gateway``); the compiler and the batch
recomputation load theirs on first use."""

from __future__ import annotations

import importlib

from .errors import SqlError
from .parse import View, parse_views

_SPARK = {"batch_views": ".batch", "standalone_sql": ".batch", "compile_sql": ".compiler"}

__all__ = ["SqlError", "batch_views", "View", "compile_sql", "parse_views", "standalone_sql"]


def __getattr__(name: str):
    if name not in _SPARK:
        raise AttributeError(f"module 'circuits.sql' has no attribute {name!r}")
    value = getattr(importlib.import_module(_SPARK[name], __name__), name)
    globals()[name] = value
    return value
