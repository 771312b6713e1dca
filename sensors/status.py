"""A pipeline's position: committed step, checkpoint, layout, and lag per partition."""

from __future__ import annotations

from dataclasses import dataclass

from storage.logs import DivisionLog
from storage.pipeline import Status, status

from .errors import SourceError
from .ingest import Sources


@dataclass(frozen=True)
class Report:
    status: Status
    # (topic, partition) -> (records not yet in any step, end offset); None when the broker is unreachable
    lag: dict[tuple[str, int], tuple[int, int]] | None
    error: str | None


def report(root: str, source: Sources) -> Report:
    """Where the pipeline at ``root`` stands, and how far its steps trail its sources
    (a Delta table's lag is in versions)."""
    position = status(root)
    divided = DivisionLog(root).get(position.divided_step - 1) if position.divided_step else []
    ended = {(r.source, r.partition): r.end for r in divided}
    try:
        offsets = source.positions()
    except SourceError as e:
        return Report(position, None, str(e))
    lag = {p: (high - ended.get(p, low), high) for p, (low, high) in sorted(offsets.items())}
    return Report(position, lag, None)
