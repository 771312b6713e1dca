"""The source gateway: the configured sources, their buffer pool and executor, delivery to
Kafka, the cursors, and the control endpoint, assembled and run (``dbsp gateway``).

The cursors are committed while the gateway runs, without waiting for a flush: at most
``gateway.cursor_commit_seconds`` after the broker acknowledged bytes, and at once after
``gateway.cursor_commit_bytes`` of them; also on every flush and on a clean stop.

Start-up resumes every re-readable source where its bytes stopped reaching the broker:
from its committed cursor, advanced over the messages the broker holds since that commit
(read back from the offsets committed with it; a partition no commit covers, from its
earliest offset), following the source's byte ranges while they are contiguous.  So a
restart after a crash re-sends nothing the broker has, whatever the time since the last
commit; what a crash loses is only what the broker had not acknowledged, and a file
source reads that again.  A TCP stream cannot be read again: its bytes not yet
acknowledged when the gateway dies are lost (the device's connection breaks; it
reconnects to the new gateway).
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Protocol

from circuits.errors import DbspError

from .config import FilesSpec, GatewaySpec, GeneratorSpec, HttpSpec, SourceSpec, TcpSpec
from .control import ControlServer
from .delivery import Delivery, acknowledged_since
from .errors import GatewayError
from .executor import FAILED, FINISHED, GONE, REPLACED, AsyncSourceExecutor
from .pool import BufferPool
from .sources import GeneratorSource, HttpPollSource, Source, TcpListener, latest_generations
from .workers import Moving, RoutedWatcher, Workers

log = logging.getLogger(__name__)

ENDED = (FINISHED, FAILED, GONE, REPLACED)


class Committed(Protocol):
    """Cursors as committed: byte positions per ``(topic, source)``, read-back offsets per
    ``(topic, partition)`` (see :meth:`.delivery.Delivery.cursors`)."""

    positions: dict[tuple[str, str], int]
    read_back: dict[tuple[str, int], int]


class CursorStore(Protocol):
    """Where the gateway commits its cursors.  Whoever starts the gateway hands it in (the
    ``dbsp`` CLI: the Delta table of :mod:`storage.cursors`), so this package loads no
    delta-rs and no storage layer of its own."""

    def load(self) -> Committed: ...

    def commit(self, positions: dict[tuple[str, str], int], read_back: dict[tuple[str, int], int]) -> int: ...


def resume_positions(
    committed: Committed, acknowledged: dict[tuple[str, str], dict[int, int]]
) -> dict[tuple[str, str], int]:
    """Where each source resumes: its committed position (0 when none), advanced over the
    acknowledged ranges ``{start: end}`` found since while they continue it without a gap."""
    resume = dict(committed.positions)
    for key, ranges in acknowledged.items():
        position = resume.get(key, 0)
        while ranges.get(position, position) > position:
            position = ranges[position]
        resume[key] = position
    return resume


def flush_on_idle(delivery: Delivery, executor: AsyncSourceExecutor) -> None:
    """Whenever the producer's queue has emptied, the partly filled buffers go out.  One
    flush at a time: a flush walks every source, and with thousands of them notices that
    come faster than flushes finish would pile flushes up on the loop (measured with
    ``bench/gateway_sources.py``: at 5,000 sources they took 38% of the loop).  A notice
    that comes while a flush runs is kept, not dropped: a source may fill a buffer after the
    running flush passed it, and with nothing more sent no later notice would come."""
    lock = threading.Lock()
    state = {"running": False, "again": False}

    def start() -> None:
        executor.flush().add_done_callback(done)

    def done(_: concurrent.futures.Future) -> None:
        with lock:
            again = state["running"] = state["again"]
            state["again"] = False
        if again:
            start()

    def flush() -> None:
        with lock:
            if state["running"]:
                state["again"] = True
                return
            state["running"] = True
        start()

    delivery.on_idle(flush)


class Gateway:
    """One gateway process's sources, from ``groups``, landing in Kafka at ``bootstrap_servers``."""

    def __init__(
        self,
        spec: GatewaySpec,
        groups: list[SourceSpec],
        bootstrap_servers: str,
        kafka_config: dict | None,
        home: str,
        cursors: CursorStore,
        timeout: float = 30.0,
    ) -> None:
        self.spec, self.groups, self.home, self.timeout = spec, groups, home, timeout
        self._kafka = (bootstrap_servers, kafka_config)
        self.cursors = cursors
        self.pool = BufferPool(spec.buffers, spec.buffer_size)
        self.delivery = Delivery(
            bootstrap_servers, kafka_config, self.pool.release, self._delivery_failed, spec.cursor_commit_bytes
        )
        self.executor = AsyncSourceExecutor(
            self.pool,
            self.delivery.deliver,
            spec.io_threads,
            on_add=self._added,
            on_status=self._status,
            idle=lambda: self.delivery.idle,
        )
        self._topic_of: dict[str, str] = {}  # source id or file path: its group's topic
        self._resume: dict[tuple[str, str], int] = {}
        self._failed: list[str] = []
        self._moving: dict[str, Moving] = {}
        self._lock = threading.Lock()
        self._commit_lock = threading.Lock()  # periodic commits, flushes and the stop commit one at a time
        self._stopping = threading.Event()
        self._committer = threading.Thread(target=self._commit_periodically, name="gateway-cursors", daemon=True)
        # Each I/O thread is an ICADD worker: sources are placed by F(K, W) and move on rescale.
        self.workers = Workers(self.executor, spec.io_threads, on_moving=self._moved_here, delivery=self.delivery)
        self.listeners: dict[str, str] = {}  # TCP group: the address it listens on
        self.started_at = time.time()
        self.control = ControlServer(spec.control_host, spec.control_port, self.flush, self.status, self.rescale)

    # -- life ---------------------------------------------------------------------------------

    def start(self) -> None:
        committed = self.cursors.load()
        topics = [group.topic for group in self.groups]
        self._resume = resume_positions(
            committed, acknowledged_since(*self._kafka, committed.read_back, topics, self.timeout)
        )
        self.delivery.read_back_from(committed.read_back)
        self.executor.start()
        self.workers.start()
        for group in self.groups:
            self._start_group(group)
        # Demand-based flush (docs/gateway.md): when the broker has acknowledged everything, the
        # partly filled buffers go out (and, while it stays so, every fill: see ``idle``).
        flush_on_idle(self.delivery, self.executor)
        self._committer.start()
        self.control.start(self.home)

    def stop(self) -> None:
        """Stops reading, delivers what was read, commits the cursors."""
        self.workers.stop()
        self.executor.stop(self.timeout)
        self.delivery.close(self.timeout)
        self._stopping.set()
        self.delivery.commit_due.set()  # wakes the committer, which sees the stop
        self._committer.join()
        self._commit()
        self.control.stop(self.home)

    def flush(self) -> dict:
        """Hands over every partly filled buffer, waits for the broker's acknowledgements,
        commits the cursors; returns the figures (see :meth:`status`)."""
        began = time.perf_counter()
        self.executor.flush().result(self.timeout)
        left = self.delivery.wait(self.timeout)
        if left:
            raise GatewayError(f"{left} messages were not acknowledged within {self.timeout:g} s: check the broker")
        version = self._commit()
        return self.status() | {"flush_seconds": round(time.perf_counter() - began, 4), "cursor_version": version}

    def _commit(self) -> int:
        """Commits what the broker acknowledged so far; returns the cursor table's version."""
        with self._commit_lock:
            unsaved = self.delivery.unsaved  # read first: what is acknowledged later stays unsaved
            version = self.cursors.commit(*self.delivery.cursors())
            self.delivery.saved(unsaved)
            return version

    def _commit_periodically(self) -> None:
        """Commits the cursors while bytes are acknowledged: ``cursor_commit_seconds`` after
        the last commit at the latest, at once when ``cursor_commit_bytes`` are waiting.  A
        failed commit is logged and tried again: the cursors committed before stay valid."""
        while True:
            self.delivery.commit_due.wait(self.spec.cursor_commit_seconds)
            if self._stopping.is_set():
                return
            if self.delivery.unsaved:
                try:
                    self._commit()
                except DbspError as e:  # the store's own error, naming the table and the cause
                    log.warning("%s; trying again in %g s", e, self.spec.cursor_commit_seconds)
                    self._stopping.wait(self.spec.cursor_commit_seconds)

    def rescale(self, workers: int) -> dict:
        """Moves the sources to ``workers`` I/O threads while they run (ICADD, see
        :mod:`.workers`); refused while a migration runs.  Returns its figures."""
        return {"rescale": self.workers.rescale(workers, self.timeout * 2), "workers": self.workers.status()}

    def status(self) -> dict:
        """Per source: status, thread, bytes read and acknowledged, buffers, waits for a
        buffer, errors; the pool's figures; the listeners' addresses; each worker's
        distributor (phase, version, whitelist and hold sizes, keys moved)."""
        stats = self.executor.stats()
        delivered = self.delivery.stats()
        sources = {name: figures | delivered.get(name, {}) for name, figures in stats["sources"].items()}
        return {
            "pid": os.getpid(),
            "uptime_seconds": round(time.time() - self.started_at, 1),
            "threads": stats["threads"],
            "pool": stats["pool"],
            "listeners": dict(self.listeners),
            "delivery_failures": list(self._failed),
            "workers": self.workers.status(),
            "migrating": self.workers.migrating,
            "migrations": list(self.workers.migrations),
            "sources": sources,
        }

    # -- sources ------------------------------------------------------------------------------

    def _start_group(self, group: SourceSpec) -> None:
        if isinstance(group, FilesSpec):
            known = latest_generations(
                (sid for topic, sid in self._resume if topic == group.topic), group.directory, group.pattern
            )
            watcher = RoutedWatcher(
                group.directory,
                self._adder(group.topic),
                self.workers,
                pattern=group.pattern,
                poll_interval=group.poll_interval,
                generations=known,
            )
            self.executor.submit(watcher.run())
        elif isinstance(group, TcpSpec):
            listener = TcpListener(group.host, group.port, self._adder(group.topic), prefix=group.name)
            self.listeners[group.name] = "{}:{}".format(*listener.address)
            self.executor.submit(listener.run())
        elif isinstance(group, HttpSpec):
            self._adder(group.topic)(HttpPollSource(group.url, group.interval, source_id=group.name))
        elif isinstance(group, GeneratorSpec):
            add = self._adder(group.topic)
            for i in range(group.count):
                add(GeneratorSource(f"{group.name}-{i}", lines=group.lines, rate=group.rate))

    def _adder(self, topic: str) -> Callable[[Source], None]:
        def add(source: Source) -> None:
            with self._lock:
                self._topic_of[source.id] = topic
                if hasattr(source, "path"):
                    self._topic_of[source.path] = topic  # for its later generations
            self.workers.add(source)  # started by its owner, F(K, W)

        return add

    def _added(self, source: Source) -> None:
        """Before a source reads: it resumes at its cursor, and delivery tracks it."""
        with self._lock:
            topic = self._topic_of.get(source.id) or self._topic_of[source.path]
            moving = self._moving.pop(source.id, None)
        if moving is not None:  # moved from another worker: delivery goes on with its tail
            self.delivery.resume(source.id, moving.tail, moving.long_record)
            return
        position = 0
        if source.rereadable:
            position = self._resume.get((topic, source.id), 0)
            source.seek(position)
        self.delivery.add(source.id, topic, position, source.rereadable)

    def _moved_here(self, source_id: str, moving: Moving) -> None:
        with self._lock:
            self._moving[source_id] = moving

    def _status(self, source_id: str, status: str, error: str | None) -> None:
        # A source that ended for good sends its unterminated last record as it is; one
        # stopped with the gateway keeps it, to read it again whole after the restart.
        if status in ENDED:
            self.delivery.end(source_id)

    def _delivery_failed(self, source_id: str, position: int) -> None:
        """The broker refused a message: a re-readable source reads again from its cursor;
        the bytes of one that cannot are lost, and reported."""
        try:
            self.delivery.rewind(source_id, position)
            self.executor.rewind(source_id, position)
        except GatewayError as e:
            log.error(
                "source %s: the broker refused its bytes after %d and the source cannot read them again (%s)",
                source_id,
                position,
                e,
            )
            self._failed.append(source_id)
