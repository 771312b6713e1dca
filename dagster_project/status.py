"""The text ``dbsp status`` prints and the status job logs: where a pipeline stands, and
its input records that could not be decoded."""

from collections.abc import Mapping
from dataclasses import dataclass

from circuits.vnodes import Layout
from sensors.delta_source import is_table, table_path
from sensors.status import Report
from sensors.upstream import is_view, view_name
from storage import inspect
from storage.logs import dead_letters_uri, input_uri
from storage.pipeline import status

REASONS = 3
"""How many of an input's dead letters a report shows the reasons of."""


@dataclass(frozen=True)
class DeadLetterRate:
    """An input's dead letters over some steps: their count, the records decoded beside
    them, and the first reasons."""

    handle: str
    topic: str
    dead: int
    decoded: int
    reasons: list[str]

    @property
    def share(self) -> float:
        return self.dead / (self.dead + self.decoded)

    def too_high(self, share: float) -> bool:
        """Whether every record was a dead letter, or more than ``share`` of them."""
        return self.decoded == 0 or self.share > share

    def text(self) -> str:
        return (
            f"input {self.handle!r} (topic {self.topic!r}): {self.dead} of {self.dead + self.decoded} records were "
            f"dead letters ({self.share:.0%}), the views computed without them; first reasons: "
            + "; ".join(self.reasons)
        )


def dead_letter_rates(root: str, sources: Mapping[str, str], first: int, last: int) -> list[DeadLetterRate]:
    """The inputs (``sources``: handle to topic) with dead letters in steps ``first..=last``."""
    letters = inspect.dead_letters_of_steps(dead_letters_uri(root), first, last, REASONS)
    return [
        DeadLetterRate(handle, topic, dead, inspect.rows_of_steps(input_uri(root, handle), first, last), reasons)
        for handle, topic in sources.items()
        for dead, reasons in [letters.get(topic, (0, []))]
        if dead
    ]


def dead_letters_note(root: str, sources: Mapping[str, str], share: float) -> list[str]:
    """How many input records of the pipeline at ``root`` could not be decoded, and where
    they are; then a line per input whose dead letters, over every step, are too many
    (see :meth:`DeadLetterRate.too_high`)."""
    uri = dead_letters_uri(root)
    last = status(root).divided_step
    count = inspect.rows_of_steps(uri, 0, last)
    where = f"; each with its topic, partition, offset and reason in the Delta table {uri}" if count else ""
    loud = [r for r in dead_letter_rates(root, sources, 0, last) if r.too_high(share)] if count else []
    return [f"dead letters (input records that could not be decoded): {count}{where}"] + [
        f"too many dead letters: {r.text()}" for r in loud
    ]


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
    for (source, partition), (lag, end) in (r.lag or {}).items():
        lines.append(_lag_line(source, partition, lag, end))
    return "\n".join(lines)


def _lag_line(source: str, partition: int, lag: int, end: int) -> str:
    if is_table(source):
        return f"lag {table_path(source)}: {lag} versions not yet in a step (latest version {end - 1})"
    if is_view(source):
        pipeline, sink = view_name(source)
        return f"lag view {sink} of {pipeline}: {lag} upstream steps not yet in a step (upstream committed {end})"
    return f"lag {source}[{partition}]: {lag} records not yet in a step (end offset {end})"
