"""Worker and coordinator of the distributed DBSP design (docs/design.md), in one process:
a pipeline runs a circuit over the input log, writes the output log, and checkpoints its
state database.

Producers ``submit`` each step: the division is recorded durably first, then the input
is persisted, so no output can exist whose input division is unknown.  ``run`` opens
the latest checkpoint, replays and runs the steps whose input exists (discarding, and
verifying, output that was written before), and commits one checkpoint at the end:
the steps of one run are one checkpoint interval.  Recovery after a crash is just the
next ``run``.

Fed by a source, ``run_steps`` drives a step range: it reads each step's recorded division
through the reader its caller passes in (the Kafka side's), persists it, runs and
commits; ``recover`` and ``rescale`` do so under the pipeline's lease, for the CLI and the
Dagster jobs alike.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from circuits import layouts
from circuits.circuit import Circuit
from circuits.errors import lost_with_an_executor
from circuits.klogs import KLogsCircuit
from circuits.records import culprits, data_error, record_error, without
from circuits.runner import StepResult, StepRunner
from circuits.vnodes import Layout
from circuits.zset import WEIGHT

from . import location
from .database import (
    READS,
    STATE_FORMAT,
    DeltaStateStore,
    Relayout,
    compact_log,
    compaction_due,
    latest_checkpoint,
)
from .delta import delta_tables
from .errors import CancelledError, InputTimeoutError, StaleWriterError, StepOrderError, ViewError
from .faults import failpoint
from .lease import Holder, Lease, LeaseRecord
from .logs import STEP, DivisionLog, InputLog, OutputLog, Range, records
from .logs import StepInput as LoggedInput
from .sinks import Sinks
from .tables import open_table
from .views import CurrentViews, retained_view_versions


@dataclass(frozen=True)
class Status:
    """Where a pipeline stands: steps ``< committed_step`` are checkpointed; divisions exist
    for steps ``< divided_step``."""

    committed_step: int
    checkpoint_version: int
    divided_step: int
    meta: dict
    lease_holder: str | None


@dataclass(frozen=True)
class Rescale:
    """A prepared layout change (see :meth:`Pipeline.prepare_rescale`)."""

    before: Layout
    after: Layout
    copy: Relayout
    seconds: float


@dataclass(frozen=True)
class RescaleReport:
    before: Layout
    after: Layout
    vnodes_moved: int
    rows_rewritten: int
    bytes_rewritten: int
    copy_seconds: float  # while steps may go on (hot change only)
    pause_seconds: float  # while no step may run

    @property
    def fraction_moved(self) -> float:
        return self.vnodes_moved / self.before.vnodes


@dataclass(frozen=True)
class Recovery:
    """What :meth:`Pipeline.recover` did."""

    broken: LeaseRecord | None
    """The lease it broke first (None: not asked to, or nobody held it)."""
    ran: range
    next_step: int


@dataclass(frozen=True)
class StepInput:
    """One step's input as its source read it, planned but not necessarily run: per input
    handle a Z-set (a handle with nothing read is absent), the records that could not be
    decoded (``storage.logs.DEAD_LETTER_SCHEMA``) and the bytes taken of each byte-ranged
    source (``storage.logs.TAKEN_SCHEMA``), the last two None when nothing was read."""

    inputs: dict[str, DataFrame]
    dead_letters: DataFrame | None = None
    taken: DataFrame | None = None
    rest: Callable[[], StepInput | None] | None = None
    """A source that reads in two jobs: what the frames above left out, once a job over them
    has run (None: nothing left); see :meth:`storage.logs.InputLog.persist`."""


StepReader = Callable[
    [SparkSession, list[Range], dict[str, StructType], dict[tuple[str, str], int]], AbstractContextManager[StepInput]
]
"""Where a pipeline's input records come from, passed in by the caller (the sources' is
``sensors.ingest.Sources.read``: Kafka topics and Delta tables), so a step's walk goes down (source, division, input
log, step, state and output) and storage imports no source.  Called with the session, the
step's division (its ranges), the inputs' schemas (handle: columns without the weight) and,
per byte-ranged source, the end of what earlier steps took (to drop if sent again), it
plans reading exactly those ranges; its context manager frees what the read holds (the
frames stay readable, giving the same rows, until it exits: the last step of a range
computes from them), and turns an error the input log's write or the step raises because
of the read (a job over the planned read failed) into the source's own."""


