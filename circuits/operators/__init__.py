"""Incremental operators, one module per family: linear, bilinear, non-linear, top-k, window functions, time, keyed (KLogs)."""

from .base import Operator
from .bilinear import Join, KeyedJoin
from .keyed import Loop, Partition
from .linear import Filter, FlatMap, Input, Negate, Select, Union
from .nonlinear import AGG_KINDS, MOMENTS, Agg, Aggregate, DefaultRow, Distinct, SetOperation
from .time import Delay, Differentiate, Integrate
from .topk import SortKey, TopK
from .window import WindowFunctions

__all__ = [
    "AGG_KINDS",
    "Agg",
    "Aggregate",
    "DefaultRow",
    "Delay",
    "Differentiate",
    "Distinct",
    "Filter",
    "FlatMap",
    "Input",
    "Integrate",
    "Join",
    "KeyedJoin",
    "MOMENTS",
    "Loop",
    "Negate",
    "Operator",
    "Partition",
    "Select",
    "SetOperation",
    "SortKey",
    "TopK",
    "Union",
    "WindowFunctions",
]
