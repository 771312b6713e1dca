"""Named fault points for crash testing.

``DBSP_FAULT=<point>:<step>`` makes the process kill itself (SIGKILL: no cleanup, no
flush) when it reaches ``point`` while working on ``step``; with ``DBSP_FAULT_MODE=raise``
it raises :class:`InjectedCrash` instead (a ``BaseException``, so no handler mistakes it
for an error it may recover from), for tests that crash a component inside their own
process.  Unset, a fault point costs one dictionary lookup.
"""

from __future__ import annotations

import os
import signal

POINTS = (
    "after_division",
    "after_input",
    "after_output",
    "after_view",
    "after_sink",
    "during_state",
    "during_commit",
    "after_commit",
)  # the storage workload's points; the sensor has its own, sensor_after_division, and the input log after_taken


class InjectedCrash(BaseException):
    """A crash injected at a fault point (``DBSP_FAULT_MODE=raise``)."""


def failpoint(point: str, step: int) -> None:
    if os.environ.get("DBSP_FAULT") == f"{point}:{step}":
        if os.environ.get("DBSP_FAULT_MODE") == "raise":
            raise InjectedCrash(f"{point}:{step}")
        os.kill(os.getpid(), signal.SIGKILL)
