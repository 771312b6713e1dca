"""The source gateway's cursors (docs/gateway.md): where each re-readable source resumes after a restart.

One small Delta table, overwritten whole at each commit (a few thousand rows): a row per
source with the end of its bytes the broker acknowledged (``position``), and a row per
topic partition with the Kafka offset from which a restarted gateway reads back what was
acknowledged after this commit (``source`` null).  The gateway commits only positions
whose bytes, and all before them, the broker acknowledged; so a source never resumes
past a byte the broker lacks, and the read-back finds the bytes acknowledged since.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pyarrow as pa
from deltalake import write_deltalake
from deltalake.exceptions import CommitFailedError

from .errors import StorageError
from .tables import dataset, ensure_table, open_table

CURSOR_SCHEMA = pa.schema(
    [("source", pa.string()), ("topic", pa.string()), ("partition", pa.int32()), ("position", pa.int64())]
)
VACUUM_EVERY = 100
"""Commits between two vacuums of the cursor table."""


@dataclass(frozen=True)
class Cursors:
    """A committed set of cursors: byte positions per ``(topic, source)`` and read-back
    starts per ``(topic, partition)``."""

    positions: dict[tuple[str, str], int]
    read_back: dict[tuple[str, int], int]


class CursorStore:
    """The cursors of one gateway, in the Delta table at ``uri``."""

    def __init__(self, uri: str) -> None:
        self.uri = uri

    def load(self) -> Cursors:
        """The last committed cursors (empty when none were committed)."""
        table = open_table(self.uri)
        rows = [] if table is None else dataset(table).to_table().to_pylist()
        return Cursors(
            positions={(r["topic"], r["source"]): r["position"] for r in rows if r["source"] is not None},
            read_back={(r["topic"], r["partition"]): r["position"] for r in rows if r["source"] is None},
        )

    @classmethod
    def of_gateway(cls, setting: str, home: str) -> CursorStore:
        """The store of a gateway: at its ``gateway.cursors`` setting, else ``<home>/cursors``."""
        return cls(setting or os.path.join(home, "cursors"))

    def commit(self, positions: dict[tuple[str, str], int], read_back: dict[tuple[str, int], int]) -> int:
        """Replaces the committed cursors with ``positions`` and ``read_back`` (as in
        :class:`Cursors`); returns the table's new version."""
        rows = [{"source": s, "topic": t, "partition": None, "position": p} for (t, s), p in positions.items()]
        rows += [{"source": None, "topic": t, "partition": q, "position": o} for (t, q), o in read_back.items()]
        try:
            table = ensure_table(self.uri, CURSOR_SCHEMA)
            write_deltalake(table, pa.Table.from_pylist(rows, schema=CURSOR_SCHEMA), mode="overwrite")
            if table.version() % VACUUM_EVERY == 0:
                # A commit a second while bytes are acknowledged: the files of overwritten versions go once an hour old.
                table.vacuum(retention_hours=1, enforce_retention_duration=False, dry_run=False)
            return table.version()
        except (CommitFailedError, OSError) as e:
            raise StorageError(f"committing {len(positions)} gateway cursors to {self.uri} failed: {e}") from e
