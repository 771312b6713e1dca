"""The text ``dbsp status`` prints and the status job logs: where a pipeline stands, and
its input records that could not be decoded."""

from circuits.vnodes import Layout
from sensors.status import Report
from storage import inspect
from storage.logs import dead_letters_uri
from storage.pipeline import status


def dead_letters_note(root: str) -> str:
    """How many input records of the pipeline at ``root`` could not be decoded, and where they are."""
    uri = dead_letters_uri(root)
    count = inspect.rows_of_steps(uri, 0, status(root).divided_step)
    where = f"; each with its topic, partition, offset and reason in the Delta table {uri}" if count else ""
    return f"dead letters (input records that could not be decoded): {count}{where}"


def status_text(r: Report) -> str:
    """``dbsp status``'s lines: where the pipeline stands (:func:`sensors.status.report`)."""
    s = r.status
    lines = [
        f"committed through step {s.committed_step - 1} (next step {s.committed_step}), checkpoint version {s.checkpoint_version}",
        f"divided steps: {s.divided_step} (waiting to run: {s.divided_step - s.committed_step})",
        f"layout: {Layout.from_json(s.meta['layout']).describe() if 'layout' in s.meta else 'none yet (no step has run)'}",
        f"lease: {'held by ' + s.lease_holder if s.lease_holder else 'free'}",
    ]
    if r.lag is None:
        lines.append(f"lag: unknown ({r.error})")
    for (topic, partition), (lag, end) in (r.lag or {}).items():
        lines.append(f"lag {topic}[{partition}]: {lag} records not yet in a step (end offset {end})")
    return "\n".join(lines)
