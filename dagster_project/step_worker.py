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
``dbsp`` writes) tags each run with the worker that takes it (``dbsp/step_worker``:
pid and start time) and sends it there; when no worker answers it launches the run the
default way (a new process from the code server), and says so in the run's events.

**Health**: Dagster's run monitoring asks the launcher about every started run.  A run
whose worker process is gone (killed, out of memory) is reported failed with that cause,
so its pipeline's lease is free for the next run, which recovers the uncommitted steps as
after any crash (the pipeline's state is committed in Delta, not in the worker).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import sys
import threading
from dataclasses import asdict, dataclass
from typing import cast

from dagster import DagsterInstance, DefaultRunLauncher
from dagster._core.events import EngineEventData
from dagster._core.launcher import CheckRunHealthResult, LaunchRunContext, WorkerStatus
from dagster._core.origin import JobPythonOrigin
from dagster._core.storage.dagster_run import DagsterRun
from dagster._grpc.impl import core_execute_run
from dagster._utils.hosted_user_process import recon_job_from_origin

WORKER_FILE = "step_worker.json"
WORKER_TAG = "dbsp/step_worker"
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
        address = read_address(self._instance.root_directory)
        if address is not None:
            self._instance.add_run_tags(run.run_id, {WORKER_TAG: address.id})
            try:
                request(address, {"launch": run.run_id})
                return
            except OSError as e:
                reason = f"the step worker (pid {address.pid}) did not take it: {e}"
        else:
            reason = f"no step worker runs for {self._instance.root_directory} (`dbsp dev` starts one)"
        self._instance.report_engine_event(f"Launching the run in a new process: {reason}.", run, cls=type(self))
        super().launch_run(context)

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run: DagsterRun) -> CheckRunHealthResult:
        tag = run.tags.get(WORKER_TAG)
        if tag is None:  # launched in a process of its own: nothing to watch, as with the default launcher
            return CheckRunHealthResult(WorkerStatus.RUNNING)
        pid, started = (int(part) for part in tag.split(":"))
        if process_start(pid) != started:
            return CheckRunHealthResult(
                WorkerStatus.FAILED,
                f"the step worker running it (pid {pid}) is gone: it was killed or ran out of memory. "
                "Its steps were not committed; `dbsp dev` starts a new worker, and the pipeline's next run "
                "runs them again",
            )
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


class StepWorker:
    """The worker's side: executes each run it is handed in a thread of its own."""

    def __init__(self, instance: DagsterInstance) -> None:
        self.instance = instance
        self._runs: dict[str, threading.Thread] = {}
        self._lock = threading.Lock()

    def answer(self, message: dict) -> dict:
        if "launch" in message:
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
        recon_job = recon_job_from_origin(cast(JobPythonOrigin, run.job_code_origin))
        instance.report_engine_event(
            f"Started in the resident step worker (pid: {os.getpid()}).", run, EngineEventData.in_process(os.getpid())
        )
        # core_execute_run writes a failure to the run's events before it raises.
        with contextlib.suppress(Exception):
            for _event in core_execute_run(recon_job, run, instance, inject_env_vars=True):
                pass

    def serve(self, server: socket.socket) -> None:
        """Answers requests on ``server`` until the process ends."""
        while True:
            conn, _ = server.accept()
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


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    with DagsterInstance.get() as instance:
        server = listen(instance.root_directory)
        # Loaded now, the first run finds the definitions imported (a failure is the run's to report).
        try:
            __import__(PRELOAD)
        except Exception as e:
            log.warning("step worker: could not preload %s: %s", PRELOAD, e)
        log.info("step worker (pid %d) serving %s", os.getpid(), instance.root_directory)
        with contextlib.suppress(KeyboardInterrupt):
            StepWorker(instance).serve(server)
    return 0


if __name__ == "__main__":
    sys.exit(main())
