"""The worker of the distributed DBSP design (docs/design.md), with its coordinator/worker synchronization.

``start(version)`` opens the database and runs steps from its step, in a thread, until
told to stop; ``pause()`` cancels a blocked input read and parks the worker at a step
boundary, returning that step; ``stop(step)`` lets it run up to ``step`` (no further),
then it stores the step and commits.  With several workers, a coordinator pauses them
all, stops them all at the largest paused step, and so stops every worker at the same
step boundary.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from circuits.runner import StepRunner

from .errors import CancelledError, InputTimeoutError, StepOrderError
from .faults import failpoint

if TYPE_CHECKING:
    from .pipeline import Pipeline

RUN, PAUSE, PAUSED, STOP, STOPPED = "run", "pause", "paused", "stop", "stopped"


class Worker:
    def __init__(self, pipeline: Pipeline, poll: float = 0.5) -> None:
        self.pipeline = pipeline
        self.poll = poll
        self._cond = threading.Condition()
        self._state: tuple[str, int | None] = (STOPPED, None)
        self._token = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.next_step: int | None = None

    def versions(self) -> range:
        return self.pipeline.state.versions()

    def start(self, version: int, stop_at: int | None = None) -> None:
        """Opens the database at ``version`` (unless it is open there) and runs steps in a thread."""
        if self.pipeline.state.opened_version != version:
            self.pipeline.state.open(version)
        self._state = (RUN, None) if stop_at is None else (STOP, stop_at)
        self._error = None
        self._token.clear()
        self._thread = threading.Thread(target=self._loop, name="dbsp-worker", daemon=True)
        self._thread.start()

    def pause(self) -> int:
        """Parks the worker at the next step boundary and returns that step."""
        with self._cond:
            self._state = (PAUSE, None)
            self._token.set()
            self._cond.notify_all()
            self._cond.wait_for(lambda: self._state[0] in (PAUSED, STOPPED))
            return self._state[1] if self._state[0] == PAUSED else self.next_step

    def stop(self, step: int) -> int:
        """Runs up to ``step``, stores it, commits; returns the next step.  Raises what the worker raised."""
        with self._cond:
            if self._state[0] != STOPPED:
                self._state = (STOP, step)
                self._token.clear()
                self._cond.notify_all()
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self.next_step

    def _loop(self) -> None:
        pipeline = self.pipeline
        try:
            runner = StepRunner(pipeline.circuit, pipeline.spark, pipeline.state, workers=pipeline.workers)
            pipeline.outputs.discard_replayed()
            first = step = pipeline.state.get_step()
            while True:
                with self._cond:
                    if self._state[0] == PAUSE:
                        self._state = (PAUSED, step)
                        self._cond.notify_all()
                        self._cond.wait_for(lambda: self._state[0] == STOP)
                    kind, target = self._state
                    if kind == STOP and step == target:
                        break
                    if kind == STOP and step > target:
                        raise StepOrderError(f"told to stop at step {target}, but step {step} is already done")
                try:
                    with pipeline.timed("read"):
                        step_input = pipeline.inputs.read(step, timeout=self.poll, cancel=self._token)
                except (CancelledError, InputTimeoutError):
                    continue  # look at the state again
                with pipeline.timed("compute_and_write"):
                    pipeline.compute(step, runner, step_input)
                with pipeline.timed("output_commit"):
                    pipeline.outputs.write(step, pipeline.state.written_outputs)
                failpoint("after_output", step)
                with pipeline.timed("view_commit"):
                    pipeline.views.update(step)  # from the committed log: skipped if done before a crash
                failpoint("after_view", step)
                with pipeline.timed("sinks"):
                    pipeline.sinks.publish(step, pipeline.lease.token or 0)  # tokens skip what a crashed run did
                failpoint("after_sink", step)
                step += 1
                pipeline.state.set_step(step)  # the database's step is the next one to run
            if step > first:  # a run with nothing to do leaves no trace: no new version anywhere
                with pipeline.timed("output_commit"):
                    pipeline.outputs.verify_replayed()
                with pipeline.timed("checkpoint_commit"):
                    pipeline.views.pin(pipeline.state)
                    pipeline.state.commit()
                failpoint("after_commit", step - 1)
            self.next_step = step
        except BaseException as e:
            self._error = e
        finally:
            with self._cond:
                self._state = (STOPPED, None)
                self._cond.notify_all()
