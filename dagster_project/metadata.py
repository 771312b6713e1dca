"""What Dagster shows of a step and of its view (materialization metadata), and what the
sensor asks of the source gateway before a cut (its flush) and shows of its figures."""

from dagster import MetadataValue
from deltalake import DeltaTable

from gateway.control import flush_running
from gateway.errors import GatewayError
from storage import inspect, views
from storage.errors import ViewError
from storage.gateway_figures import figures_of_steps, unflushed_steps
from storage.pipeline import Pipeline

from .config import home

PREVIEW_ROWS = 10


def view_metadata(root: str, sink: str, step: int, table: DeltaTable | None) -> dict:
    """The view's row count and its first rows (a markdown table), as of committed step
    ``step`` (``table``: the view at that step's version, when the run has it open) or
    else the latest, read by delta-rs from the file statistics and the first file(s)."""
    try:
        if table is None:
            shown = views.read_view(root, sink, limit=PREVIEW_ROWS)
        else:
            shown = views.snapshot(sink, step, table, limit=PREVIEW_ROWS)
    except ViewError as e:  # the step's materialization stands; the view's problem is shown
        return {"view_error": MetadataValue.text(str(e))}
    return {
        "view_rows": MetadataValue.int(shown.rows),
        "view_preview": MetadataValue.md(views.markdown(shown)),
        "view_table": MetadataValue.path(views.view_uri(root, sink)),
    }


def step_figures(metadata: dict) -> tuple[int, dict[str, float]]:
    """What :func:`step_metadata` recorded of a step run, read back from a materialization's
    metadata values (not Dagster's wrappers): its input rows (every input's), and its
    seconds by phase."""
    rows = sum(v for k, v in metadata.items() if k.startswith("rows_in/"))
    return rows, {k.removeprefix("seconds/"): v for k, v in metadata.items() if k.startswith("seconds/")}


def step_metadata(pipeline: Pipeline, first: int, last: int, ran: range) -> dict:
    rows_state, bytes_state = pipeline.state.size()
    offsets = [
        f"| {step} | {r.source} | {r.partition} | {r.start} | {r.end} |"
        for step, ranges in pipeline.divisions.steps(first, last).items()
        for r in ranges
    ]
    metadata = {
        "steps": f"{first}..{last}",
        "steps_run": MetadataValue.int(len(ran)),
        "checkpoint_version": MetadataValue.int(pipeline.state.opened_version or 0),
        "state_rows": MetadataValue.int(rows_state),
        "state_bytes": MetadataValue.int(bytes_state),
        "input_offsets": MetadataValue.md(
            "| step | topic | partition | start | end |\n|---|---|---|---|---|\n" + "\n".join(offsets)
        ),
        "dead_letters": MetadataValue.int(inspect.rows_of_steps(pipeline.inputs.dead_letters_uri, first, last)),
    }
    for handle in pipeline.circuit.inputs:
        metadata[f"rows_in/{handle}"] = MetadataValue.int(
            inspect.rows_of_steps(pipeline.inputs.uri(handle), first, last)
        )
    for phase, seconds in pipeline.timings.items():
        metadata[f"seconds/{phase}"] = MetadataValue.float(round(seconds, 3))
    unflushed = unflushed_steps(pipeline.root, first, last)
    if unflushed:
        metadata["gateway/unflushed_cuts"] = MetadataValue.md(
            "cut without the gateway's flush (see docs/gateway.md)\n\n| step | why |\n|---|---|\n"
            + "\n".join(f"| {step} | {reason} |" for step, reason in unflushed.items())
        )
    return metadata | gateway_metadata(figures_of_steps(pipeline.root, first, last))


def flush_gateway(fed: bool) -> tuple[dict | None, str | None]:
    """The running gateway's figures after its flush, or why it could not flush (None when
    no gateway runs and ``fed``, whether the pipeline reads a gateway topic, is false).  A
    gateway that does not answer must not hold up the steps: the step is cut without it."""
    try:
        figures = flush_running(home("gateway"))
    except GatewayError as e:
        return None, str(e)
    if figures is None and fed:
        return None, (
            f"no gateway runs with its state in {home('gateway')}: start it (dbsp gateway) with the "
            "same DBSP_HOME as the sensor"
        )
    return figures, None


def gateway_metadata(sources: dict | None, shown: int = 20) -> dict:
    """What the source gateway read for these steps: totals, and the busiest sources."""
    if not sources:
        return {}
    total = {k: sum(f[k] for f in sources.values()) for k in ("bytes", "waits", "errors")}
    busiest = sorted(sources.items(), key=lambda item: (-item[1]["errors"], -item[1]["bytes"], item[0]))[:shown]
    table = "\n".join(
        f"| {name} | {f['status']} | {f['bytes']} | {f['waits']} | {f['errors']} |" for name, f in busiest
    )
    return {
        "gateway/sources": MetadataValue.int(len(sources)),
        "gateway/bytes": MetadataValue.int(total["bytes"]),
        "gateway/buffer_waits": MetadataValue.int(total["waits"]),
        "gateway/errors": MetadataValue.int(total["errors"]),
        "gateway/by_source": MetadataValue.md(
            f"{len(busiest)} of {len(sources)} sources (errors first, then bytes)\n\n"
            "| source | status | bytes | waits for a buffer | errors |\n|---|---|---|---|---|\n" + table
        ),
    }
