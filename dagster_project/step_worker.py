"""The resident step worker, and the run launcher that hands it Dagster's runs.

A run launched the default way starts a new Python process, which imports Dagster,
PySpark and the engine, opens a Spark Connect session, builds the pipeline's circuit and
opens its Delta state before its step begins.  The **step worker** is one long-lived
process (``python -m dagster_project.step_worker``, started and restarted by ``dbsp dev``)
that keeps all of that between runs: it executes each run it is handed in a thread of its
own, as a normal Dagster run (events, metadata, asset checks, status, logs), so runs of
different pipelines may overlap while the pipeline's lease serializes the runs of one.

**Transport**: the worker listens on a local TCP port and records where, with its pid and
the process's start time, in ``$DAGSTER_HOME/step_worker.json``.  A request is one JSON
line and so is its answer: ``{"launch": run_id}`` starts a run, ``{"status": run_id}``
says whether its thread still runs.

**Launcher**: :class:`StepWorkerLauncher` (``run_launcher`` of the ``dagster.yaml`` that
``dbsp`` writes) sends each run to the worker and tags it with the worker that took it
(``dbsp/step_worker``: pid and start time); when no worker answers, or it refuses (its
definitions are out of date), it launches the run the default way (a new process from the
code server), and says so in the run's events.

**Health**: Dagster's run monitoring asks the launcher about every started run.  A run
whose worker process is gone (killed, out of memory) is reported failed with that cause,
so its pipeline's lease is free for the next run, which recovers the uncommitted steps as
after any crash (the pipeline's state is committed in Delta, not in the worker).  A run
launched in a new process is watched the same way, by the pid that process reported.  A
launch whose answer is lost stays the worker's unless the worker says it does not know
the run: two processes never run one step.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import sys
import threading
from dataclasses import asdict, dataclass
from typing import cast

from dagster import DagsterEventType, DagsterInstance, DefaultRunLauncher
from dagster._core.events import EngineEventData
from dagster._core.launcher import CheckRunHealthResult, LaunchRunContext, WorkerStatus
from dagster._core.origin import JobPythonOrigin
from dagster._core.storage.dagster_run import DagsterRun
from dagster._grpc.impl import core_execute_run
from dagster._utils.hosted_user_process import recon_job_from_origin

from circuits.errors import DbspError

WORKER_FILE = "step_worker.json"
WORKER_TAG = "dbsp/step_worker"
NEW_PROCESS = "new process"  # WORKER_TAG of a run the worker did not take
TIMEOUT = 10.0  # seconds for the worker to answer a request (it answers at once)
PRELOAD = "dagster_project.definitions"

log = logging.getLogger("dbsp.step_worker")


@dataclass(frozen=True)
class WorkerAddress:
    """Where a running worker listens, and which process it is: a pid reused by another
    process after the worker died has another start time."""

    pid: int
    started: int
    port: int

    @property
    def id(self) -> str:
        return f"{self.pid}:{self.started}"

    def alive(self) -> bool:
        return process_start(self.pid) == self.started


def process_start(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot), or None if no such process
    lives (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else int(fields[19])


def worker_file(dagster_home: str) -> str:
    return os.path.join(dagster_home, WORKER_FILE)


def read_address(dagster_home: str) -> WorkerAddress | None:
    """The worker recorded in ``dagster_home``, if it still lives."""
    try:
        with open(worker_file(dagster_home)) as f:
            address = WorkerAddress(**json.load(f))
    except (OSError, ValueError, TypeError):
        return None
    return address if address.alive() else None


def request(address: WorkerAddress, message: dict) -> dict:
    """Sends one request to the worker at ``address`` and returns its answer (OSError when
    it does not answer within :data:`TIMEOUT`)."""
    with socket.create_connection(("127.0.0.1", address.port), timeout=TIMEOUT) as conn:
        conn.sendall(json.dumps(message).encode() + b"\n")
        answer = conn.makefile("rb").readline()
    if not answer:
        raise ConnectionError(f"the step worker (pid {address.pid}) closed the connection without answering")
    return json.loads(answer)


class StepWorkerLauncher(DefaultRunLauncher):
    """Hands every run to the resident step worker of the instance's home (see the module's
    docstring); without a live worker, launches it as :class:`DefaultRunLauncher` does."""

    def launch_run(self, context: LaunchRunContext) -> None:
        run = context.dagster_run
        reason = self._hand_to_worker(run)
        if reason is None:
            return
        self._instance.add_run_tags(run.run_id, {WORKER_TAG: NEW_PROCESS})
        self._instance.report_engine_event(f"Launching the run in a new process: {reason}.", run, cls=type(self))
        super().launch_run(context)

    def _hand_to_worker(self, run: DagsterRun) -> str | None:
        """Hands ``run`` to the live worker: None once the worker has it, else why not."""
        address = read_address(self._instance.root_directory)
        if address is None:
            return f"no step worker runs for {self._instance.root_directory} (`dbsp dev` starts one)"
        # Tagged before it is sent, so the run is watched as the worker's even if the answer is lost.
        self._instance.add_run_tags(run.run_id, {WORKER_TAG: address.id})
        try:
            return request(address, {"launch": run.run_id}).get("refused")
        except (OSError, ValueError) as e:
            lost = f"the step worker (pid {address.pid}) did not answer: {e}"
        # The launch may have reached the worker: a second process would run the step again.
        try:
            known = request(address, {"status": run.run_id})["status"] != "unknown"
        except (OSError, ValueError):
            log.warning("run %s: %s, nor when asked again; it stays the worker's", run.run_id, lost)
            return None  # watched: the worker's death, or Dagster's start timeout, fails it
        return None if known else lost

    def terminate(self, run_id: str) -> bool:
        run = self._instance.get_run_by_id(run_id)
        if run is None or run.tags.get(WORKER_TAG, NEW_PROCESS) == NEW_PROCESS:
            return super().terminate(run_id)
        self._instance.report_engine_event(
            "A run in the resident step worker ends with its step: it cannot be terminated before "
            "(the UI's force termination marks it canceled at once).",
            run,
            cls=type(self),
        )
        return False

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run: DagsterRun) -> CheckRunHealthResult:
        tag = run.tags.get(WORKER_TAG, NEW_PROCESS)
        if tag == NEW_PROCESS:
            return self._check_run_process(run)
        pid, started = (int(part) for part in tag.split(":"))
        if process_start(pid) != started:
            reason = gone(f"the step worker running it (pid {pid})") + "; `dbsp dev` starts a new worker"
            return CheckRunHealthResult(WorkerStatus.FAILED, reason)
        address = read_address(self._instance.root_directory)
        try:
            if address is None or address.id != tag:
                raise ConnectionError(f"the step worker (pid {pid}) lives but is not the one recorded")
            answer = request(address, {"status": run.run_id})
        except (OSError, ValueError) as e:
            return CheckRunHealthResult(WorkerStatus.RUNNING, f"the step worker lives but did not answer: {e}")
        if answer["status"] == "unknown":
            return CheckRunHealthResult(WorkerStatus.FAILED, f"the step worker (pid {pid}) is not running this run")
        return CheckRunHealthResult(WorkerStatus.RUNNING if answer["status"] == "running" else WorkerStatus.SUCCESS)

    def _check_run_process(self, run: DagsterRun) -> CheckRunHealthResult:
        """A run launched in a process of its own: that process, by the pid it reported when it
        started (Dagster's default launcher watches none, so a killed run would stay STARTED)."""
        pids = [
            int(entry.dagster_event.engine_event_data.metadata["pid"].value)
            for entry in self._instance.all_logs(run.run_id, of_type=DagsterEventType.ENGINE_EVENT)
            if entry.dagster_event and "pid" in entry.dagster_event.engine_event_data.metadata
        ]
        if not pids or process_start(pids[-1]) is not None:
            return CheckRunHealthResult(WorkerStatus.RUNNING)
        return CheckRunHealthResult(WorkerStatus.FAILED, gone(f"the process running it (pid {pids[-1]})"))


def gone(what: str) -> str:
    """Why a run failed whose process died."""
    return (
        f"{what} is gone: it was killed or ran out of memory; "
        "the pipeline's next run runs the steps this one did not commit"
    )


def _mtime(path: str) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


def definition_files() -> dict[str, int | None]:
    """The files the code location's definitions are built from (the configuration and the
    pipelines' SQL files), with their modification times."""
    from .config import config_file, load_project

    paths = [config_file()[0]]
    with contextlib.suppress(DbspError):  # a broken configuration: watch the file alone
        paths += [spec.sql for spec in load_project(circuits=False).pipelines]
    return {path: _mtime(path) for path in paths if path}


class StepWorker:
    """The worker's side: executes each run it is handed in a thread of its own.  The
    definitions are loaded once; once a file they are built from (``watched``, see
    :func:`definition_files`) changes, the worker refuses new runs (the launcher starts
    them in new processes) and ends when its runs have, for ``dbsp dev`` to start a new one."""

    def __init__(self, instance: DagsterInstance, watched: dict[str, int | None]) -> None:
        self.instance = instance
        self.watched = watched
        self.retiring: str | None = None
        self._runs: dict[str, threading.Thread] = {}
        self._lock = threading.Lock()

    def _changed(self) -> str | None:
        changed = [path for path, mtime in self.watched.items() if _mtime(path) != mtime]
        return f"{changed[0]} changed since the step worker loaded the definitions" if changed else None

    def busy(self) -> bool:
        with self._lock:
            return any(thread.is_alive() for thread in self._runs.values())

    def answer(self, message: dict) -> dict:
        if "launch" in message:
            self.retiring = self.retiring or self._changed()
            if self.retiring:
                return {"refused": f"the step worker is restarting: {self.retiring}"}
            run_id = message["launch"]
            thread = threading.Thread(target=self.execute, args=(run_id,), name=f"run-{run_id[:8]}", daemon=True)
            with self._lock:
                self._runs = {r: t for r, t in self._runs.items() if t.is_alive()}
                self._runs[run_id] = thread
            thread.start()
            return {"launched": run_id}
        if "status" in message:
            with self._lock:
                thread = self._runs.get(message["status"])
            return {"status": "unknown" if thread is None else "running" if thread.is_alive() else "done"}
        return {"error": f"unknown request {sorted(message)}"}

    def execute(self, run_id: str) -> None:
        """Executes run ``run_id`` as Dagster's run worker process does (``dagster api
        execute_run``), in this thread: failures are in the run's events."""
        instance = self.instance
        run = instance.get_run_by_id(run_id)
        if run is None or run.job_code_origin is None:
            log.error("run %s: not found, or it has no code origin", run_id)
            return
        instance.report_engine_event(
            f"Started in the resident step worker (pid: {os.getpid()}).", run, EngineEventData.in_process(os.getpid())
        )
        try:
            recon_job = recon_job_from_origin(cast(JobPythonOrigin, run.job_code_origin))
            for _event in core_execute_run(recon_job, run, instance, inject_env_vars=True):
                pass
        except Exception as e:
            # core_execute_run reports its own failures before it raises; this covers the rest.
            run = instance.get_run_by_id(run_id)
            if run is not None and not run.is_finished:
                instance.report_run_failed(run, f"the step worker could not execute the run: {e!r}")

    def serve(self, server: socket.socket) -> None:
        """Answers requests on ``server`` until the worker retires and its runs have ended."""
        server.settimeout(1.0)
        while not (self.retiring and not self.busy()):
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(TIMEOUT)
                try:
                    line = conn.makefile("rb").readline()
                    conn.sendall(json.dumps(self.answer(json.loads(line))).encode() + b"\n")
                except (OSError, ValueError) as e:
                    log.warning("step worker: a request failed: %s", e)


def listen(dagster_home: str) -> socket.socket:
    """A socket on a free local port, recorded in ``dagster_home`` (atomically, so the
    launcher never reads half a record)."""
    server = socket.create_server(("127.0.0.1", 0))
    address = WorkerAddress(os.getpid(), process_start(os.getpid()), server.getsockname()[1])
    path = worker_file(dagster_home)
    with open(f"{path}.{os.getpid()}", "w") as f:
        json.dump(asdict(address), f)
    os.replace(f"{path}.{os.getpid()}", path)
    return server


def _end_now(signum: int, _frame) -> None:
    """Ends the worker at once on Ctrl-C or SIGTERM: its runs end as if it were killed (the
    next run of each pipeline recovers), and ``dbsp dev`` stops within its deadline rather
    than wait for an interpreter with Spark and Dagster loaded to wind down."""
    os._exit(128 + signum)


def main() -> int:
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _end_now)
    # Read by Arrow's allocator (mimalloc) when pyarrow loads, below.  It asks the kernel for
    # transparent huge pages on its arena, which the kernel's khugepaged then fills in, 2 MiB
    # around each page in use: in this long-lived process, resident memory that grew for
    # hundreds of runs (bench/RESULTS.md).  A value the user set is kept.
    os.environ.setdefault("MIMALLOC_ALLOW_THP", "0")
    from .factory import keep_pipelines_open  # the worker's own imports: Spark and the engine

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    keep_pipelines_open()
    with DagsterInstance.get() as instance:
        server = listen(instance.root_directory)
        # Loaded now, the first run finds the definitions imported (a failure is the run's to report).
        try:
            __import__(PRELOAD)
        except Exception as e:
            log.warning("step worker: could not preload %s: %s", PRELOAD, e)
        worker = StepWorker(instance, definition_files())
        log.info("step worker (pid %d) serving %s", os.getpid(), instance.root_directory)
        worker.serve(server)
        log.info("step worker (pid %d) ends: %s", os.getpid(), worker.retiring)
    return 0


if __name__ == "__main__":
    sys.exit(main())
