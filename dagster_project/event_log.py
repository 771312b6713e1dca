"""The event log of the Dagster home ``dbsp`` writes: every run's events in one SQLite
database, with the connections of a process kept open.

Dagster's ``ConsolidatedSqliteEventLogStorage`` (one database, where Dagster's default
keeps one per run) opens a SQLite connection for every read and write, and each commit
waits for the disk: a demo step run stores about 35 events in about 100 transactions,
and those syncs and connection closes were most of its event log's time.  Here each
process keeps a pool of connections, and the write-ahead log (which Dagster's set-up
turns on) syncs at its checkpoints (``synchronous=NORMAL``): a crash of any process loses
nothing; a power cut may lose the last events, never the database.  The pipeline's own
state does not depend on them: its steps are committed in Delta.
"""

from __future__ import annotations

from contextlib import contextmanager
from functools import cached_property

import sqlalchemy as db
from dagster._core.storage.event_log import ConsolidatedSqliteEventLogStorage
from dagster._core.storage.sqlite import SQLITE_BUSY_TIMEOUT_SECONDS


class LocalEventLogStorage(ConsolidatedSqliteEventLogStorage):
    """``ConsolidatedSqliteEventLogStorage`` with pooled connections and
    ``synchronous=NORMAL`` (see the module's docstring); configured in ``dagster.yaml``
    as ``module: dagster_project.event_log``, ``class: LocalEventLogStorage``."""

    @cached_property
    def _engine(self) -> db.Engine:
        # A pooled connection is used by one thread at a time; Dagster's threads share the pool.
        engine = db.create_engine(
            self._conn_string, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_SECONDS, "check_same_thread": False}
        )
        db.event.listen(engine, "connect", lambda connection, _: connection.execute("PRAGMA synchronous=NORMAL"))
        return engine

    @contextmanager
    def _connect(self):
        with self._engine.connect() as connection, connection.begin():
            yield connection

    def dispose(self) -> None:
        super().dispose()
        if "_engine" in self.__dict__:
            self._engine.dispose()