def status(root: str) -> Status:
    """Where the pipeline at ``root`` stands.  Read-only and Spark-free: safe while a run
    is advancing it, and cheap enough for a sensor tick."""
    version, step, meta = latest_checkpoint(root)
    lease = Lease(root).current()
    return Status(
        committed_step=step,
        checkpoint_version=version,
        divided_step=DivisionLog(root).next_step(),
        meta=meta,
        lease_holder=lease.holder if lease is not None and lease.held_at(time.time()) else None,
    )


class Pipeline:
    def __init__(
        self,
        spark: SparkSession,
        root: str,
        circuit: Circuit,
        *,
        workers: int = 1,
        verify: bool = True,
        views: Collection[str] = (),
        catalog: str | None = None,
    ):
        """``views``: the outputs whose current contents are kept as Delta tables under
        ``<root>/views`` (see :mod:`storage.views`); Dagster passes every sink that has
        not opted out.  ``catalog``: the session catalog's schema in which each view is a
        table too (Dagster passes the pipeline's name)."""
        unknown = set(views) - set(circuit.outputs)
        if unknown:
            raise ViewError(
                f"views: {sorted(unknown)} are not outputs of circuit {circuit.name!r}; its outputs are {sorted(circuit.outputs)}"
            )
        self.spark = spark
        self.root = root
        location.reach_spark(spark, root)
        self.circuit = circuit
        self.workers = workers
        self.divisions = DivisionLog(root)
        self.inputs = InputLog(spark, root, circuit.inputs)
        self.outputs = OutputLog(spark, root, verify=verify)
        self.state = DeltaStateStore(
            spark, root, frozenset({STATE_FORMAT}) if isinstance(circuit, KLogsCircuit) else READS
        )
        self.views = CurrentViews(spark, root, views, partitions=workers, catalog=catalog)
        self.lease = Lease(root)
        self.sinks = Sinks(root, circuit)
        self.timings: Counter = Counter()

    @contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        """Adds the wall time of the block to ``timings[phase]`` (seconds)."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.timings[phase] += time.perf_counter() - started

    def submit(self, step: int, inputs: dict[str, DataFrame], ranges: list[Range]) -> None:
        """Records ``step``'s division, then persists its input (both idempotent)."""
        self.divisions.record(step, ranges)
        failpoint("after_division", step)
        self.inputs.persist(step, inputs, records=records(ranges))
        failpoint("after_input", step)

    def run(self, through: int | None = None) -> int:
        """Opens the latest checkpoint, then advances (see :meth:`advance`).  Returns the next step."""
        self.open()
        return self.advance(through)

    def open(self) -> None:
        """Opens the state at the latest checkpoint (discarding anything written after it)."""
        self.state.open()

    def ingest(self, step: int, reader: StepReader, held: ExitStack | None = None) -> None:
        """Persists ``step``'s input, read by ``reader`` from the step's recorded division
        (a no-op when already persisted).  Refuses a step the division log has not cut.

        With ``held``, the read stays open until ``held`` closes, and the step computes
        from the rows read rather than reading the input log back (see
        :meth:`storage.logs.InputLog.persist`): the log is committed first all the same."""
        if self.inputs.persisted(step):
            return
        if step >= self.divisions.next_step():
            raise StepOrderError(f"step {step} has no recorded division yet: the sensor has not cut it")
        taken = self.inputs.taken_before(step)
        division = self.divisions.get(step)
        with ExitStack() as scope:
            read = scope.enter_context(reader(self.spark, division, self.circuit.inputs, taken))
            self.inputs.persist(
                step,
                read.inputs,
                read.dead_letters,
                read.taken,
                keep=held is not None,
                records=records(division),
                rest=read.rest and (lambda: (more := read.rest()) and (more.inputs, more.dead_letters, more.taken)),
            )
            failpoint("after_input", step)
            if held is not None:
                held.enter_context(scope.pop_all())
                held.callback(self.inputs.forget, step)  # runs first: nothing reads the freed rows

    def compute(self, step: int, runner: StepRunner, logged: LoggedInput) -> StepResult:
        """Runs ``step`` on its logged input, without the records that make a view's
        expression fail (see :mod:`circuits.records`): those found before (a replay) are
        left out first; those a failure of the step finds are left out, the step is run
        again, and they are dead-lettered once it succeeds.  A failure no record causes
        raises :class:`~circuits.errors.RecordError`, naming the view's expression."""
        deltas = logged.deltas
        recorded = self.inputs.record_errors(step)
        if recorded:
            deltas = without(self.spark, self.circuit, deltas, recorded)
        found = []
        while True:
            try:
                result = runner.step(deltas, logged.retracting, logged.rows, conformed=True)
                break
            except Exception as e:
                error = data_error(e)
                if error is None:
                    raise
                new = culprits(self.spark, self.circuit, deltas)
                if not new:
                    raise record_error(runner, deltas, error) from e
                found += new
                deltas = without(self.spark, self.circuit, deltas, [(c.handle, c.value) for c in new])
        if found:
            self.inputs.add_record_errors(step, found)
        return result

    def quarantine(self, step: int, handle: str, record: dict) -> None:
        """Leaves ``record`` (an input row: its columns and ``_weight``) of input ``handle``
        out of ``step``, which is not committed yet: it is dead-lettered, and the step, run
        or run again, goes on without it (see :meth:`compute`)."""
        if handle not in self.circuit.inputs:
            raise ViewError(f"input {handle!r}: the pipeline's inputs are {sorted(self.circuit.inputs)}")
        columns = [*self.circuit.inputs[handle].names, WEIGHT]
        if sorted(record) != sorted(columns) or not isinstance(record[WEIGHT], int) or record[WEIGHT] == 0:
            raise ViewError(
                f"a record of input {handle!r} has exactly the fields {columns} ({WEIGHT}: a nonzero integer, "
                f"as a dead letter's value shows it); got {sorted(record)}"
            )
        committed = status(self.root).committed_step
        if step < committed:
            raise StepOrderError(f"step {step} is committed already (steps before {committed} are): its input stays")
        self.inputs.quarantine(step, handle, json.dumps({c: record[c] for c in columns}))

    def run_steps(self, reader: StepReader, first: int, last: int) -> range:
        """Runs steps ``first..=last`` in order as one checkpoint, each step's input read
        once by ``reader`` and persisted first, and returns the steps it ran (empty when all
        were committed).  Refuses, naming it, a step whose predecessor is not committed."""
        steps = self.pending(first, last)
        with ExitStack() as held:
            for step in steps:
                with self.timed("ingest"):
                    # Only the last step's read is held for its step, so a long range holds
                    # one step's records at a time; the others are read back from the log.
                    self.ingest(step, reader, held if step == last else None)
            if steps:
                self.advance(through=last)
        return steps

    def recover(self, reader: StepReader, holder: Holder | None = None, break_lease: bool = False) -> Recovery:
        """Runs every divided but uncommitted step (see :meth:`run_steps`) under the lease,
        taken as ``holder``; ``break_lease`` first breaks the lease of a holder that died."""
        broken = self.lease.break_() if break_lease else None
        position = status(self.root)
        with self.lease.held(holder):
            ran = self.run_steps(reader, position.committed_step, position.divided_step - 1)
        return Recovery(broken, ran, status(self.root).committed_step)

    def pending(self, first: int, last: int) -> range:
        """Opens the latest checkpoint and returns the steps of ``first..=last`` still to run.

        Committed steps are not run again (empty range when all are); a range that starts
        after the next uncommitted step is refused, naming that step: steps run in order.
        """
        self.open()
        next_step = self.state.get_step()
        if first > next_step:
            raise StepOrderError(
                f"cannot run step {first}: step {next_step} is not committed yet; run step {next_step} first "
                f"(or steps {next_step}..{last} together)"
            )
        return range(next_step, last + 1)

    def advance(self, through: int | None = None) -> int:
        """Runs every step from the opened checkpoint's through ``through`` (default: all whose
        input is persisted), then checkpoints.  Returns the next step to run.

        Fails, naming the step, when a step up to ``through`` has no input yet.
        """
        target = self.state.get_step()
        while (through is None or target <= through) and self.inputs.persisted(target):
            target += 1
        if through is not None and target <= through:
            raise StepOrderError(f"cannot run through step {through}: step {target} has no recorded input yet")
        worker = Worker(self)
        worker.start(self.state.opened_version, stop_at=target)
        return worker.stop(target)

    def layout(self) -> Layout:
        """The opened checkpoint's layout (a new pipeline's: ``workers`` balanced)."""
        return self.state.layout() or Layout.balanced(self.circuit.vnodes, self.workers)

    def prepare_rescale(self, workers: int, strategy: str | None = None, k: float | None = None) -> Rescale:
        """The first half of a hot layout change: rewrites, for the new layout, the state
        files holding vnodes that change owner, as of the latest checkpoint.  Commits
        nothing, so steps may go on meanwhile (it needs no lease)."""
        started = time.perf_counter()
        self.state.open(restore=False)
        before = self.layout()
        after = layouts.rescale(before, workers, strategy, k)
        copy = self.state.relayout(after, layouts.moved(before, after))
        return Rescale(before, after, copy, time.perf_counter() - started)

    def finish_rescale(self, plan: Rescale) -> RescaleReport:
        """The second half, at a step boundary: opens the latest checkpoint, rewrites what the
        steps since the copy added for moved vnodes, then switches the layout in one
        checkpoint.  The pause is this call.  A crash before the checkpoint leaves the old
        layout; after it, the new one: never a mix, since the checkpoint pins every table."""
        started = time.perf_counter()
        self.open()
        if self.layout() != plan.before:
            raise StaleWriterError("the layout changed since this rescale was prepared; prepare it again")
        moved = layouts.moved(plan.before, plan.after)
        # A table whose copied files a step has merged since is rewritten whole here.
        copy = plan.copy.without(self.state.merged_since(plan.copy))
        catch_up = self.state.relayout(plan.after, moved, since=copy.versions)
        self.state.apply_relayout(copy, catch_up)
        self.state.commit()
        failpoint("after_relayout", self.state.get_step())
        return RescaleReport(
            before=plan.before,
            after=plan.after,
            vnodes_moved=len(moved),
            rows_rewritten=plan.copy.rows + catch_up.rows,
            bytes_rewritten=plan.copy.bytes + catch_up.bytes,
            copy_seconds=plan.seconds,
            pause_seconds=time.perf_counter() - started,
        )

    def rescale(
        self,
        workers: int,
        strategy: str | None = None,
        k: float | None = None,
        *,
        hot: bool = False,
        holder: Holder | None = None,
    ) -> RescaleReport:
        """Changes the layout to ``workers`` (docs/design.md), under the lease taken as ``holder``.

        Cold: from the latest checkpoint, move the state of the vnodes that change owner,
        then checkpoint again with no input; the pause is all of it, under the lease.  Hot:
        copy that state first while steps go on (:meth:`prepare_rescale`), and take the
        lease only to catch up and switch (:meth:`finish_rescale`)."""
        prepared = self.prepare_rescale(workers, strategy, k) if hot else None
        with self.lease.held(holder):
            if prepared is not None:
                return self.finish_rescale(prepared)
            started = time.perf_counter()
            report = self.finish_rescale(self.prepare_rescale(workers, strategy, k))
        return dataclasses.replace(report, pause_seconds=time.perf_counter() - started, copy_seconds=0.0)

    def compact(self) -> dict[str, tuple[int, int]]:
        """Checkpoint, consolidate every trace, checkpoint again (at the same step)."""
        self.open()
        report = self.state.compact()
        if report:
            self.state.commit()
        return report

    def compact_logs(self, below: int) -> int:
        """Merges the crowded files of the pipeline's step-keyed logs (inputs, outputs, dead
        letters, checkpoints, divisions) that hold only steps before ``below`` (see
        :func:`storage.database.compact_log`).  Returns the files merged."""
        logs = [self.inputs.uri(h) for h in self.circuit.inputs] + [self.outputs.uri(h) for h in self.circuit.outputs]
        keyed = [(uri, STEP) for uri in [*logs, self.inputs.dead_letters_uri]]
        keyed += [(self.state.checkpoints_uri, "step"), (self.divisions.uri, "step")]
        return sum(compact_log(uri, column, below) for uri, column in keyed)

    def vacuum(self) -> list[str]:
        """Deletes data files no openable checkpoint needs (and files no commit ever took,
        such as the output of a discarded replay).  Returns the deleted paths.

        Keeps, for every state table, the files of each version that an openable
        checkpoint pins, so recovery from the earliest retained checkpoint still works;
        for the logs, the files of their latest version; for each current view, the versions
        those checkpoints pin and its latest (so ``dbsp show --step`` reads the steps of
        the retained checkpoints and the latest step).  Run it when no run is active.

        First prunes the sinks' idempotency tokens of checkpointed steps (see
        :meth:`storage.sinks.TokenStore.prune`), so their files go too.
        """
        self.sinks.tokens.prune(latest_checkpoint(self.root)[1])
        state = os.path.join(self.root, "state")
        keep = {os.path.join(state, name): v for name, v in self.state.retained_table_versions().items()}
        keep |= retained_view_versions(self.root)
        deleted = []
        for uri in delta_tables(self.root):
            table = open_table(uri)
            versions = sorted(keep.get(uri, set()) | {table.version()})
            deleted += table.vacuum(
                retention_hours=0, dry_run=False, enforce_retention_duration=False, full=True, keep_versions=versions
            )
        return deleted

    def read_outputs(self, handle: str, first: int, last: int) -> DataFrame:
        """Output changes of steps ``first..=last``, each with its step (``_step``) and the input
        offset ranges that produced it (``_input``: source, partition, start, end)."""
        offsets = self.spark.createDataFrame(
            [
                (step, [(r.source, r.partition, r.start, r.end) for r in ranges])
                for step, ranges in self.divisions.steps(first, last).items()
            ],
            "_step bigint, _input array<struct<source: string, partition: bigint, start: bigint, end: bigint>>",
        )
        return self.outputs.read(handle, first, last).join(offsets, "_step", "left")


