"""The lease on a pipeline (KLogs, docs/klogs.md): at most one run advances a pipeline at a time.

The lease is a small Delta table.  Every acquisition and release is one commit made on
top of the version its writer read, tagged with the app transaction ``lease``; when two
runs race, delta-rs refuses the second commit as a concurrent transaction, so exactly
one wins.  The acquiring commit's version is the fencing token.  (The checkpoint commit
is fenced on its own, by the checkpoint version the run opened: a writer whose lease
expired still cannot commit over a newer checkpoint.)
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import pyarrow as pa
from deltalake import CommitProperties, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError

from .errors import LeaseHeldError, StorageError
from .tables import dataset, ensure_table, open_table

_SCHEMA = pa.schema(
    [
        ("token", pa.int64()),
        ("holder", pa.string()),
        ("since", pa.float64()),
        ("expires", pa.float64()),
        ("released", pa.bool_()),
    ]
)


@dataclass(frozen=True)
class LeaseRecord:
    token: int
    holder: str
    since: float
    expires: float
    released: bool

    def held_at(self, now: float) -> bool:
        return not self.released and self.expires >= now

    def free_for(self, holder: str, now: float, holder_gone: Callable[[str], bool]) -> bool:
        return not self.held_at(now) or self.holder == holder or holder_gone(self.holder)


@dataclass(frozen=True)
class Holder:
    """Who takes a pipeline's lease: its name (a Dagster run's id, a command and its pid),
    how many seconds it waits for another holder to finish, and how it tells sooner that
    the holder it waits for is gone (for example: the Dagster run holding it has ended)."""

    name: str = field(default_factory=lambda: f"pid {os.getpid()}")
    wait: float = 0.0
    gone: Callable[[str], bool] = lambda _: False


class Lease:
    """A pipeline's lease.  ``ttl`` bounds how long a holder that vanished without
    releasing (a killed process) blocks others; ``holder_gone`` lets the caller tell
    sooner (for example: the Dagster run holding it has ended)."""

    def __init__(self, root: str, ttl: float = 3600.0) -> None:
        self.uri = os.path.join(root, "_lease")
        self.ttl = ttl
        self.token: int | None = None
        """The token this object last acquired the lease with (the epoch its sinks act in)."""

    def current(self) -> LeaseRecord | None:
        table = open_table(self.uri)
        return None if table is None else _latest(table)

    def acquire(
        self, holder: str, wait: float = 0.0, poll: float = 0.5, holder_gone: Callable[[str], bool] = lambda _: False
    ) -> int:
        """Takes the lease for ``holder`` (waiting up to ``wait`` seconds) and returns its token."""
        deadline = time.monotonic() + wait
        while True:
            table = ensure_table(self.uri, _SCHEMA)
            record, now = _latest(table), time.time()
            if record is None or record.free_for(holder, now, holder_gone):
                token = table.version() + 1
                if _write(table, LeaseRecord(token, holder, now, now + self.ttl, False)):
                    self.token = token
                    return token
            elif time.monotonic() >= deadline:
                raise LeaseHeldError(
                    f"the pipeline at {os.path.dirname(self.uri)} is being advanced by {record.holder} "
                    f"(since {time.ctime(record.since)}, lease expires {time.ctime(record.expires)}); wait for that run "
                    "to finish, or, if it is gone, break the lease with `dbsp recover --break-lease`"
                )
            time.sleep(poll)

    def release(self, token: int) -> None:
        """Releases the lease if ``token`` still holds it (a no-op otherwise)."""
        table = ensure_table(self.uri, _SCHEMA)
        record = _latest(table)
        if record is not None and record.token == token and not record.released:
            _write(table, LeaseRecord(token, record.holder, record.since, record.expires, True))

    def break_(self) -> LeaseRecord | None:
        """Releases whoever holds the lease; returns the record that was broken (None if free)."""
        record = self.current()
        if record is None or record.released:
            return None
        self.release(record.token)
        return record

    @contextmanager
    def held(self, holder: Holder | None = None) -> Iterator[int]:
        """Holds the lease for the block, taken as ``holder`` (default: this process, not
        waiting); yields the token."""
        holder = holder or Holder()
        token = self.acquire(holder.name, wait=holder.wait, holder_gone=holder.gone)
        try:
            yield token
        finally:
            self.release(token)


def _latest(table) -> LeaseRecord | None:
    # One file since each write replaces the table's rows (a table whose writes appended
    # them holds them all: the record with the highest token is the lease's).
    rows = dataset(table).to_table().to_pylist()
    if not rows:
        return None
    return LeaseRecord(**max(rows, key=lambda r: (r["token"], r["released"])))


def _write(table, record: LeaseRecord) -> bool:
    """Commits ``record`` on top of the version ``table`` was read at, as the table's only
    row; False if another writer won.  Replaced, not appended: the latest version then has
    one file to read however many runs a pipeline has had (the versions keep the history)."""
    try:
        write_deltalake(
            table,
            pa.Table.from_pylist([record.__dict__], schema=_SCHEMA),
            mode="overwrite",
            commit_properties=CommitProperties(app_transactions=[Transaction("lease", table.version() + 1)]),
        )
    except CommitFailedError:
        return False
    except OSError as e:
        raise StorageError(f"writing the lease {record} to {table.table_uri} failed: {e}") from e
    return True
