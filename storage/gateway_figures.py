"""The source gateway's figures per step, kept in the store root beside the logs.

When the offset sensor cuts a step it first asks the running gateway to flush (see
``gateway/control.py``) and keeps the figures the gateway answered in
``<root>/_gateway/<step>.json``, or, when the gateway could not flush, why in
``<root>/_gateway_unflushed/<step>.txt``; a step's Dagster metadata shows them.
"""

from __future__ import annotations

import json
import os

from . import location

FIGURES = "_gateway"


def record_figures(root: str, step: int, figures: dict) -> None:
    """Keeps the gateway's per-source figures as they stood when ``step`` was cut."""
    location.write_text(os.path.join(root, FIGURES, f"{step:010d}.json"), json.dumps(figures))


UNFLUSHED = "_gateway_unflushed"


def record_unflushed(root: str, step: int, reason: str) -> None:
    """Keeps why ``step`` was cut without the gateway's flush."""
    location.write_text(os.path.join(root, UNFLUSHED, f"{step:010d}.txt"), reason)


def unflushed_steps(root: str, first: int, last: int) -> dict[int, str]:
    """The steps of ``first..last`` cut without the gateway's flush, with why."""
    directory = os.path.join(root, UNFLUSHED)
    steps = [int(name[:10]) for name in location.listdir(directory)]
    return {
        step: location.read_text(os.path.join(directory, f"{step:010d}.txt"))
        for step in sorted(s for s in steps if first <= s <= last)
    }


def figures_of_steps(root: str, first: int, last: int) -> dict | None:
    """What the gateway read for steps ``first..last``: per source the bytes, waits for a
    buffer and errors between the cut before ``first`` and the cut of ``last`` (None when
    no gateway figures were kept for them)."""
    directory = os.path.join(root, FIGURES)
    kept = sorted(int(name[:10]) for name in location.listdir(directory))
    upto = [s for s in kept if s <= last]
    if not upto or upto[-1] < first:
        return None
    before = [s for s in kept if s < first]
    end = _load(directory, upto[-1])["sources"]
    start = _load(directory, before[-1])["sources"] if before else {}
    return {
        name: {k: figures.get(k, 0) - start.get(name, {}).get(k, 0) for k in ("bytes", "waits", "errors")}
        | {"status": figures.get("status")}
        for name, figures in end.items()
    }


def _load(directory: str, step: int) -> dict:
    return json.loads(location.read_text(os.path.join(directory, f"{step:010d}.json")))
