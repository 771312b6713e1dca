"""Named fault points for crash testing.

``DBSP_FAULT=<point>:<step>`` makes the process kill itself (SIGKILL: no cleanup, no
flush) when it reaches ``point`` while working on ``step``.  Unset, a fault point costs
one dictionary lookup.
"""

from __future__ import annotations

import os
import signal

POINTS = (
    "after_division",
    "after_input",
    "after_output",
    "during_state",
    "during_commit",
    "after_commit",
)


def failpoint(point: str, step: int) -> None:
    if os.environ.get("DBSP_FAULT") == f"{point}:{step}":
        os.kill(os.getpid(), signal.SIGKILL)
