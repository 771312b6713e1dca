"""The resident step worker under ``dbsp dev``: step runs launched through the webserver
execute in its one long-lived process; a step committed by another process in between is
seen; the worker killed mid-step fails its run with that cause, ``dbsp dev`` starts a new
one, and the next run recovers the step, nothing lost or duplicated."""

import inspect
import json
import os
import re
import subprocess
import sys

import pytest
from dagster import DagsterEventType, DagsterInstance
from dagster._cli import api
from dagster._core.events import EngineEventData
from dagster._core.instance.ref import InstanceRef
from dagster._core.launcher import WorkerStatus
from dagster._core.test_utils import create_run_for_test
from dagster._grpc.impl import core_execute_run

from dagster_project.cli import dagster_yaml
from dagster_project.step_worker import (
    NEW_PROCESS,
    WORKER_FILE,
    WORKER_TAG,
    StepWorker,
    StepWorkerLauncher,
    process_start,
)
from storage.lease import Holder
from storage.pipeline import status

from .harness import Harness, dagster_dev, integral, launch_step, wait_for

NAME = "resident"
CRASH_STEP = 4


def worker_pid(home) -> int | None:
    """The live worker recorded in the Dagster home ``home``."""
    try:
        with open(os.path.join(home, WORKER_FILE)) as f:
            recorded = json.load(f)
    except (OSError, ValueError):
        return None
    return recorded["pid"] if process_start(recorded["pid"]) == recorded["started"] else None


def huge_pages_on_request() -> bool:
    """Whether the kernel gives transparent huge pages only to memory that asks for them."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return "[madvise]" in f.read()
    except OSError:
        return False


def huge_pages_kib(pid: int) -> int:
    """The process's anonymous memory in transparent huge pages, in KiB."""
    with open(f"/proc/{pid}/smaps_rollup") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("AnonHugePages:"))


def executed_by(instance: DagsterInstance, run_id: str) -> int:
    """The pid of the process that executed the run, from its engine event."""
    for entry in instance.all_logs(run_id, of_type=DagsterEventType.ENGINE_EVENT):
        found = re.search(r"Started in the resident step worker \(pid: (\d+)\)", entry.message or "")
        if found:
            return int(found.group(1))
    raise AssertionError(f"run {run_id} did not execute in the step worker")


@pytest.mark.slow
def test_steps_run_in_the_resident_worker_which_recovers_from_its_death(spark, spark_resource, broker, tmp_path):
    env = {"DBSP_FAULT": f"after_input:{CRASH_STEP}"}  # the worker kills itself (SIGKILL) mid-step
    with dagster_dev(tmp_path, broker.bootstrap, NAME, spark_resource, env=env) as (port, home):
        instance = DagsterInstance.from_ref(InstanceRef.from_dir(str(home)))
        served = Harness(tmp_path, broker.bootstrap, instance, name=NAME)
        pid = wait_for(lambda: worker_pid(home), 120, "the step worker to start")

        def produce_step() -> int:
            served.produce(200, deletes=10)
            (request,) = served.tick().run_requests
            return int(request.partition_key)

        # Two runs, one worker process: it outlives each run.
        for _ in range(2):
            run_id, final = launch_step(port, NAME, produce_step())
            assert final == "SUCCESS"
            assert executed_by(instance, run_id) == pid
            assert instance.get_run_by_id(run_id).tags[WORKER_TAG].startswith(f"{pid}:")
        if huge_pages_on_request():
            # Arrow's allocator asks for them unless told not to; filled in by the kernel, they
            # grew the worker's memory for hundreds of runs.
            assert huge_pages_kib(pid) == 0

        # Another process commits step 2 under the lease: the worker's next run must see it.
        step = produce_step()
        engine = served.pipeline(spark)
        with engine.lease.held(Holder("test")):
            assert list(engine.run_steps(served.source.read, step, step)) == [step]
        run_id, final = launch_step(port, NAME, produce_step())
        assert final == "SUCCESS" and executed_by(instance, run_id) == pid
        assert status(served.root).committed_step == CRASH_STEP
        assert integral(served.pipeline(spark).outputs.read("bids_by_category", 0, 10**9)) == served.expected_revenue()

        # The worker dies mid-step: the run fails, naming the cause; dbsp dev starts another worker.
        step = produce_step()
        assert step == CRASH_STEP
        run_id, final = launch_step(port, NAME, step)
        assert final == "FAILURE"
        (failure,) = instance.all_logs(run_id, of_type=DagsterEventType.RUN_FAILURE)
        assert f"the step worker running it (pid {pid}) is gone" in failure.message
        assert status(served.root).committed_step == CRASH_STEP
        new_pid = wait_for(lambda: (p := worker_pid(home)) != pid and p, 120, "a new step worker")

        # The next run recovers the step: the view equals recomputation, nothing lost or doubled.
        run_id, final = launch_step(port, NAME, step)
        assert final == "SUCCESS" and executed_by(instance, run_id) == new_pid
        assert status(served.root).committed_step == CRASH_STEP + 1
        assert integral(served.pipeline(spark).outputs.read("bids_by_category", 0, 10**9)) == served.expected_revenue()


def test_the_worker_executes_a_run_the_way_dagsters_own_run_worker_does():
    """The worker calls Dagster's private run-execution functions (imported by
    :mod:`dagster_project.step_worker`, so a move fails this module's import): the body of
    ``dagster api execute_run`` must still reconstruct the job from the run's origin and
    execute it with ``core_execute_run``, whose parameters the worker passes by name."""
    body = inspect.getsource(api._execute_run_command_body)
    assert "recon_job_from_origin(" in body and "core_execute_run(" in body
    parameters = inspect.signature(core_execute_run).parameters
    assert list(parameters)[:4] == ["recon_job", "dagster_run", "instance", "inject_env_vars"]


def test_a_worker_whose_definitions_changed_refuses_runs_and_ends_when_its_runs_have(tmp_path):
    config = tmp_path / "dbsp.yaml"
    config.write_text("pipelines: []\n")
    worker = StepWorker(None, {str(config): os.stat(config).st_mtime_ns})
    assert worker._changed() is None
    os.utime(config, ns=(0, 0))  # edited since the worker loaded the definitions
    refused = worker.answer({"launch": "a-run"})
    assert refused == {
        "refused": f"the step worker is restarting: {config} changed since the step worker loaded the definitions"
    }
    assert worker.retiring and not worker.busy()  # so serve() returns and the process ends


def test_a_run_in_a_process_of_its_own_fails_when_that_process_is_gone(tmp_path):
    """A run the worker did not take runs in a new process, which Dagster's default launcher
    does not watch: killed, its run would stay STARTED for ever."""
    (tmp_path / "dagster.yaml").write_text(dagster_yaml(str(tmp_path)))
    with DagsterInstance.from_ref(InstanceRef.from_dir(str(tmp_path))) as instance:
        run = create_run_for_test(instance, tags={WORKER_TAG: NEW_PROCESS})
        launcher = instance.run_launcher
        assert isinstance(launcher, StepWorkerLauncher)
        assert launcher.check_run_worker_health(run).status == WorkerStatus.RUNNING  # not started yet
        process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        instance.report_engine_event("Started process for run.", run, EngineEventData.in_process(process.pid))
        assert launcher.check_run_worker_health(run).status == WorkerStatus.RUNNING
        process.kill()
        process.wait()
        health = launcher.check_run_worker_health(run)
        assert health.status == WorkerStatus.FAILED
        assert f"the process running it (pid {process.pid}) is gone" in health.msg
