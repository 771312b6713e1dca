"""Spark's answers to the SQL compiler's questions, kept in a file.

Compiling a file of views asks Spark for the schema of each view's query and the types of
the expressions it projects: for the demo's four views, 30 round trips to the server.
Under ``dagster dev`` every run is a new process that compiles its pipeline's views
again, so a run paid them all before its step started.  The answers depend only on the
question (the SQL text and the schemas it reads) and on the Spark that gave them (its
version and the settings that change types, see :func:`answering`);
a file of them, keyed so, lets a later process compile the same views asking Spark
nothing.  A question not in the file (changed SQL or schemas, another Spark version) is
asked of Spark and added; one that Spark refuses is never kept, so an error is reported
by Spark each time.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import types as T

TYPING_SETTINGS = (
    "spark.sql.ansi.enabled",
    "spark.sql.decimalOperations.allowPrecisionLoss",
    "spark.sql.timestampType",
)
"""Session settings that change the types Spark gives an expression (ANSI mode types
``'1' + 1`` as bigint, not double): answers are kept per their values."""


def answering(spark: SparkSession) -> str:
    """What Spark's answers in ``spark`` depend on besides the question: its version and
    :data:`TYPING_SETTINGS` (a round trip each, against the compile's 30)."""
    return json.dumps([spark.version, *(spark.conf.get(k, None) for k in TYPING_SETTINGS)])


class Analyses:
    """Answers read from ``path`` (none kept when ``path`` is None), each under the Spark
    that gave it: those of the Spark ``version`` names (see :func:`answering`) are used.  A
    missing or unreadable file holds none: its questions go to Spark again."""

    def __init__(self, path: str | None = None, version: str = "") -> None:
        self.path = path
        self.version = version
        self.answers = self._read()
        self.asked = 0
        """Questions that went to Spark."""

    def _read(self) -> dict[str, str]:
        if self.path is None:
            return {}
        try:
            kept = json.loads(Path(self.path).read_text())
        except (OSError, ValueError):
            return {}
        return kept.get("answers", {}) if isinstance(kept, dict) else {}

    def answer(self, question: tuple, ask: Callable[[], T.StructType]) -> T.StructType:
        """The schema answering ``question`` (JSON-serializable), from the kept answers or
        else from ``ask`` (which asks Spark)."""
        key = json.dumps([self.version, question])
        if key not in self.answers:
            self.answers[key] = ask().json()
            self.asked += 1
        return T.StructType.fromJson(json.loads(self.answers[key]))

    def save(self) -> None:
        """Writes the answers when Spark gave new ones; the file is replaced whole, so a
        reader sees the old answers or the new ones, never a part."""
        if self.path is None or not self.asked:
            return
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        partial = f"{self.path}.{os.getpid()}.tmp"
        Path(partial).write_text(json.dumps({"answers": self.answers}, sort_keys=True))
        os.replace(partial, self.path)