RUN, PAUSE, PAUSED, STOP, STOPPED = "run", "pause", "paused", "stop", "stopped"
LOST_EXECUTOR_RUNS = 3
"""Runs of a step that may each fail by losing rows with a Spark executor (a step's shared
frames are local checkpoints, which Spark cannot compute again) before the step fails."""
_log = logging.getLogger(__name__)


class Worker:
    """The worker of the distributed DBSP design (docs/design.md), with its
    coordinator/worker synchronization: the loop that runs a pipeline's steps.

    ``start(version)`` opens the database and runs steps from its step, in a thread, until
    told to stop; ``pause()`` cancels a blocked input read and parks the worker at a step
    boundary, returning that step; ``stop(step)`` lets it run up to ``step`` (no further),
    then it stores the step and commits.  With several workers, a coordinator pauses them
    all, stops them all at the largest paused step, and so stops every worker at the same
    step boundary."""

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
            lost = 0  # runs of this step that lost rows with an executor
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
                try:
                    with pipeline.timed("compute_and_write"):
                        pipeline.compute(step, runner, step_input)
                except Exception as e:
                    lost += 1
                    if not lost_with_an_executor(e) or lost == LOST_EXECUTOR_RUNS:
                        raise
                    _log.warning("step %d lost rows with a Spark executor; running it again (%s)", step, e)
                    continue  # its input read again from the log: the rows kept for it may be gone too
                lost = 0
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
                if compaction_due(first, step):
                    with pipeline.timed("log_compaction"):
                        pipeline.compact_logs(first)
            self.next_step = step
        except BaseException as e:
            self._error = e
        finally:
            with self._cond:
                self._state = (STOPPED, None)
                self._cond.notify_all()
