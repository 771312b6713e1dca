"""DBSP circuits on Spark: Z-sets, incremental operators, the circuit builder and step runner.

The public names below load their module on first use: importing a Spark-free module of
this package (:mod:`circuits.errors`, :mod:`circuits.vnodes`, :mod:`circuits.layouts`,
:mod:`circuits.framing`) must not load the engine and PySpark with it (the source gateway
imports those and loads no Spark).
"""

from __future__ import annotations

import importlib

_HOMES = {
    "agg": ".agg",
    "Circuit": ".circuit",
    "GroupedStream": ".circuit",
    "Stream": ".circuit",
    "CircuitChangedError": ".errors",
    "CircuitDefinitionError": ".errors",
    "DbspError": ".errors",
    "ExpressionError": ".errors",
    "SchemaMismatchError": ".errors",
    "StepResult": ".runner",
    "StepRunner": ".runner",
    "DEFAULT_VNODES": ".vnodes",
    "Layout": ".vnodes",
    "InMemoryStateStore": ".state",
    "StateStore": ".state",
    "WEIGHT": ".zset",
    "add": ".zset",
    "consolidate": ".zset",
    "from_rows": ".zset",
    "negate": ".zset",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str):
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'circuits' has no attribute {name!r}")
    module = importlib.import_module(home, __name__)
    value = module if name == "agg" else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOMES))
