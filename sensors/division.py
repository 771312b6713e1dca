"""Cutting a source's records into steps: the offset ranges of the next step.

The division log (a Delta table) is the only record of which offsets belong to which
step.  Each call reads it, asks the sources for their positions (a broker's end offsets,
a Delta table's latest version: see :mod:`sensors.delta_source`), and records at most one
new step; a process that dies between recording and anything else loses nothing, since
the next call starts from the log again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

from storage.faults import failpoint
from storage.logs import DivisionLog, Range

from . import delta_source, upstream
from .delta_source import is_table
from .errors import OffsetsLostError
from .upstream import is_view

Partition = tuple[str, int]


class Positions(Protocol):
    """What a division is cut from: a pipeline's sources (``sensors.ingest.Sources``)."""

    names: list[str]
    """The sources, as a message names them (topics, ``delta:<path>`` tables)."""

    def positions(self) -> dict[Partition, tuple[int, int]]:
        """Per source partition, the first position it still has and the one past its last."""

    def check(self, ranges: list[Range]) -> None:
        """Refuses ranges a step cannot read (raises a :class:`~sensors.errors.SourceError`)."""


@dataclass(frozen=True)
class DivisionPolicy:
    """A step holds at most ``max_records`` records (a Delta table's version counts as
    one); a smaller step is cut once the previous one is ``max_wait`` seconds old (at once
    for the first step)."""

    max_records: int
    max_wait: float


@dataclass(frozen=True)
class Cut:
    """The outcome of one attempt: the recorded step, or why none was recorded."""

    step: int | None
    ranges: list[Range]
    reason: str


def plan(starts: dict[Partition, int], ends: dict[Partition, int], max_records: int) -> list[Range]:
    """A range per partition from its start toward its end, at most ``max_records`` in all.

    The cap is shared by water-filling: partitions with a small backlog take all of it,
    the rest split what is left evenly, so no partition starves behind a busy one.
    """
    backlog = {p: ends[p] - starts[p] for p in ends}
    taken, remaining = {}, max_records
    ordered = sorted(backlog, key=lambda p: (backlog[p], p))
    for i, p in enumerate(ordered):
        taken[p] = min(backlog[p], remaining // (len(ordered) - i))
        remaining -= taken[p]
    return [Range(t, part, starts[(t, part)], starts[(t, part)] + taken[(t, part)]) for t, part in sorted(ends)]


def next_starts(previous: list[Range], offsets: dict[Partition, tuple[int, int]]) -> dict[Partition, int]:
    """Where the next step starts in each partition: where the previous step ended, or the
    earliest retained offset for a partition no step has read.  Offsets that the broker no
    longer has are an error, never a silent skip."""
    ended = {(r.source, r.partition): r.end for r in previous}
    starts = {}
    for p, (low, high) in offsets.items():
        start = ended.get(p, low)
        if start < low:
            raise OffsetsLostError(
                f"topic {p[0]} partition {p[1]}: offsets {start}..{low} were deleted before they were read "
                "(retention); they cannot be recovered: raise the topic's retention or cut steps more often"
            )
        if start > high and is_table(p[0]):
            raise delta_source.went_back(p[0], start, high)
        if start > high and is_view(p[0]):
            raise upstream.went_back(p[0], start, high)
        if start > high:
            raise OffsetsLostError(
                f"topic {p[0]} partition {p[1]}: the broker's end offset {high} is below offset {start}, where the "
                "division log says the next step starts; the topic was deleted and created again (or the broker lost its "
                "log). Point the pipeline at a new store root to start over"
            )
        starts[p] = start
    return starts


def cut_next(divisions: DivisionLog, sources: Positions, policy: DivisionPolicy) -> Cut:
    """Records the division of the next step if the policy says a step is due (and the
    sources can serve its ranges)."""
    step = divisions.next_step()
    offsets = sources.positions()
    topics = sources.names
    previous = divisions.get(step - 1) if step else []
    ranges = plan(next_starts(previous, offsets), {p: high for p, (_, high) in offsets.items()}, policy.max_records)
    records = sum(r.end - r.start for r in ranges)
    if records == 0:
        return Cut(
            None, [], f"no new records in {', '.join(topics)} since step {step - 1}" if step else "no records yet"
        )
    last = divisions.last_recorded_at()
    waited = None if last is None else time.time() - last
    if records < policy.max_records and waited is not None and waited < policy.max_wait:
        return Cut(
            None,
            [],
            f"{records} records waiting; step {step} is cut at {policy.max_records} records or "
            f"{policy.max_wait:g} s after step {step - 1} ({policy.max_wait - waited:.0f} s from now)",
        )
    sources.check(ranges)
    divisions.record(step, ranges)
    failpoint("sensor_after_division", step)
    return Cut(step, ranges, f"step {step}: {records} records")
