"""Example views: each a function a user can copy and adapt."""

from .nexmark import NexmarkGenerator, nexmark_inputs, nexmark_records
from .nexmark_queries import (
    bids_by_category,
    nexmark_circuit,
    q3,
    q4,
    q15,
    revenue_circuit,
)
from .wordcount import word_count

__all__ = [
    "NexmarkGenerator",
    "bids_by_category",
    "nexmark_circuit",
    "nexmark_inputs",
    "nexmark_records",
    "q3",
    "q4",
    "q15",
    "revenue_circuit",
    "word_count",
]
