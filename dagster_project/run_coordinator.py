"""The run coordinator of the Dagster home ``dbsp`` writes: Dagster's queue, without its
wait when nothing is ahead.

Dagster's :class:`QueuedRunCoordinator` queues every run, and its daemon launches queued
runs once per dequeue interval: a step run waits up to that interval (a second, as ``dbsp``
configures it) even when nothing else runs.  :class:`StepRunCoordinator` launches a run at
once when its pipeline has no run queued or in progress and the instance is below the
queue's ``max_concurrent_runs``; any other run is queued as Dagster does, so a pipeline's
runs still start one at a time in request order, and the UI's Queued tab shows them.  A
backfill launched from an asset's page runs Dagster's own asset job, which carries none of
the pipeline's tags: the coordinator tags it with its pipeline, so that the queue's
one-run-per-pipeline limit holds for it too.  When a launch here races the daemon's dequeue of a
run of the same pipeline, the pipeline's lease keeps the two runs one after the other.
"""

from __future__ import annotations

from dagster import DagsterRunStatus, RunsFilter
from dagster._core.run_coordinator import QueuedRunCoordinator, SubmitRunContext
from dagster._core.storage.dagster_run import ACTIVE_RUN_STATUSES, IN_PROGRESS_RUN_STATUSES, DagsterRun

PIPELINE_TAG = "dbsp/pipeline"
AHEAD = [DagsterRunStatus.QUEUED, *IN_PROGRESS_RUN_STATUSES]


class StepRunCoordinator(QueuedRunCoordinator):
    """Dagster's queue (same configuration), launching at once what nothing is ahead of."""

    def submit_run(self, context: SubmitRunContext) -> DagsterRun:
        run = context.dagster_run
        if run.status != DagsterRunStatus.NOT_STARTED:
            return super().submit_run(context)
        pipeline = pipeline_of(run)
        if pipeline is None:  # not one pipeline's run: the queue's limits alone decide, in the daemon
            return super().submit_run(context)
        if PIPELINE_TAG not in run.tags:  # a backfill from the asset page: the queue's limit must see it
            self._instance.add_run_tags(run.run_id, {PIPELINE_TAG: pipeline})
        if not self._nothing_ahead(pipeline):
            return super().submit_run(context)
        self._instance.launch_run(run.run_id, context.workspace)
        launched = self._instance.get_run_by_id(run.run_id)
        assert launched is not None, f"run {run.run_id} vanished while it was launched"
        return launched

    def _nothing_ahead(self, pipeline: str) -> bool:
        count = self._instance.get_runs_count
        if count(RunsFilter(statuses=AHEAD, tags={PIPELINE_TAG: pipeline})) > 0:
            return False
        limit = self.get_run_queue_config().max_concurrent_runs  # -1: no limit
        return limit < 0 or count(RunsFilter(statuses=ACTIVE_RUN_STATUSES)) < limit


def pipeline_of(run: DagsterRun) -> str | None:
    """The pipeline a run advances: its tag, or (a run of the asset page's own job, which
    carries no job's tags) the one prefix of its assets' keys, ``<pipeline>/<view>``."""
    if PIPELINE_TAG in run.tags:
        return run.tags[PIPELINE_TAG]
    prefixes = {key.path[0] for key in run.asset_selection or ()}
    return prefixes.pop() if len(prefixes) == 1 else None
