"""The gateway's I/O threads as ICADD workers: live rescale.

Each I/O thread of the executor is worker ``w``: source K (its id) runs on worker
``F(K, W)``, the owner of K's vnode in the current layout (:class:`~.icadd.Placement`,
layouts from :mod:`circuits.layouts`).  Every worker runs one :class:`~.icadd.Distributor`
on its own loop, driven by a *pump* task that takes items, one at a time, from the
worker's inbox (an ``asyncio.Queue`` fed with ``call_soon_threadsafe``): envelopes from
other workers (one FIFO channel per ordered pair: one sender thread, one queue), the
trigger, and the downstream path of the worker's keyed region (the sources on it).

Following ICADD's appendix "Dealing with Sources", a source is split in two: the
stateless part (the directory watcher, the TCP listener, the configured sources at
start) produces data messages at worker 0, which exists in every layout, and the
stateful part (the source's runner) is the keyed region behind the distributor.  The
data messages, "source K has work", are ``Data(K, source)`` (a new source: the owner
adds it to its I/O thread) and ``Data(K, WAKE)`` (the watcher saw K's file grow: the
owner wakes it).  So a key's notifications reach its current owner in order, also
during a migration (held while K moves, released after its Acquire).

The region's operator :class:`Region`:

* ``Interrogate``: ``add_keys`` with the ids of the sources on this worker;
* ``Collect(K)``: stops K's runner (``executor.remove``: the partly filled buffer is
  delivered first, so every byte read is with delivery), then ``add_state`` with its
  settings (kind, path, generation, topic), its position and the unsent tail that
  delivery keeps for it (the bytes after its last newline);
* ``Acquire(K)``: ``take``; a file source is created again on this worker at that
  position (``seek``), delivery goes on from the same tail; ``Drop(K)``: forgotten.

Delivery (one Kafka producer per gateway process) tracks the acknowledgements of every
source wherever it runs; the tail moved in the state is written back when the source
starts on its new worker.

**TCP connections do not move.** At Collect a TCP source is closed: the bytes the broker
acknowledged are safe, those read but not yet acknowledged are lost as on a gateway
crash, and the device reconnects, to the listener, which places the new connection (a
new source id) on its owner under the new layout.  HTTP pollers and generators are not
rescaled in this version (they have no cursor: recreating them elsewhere would restart
them); they are not keys of the region (``add_keys`` leaves them out) and stay where they
started (a rescale that would stop their worker is refused).

A migration (:meth:`Workers.rescale`) runs as the distributor's docstring asks: one at a
time (refused while one runs); joining workers are created (an I/O thread each) at the
current layout and version before the trigger reaches anyone; the trigger is put into
every worker's inbox; leaving workers stop once every worker is back to one layout and a
marker sent by every other worker behind what it sent has arrived (nothing is on its way
to them).  Collect moves at most ``parallel`` keys at once per worker (their sources
stop concurrently).

A new source refused by a full pool at its owner is closed (a connection: the device
reconnects) or offered again at the watcher's next scan (a file).  Not handled yet: a
file truncated below its cursor gets a successor (a new key) that the executor adds on
the least loaded thread, not through the distributors, so it may run off its owner
until the next restart.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from circuits.layouts import initial, rescale
from circuits.vnodes import DEFAULT_VNODES, Layout

from .errors import GatewayError
from .executor import AsyncSourceExecutor
from .icadd import DOWN, Acquire, Collect, Data, Distributor, Drop, IcaddMessage, Interrogate, Out, Phase, Placement
from .sources import DirectoryWatcher, FileSource, Source, TcpSource

log = logging.getLogger(__name__)

OPERATOR = "source"
WAKE = "wake"
PRODUCER = 0
"""The worker where the stateless halves of the sources produce their data messages."""


@dataclass
class Moving:
    """The state of a source in an Acquire: what recreating it on another worker needs."""

    kind: str
    """``file``, or ``tcp`` (nothing to recreate: the device reconnects)."""
    position: int = 0
    path: str = ""
    generation: int = 1
    tail: bytes = b""
    long_record: bool = False


@dataclass(eq=False)
class _Worker:
    index: int
    loop: asyncio.AbstractEventLoop
    distributor: Distributor
    inbox: asyncio.Queue | None = None
    sources: dict[str, Source] = field(default_factory=dict)
    """The sources that move: files and TCP connections."""
    pinned: dict[str, Source] = field(default_factory=dict)
    """HTTP pollers, generators: they stay on the worker that started them."""
    markers: set[int] = field(default_factory=set)
    quiet: threading.Event = field(default_factory=threading.Event)
    collecting: set[asyncio.Task] = field(default_factory=set)
    pump: concurrent.futures.Future | None = None


class Workers:
    """One ICADD worker per I/O thread of ``executor`` (see the module).

    ``on_moving(source_id, Moving)`` is called on the new owner's loop just before a moved
    source is added again (the gateway then seeks it and hands delivery its tail instead
    of resuming it from the cursors); ``watchers`` is how a file path's watcher is found
    (to keep its current source and wake it)."""

    def __init__(
        self,
        executor: AsyncSourceExecutor,
        workers: int,
        *,
        vnodes: int = DEFAULT_VNODES,
        on_moving: Callable[[str, Moving], None] | None = None,
        delivery: Any = None,
        parallel: int = 64,
    ):
        self.executor = executor
        self.delivery = delivery
        self.on_moving = on_moving
        self.parallel = parallel
        self.layout: Layout = initial(vnodes, workers)
        self.version = 0
        self.workers: dict[int, _Worker] = {}
        self.watchers: list[RoutedWatcher] = []
        self._lock = threading.Lock()
        self._migrating = False
        self.moved: dict[str, int] = {}
        """Per source id moved in the last migration: the worker it went to."""
        self.migrations: list[dict] = []
        self._restored = threading.Semaphore(0)

    # -- life, from any thread ------------------------------------------------------------------

    def start(self) -> None:
        """Creates the workers on the executor's threads (call after ``executor.start``)."""
        while self.executor.stats()["threads"] < self.layout.workers:
            self.executor.add_thread()
        for w in range(self.layout.workers):
            self._join(w)

    def _join(self, w: int) -> None:
        loop = self.executor.loop(w)
        worker = _Worker(w, loop, Distributor(w, self.layout, version=self.version))
        self.workers[w] = worker
        started = threading.Event()

        async def pump() -> None:
            worker.inbox = asyncio.Queue()
            started.set()
            await self._pump(worker)

        worker.pump = asyncio.run_coroutine_threadsafe(pump(), loop)
        started.wait(10)

    def add(self, source: Source) -> None:
        """A new source (from any thread): ``Data(K, source)`` at the producer worker."""
        self._send(PRODUCER, ("offer", Data(source.id, source)))

    def wake(self, source_id: str) -> None:
        """Source K has work (from any thread): ``Data(K, WAKE)`` at the producer worker."""
        self._send(PRODUCER, ("offer", Data(source_id, WAKE)))

    @property
    def migrating(self) -> bool:
        return self._migrating

    def rescale(self, workers: int, timeout: float = 60.0) -> dict:
        """Migrates from the current layout to one of ``workers`` workers (the project's
        least-movement rescale) while the sources run; returns when it is over: the
        figures (keys moved, seconds).  Refuses while a migration runs."""
        if workers < 1:
            raise GatewayError(f"rescale to {workers} workers: give 1 or more")
        pinned = {w: len(wk.pinned) for w, wk in self.workers.items() if w >= workers and wk.pinned}
        if pinned:
            raise GatewayError(
                f"workers {sorted(pinned)} run HTTP or generator sources, which do not move: "
                f"rescale to {max(pinned) + 1} workers or more"
            )
        with self._lock:
            if self._migrating:
                raise GatewayError("a migration is running: wait until `dbsp gateway status` shows every worker steady")
            self._migrating = True
        try:
            return self._rescale(workers, timeout)
        finally:
            self._migrating = False

    def _rescale(self, workers: int, timeout: float) -> dict:
        began = time.perf_counter()
        before, target = self.layout, rescale(self.layout, workers)
        for w in range(before.workers, workers):
            self.executor.add_thread()
            self._join(w)
        for w in sorted(self.workers):
            self._send(w, ("begin", target))
        # A limit on no progress, not on the whole migration: under load moving many keys
        # takes long while every key still moves.
        deadline, progress = time.monotonic() + timeout, None
        while not all(
            wk.distributor.phase is Phase.STEADY and wk.distributor.version == self.version + 1
            for wk in list(self.workers.values())
        ):
            if progress != (progress := self._progress()):
                deadline = time.monotonic() + timeout
            elif time.monotonic() > deadline:
                raise GatewayError(
                    f"the migration to {workers} workers made no progress for {timeout:g} s: {self.status()}"
                )
            time.sleep(0.002)
        deadline = time.monotonic() + timeout
        self.layout, self.version = target, self.version + 1
        placement = Placement(target)
        moved = {key: placement.worker(key) for wk in self.workers.values() for key in wk.distributor.moved}
        switched = time.perf_counter()
        for w in sorted((w for w in self.workers if w >= workers), reverse=True):
            self._leave(w, deadline)
        figures = {
            "from": before.workers,
            "to": workers,
            "version": self.version,
            "moved": len(moved),
            "seconds": round(switched - began, 4),
            "stop_seconds": round(time.perf_counter() - switched, 4),
        }
        self.moved = moved
        self.migrations.append(figures)
        return figures

    def rescale_stopped(self, workers: int, timeout: float = 60.0) -> dict:
        """The baseline ICADD replaces: a stop-the-world rescale.  Every source stops (its
        partly filled buffer delivered), the workers get the new layout, and every file
        source starts again on its new owner at its position (TCP connections close)."""
        with self._lock:
            if self._migrating:
                raise GatewayError("a migration is running")
            self._migrating = True
        try:
            began = time.perf_counter()
            deadline = time.monotonic() + timeout
            states: dict[str, Moving] = {}
            for wk in list(self.workers.values()):
                states |= asyncio.run_coroutine_threadsafe(self._stop_all(wk), wk.loop).result(timeout)
            before, target = self.layout, rescale(self.layout, workers)
            self.layout, self.version = target, self.version + 1
            for w in range(before.workers, workers):
                self.executor.add_thread()
                self._join(w)
            for w, wk in self.workers.items():
                wk.distributor = Distributor(w, target, version=self.version)
            for w in sorted((w for w in self.workers if w >= workers), reverse=True):
                self._leave(w, deadline)
            placement = Placement(target)
            files = {key: m for key, m in states.items() if m.kind == "file"}
            for key, moving in files.items():
                self._send(placement.worker(key), ("restore", (key, moving)))
            for _ in files:
                if not self._restored.acquire(timeout=max(0.0, deadline - time.monotonic())):
                    raise GatewayError("the stopped rescale did not restart every source in time")
            figures = {
                "from": before.workers,
                "to": workers,
                "version": self.version,
                "moved": len(states),
                "seconds": round(time.perf_counter() - began, 4),
                "stopped": True,
            }
            self.migrations.append(figures)
            return figures
        finally:
            self._migrating = False

    async def _stop_all(self, worker: _Worker) -> dict[str, Moving]:
        keys = list(worker.sources)
        states = await asyncio.gather(*(self._collect(worker.sources[k]) for k in keys))
        worker.sources.clear()
        return dict(zip(keys, states))

    def _progress(self) -> tuple:
        """What changes while a migration goes on: each worker's phase, version, keys handed
        over and keys still waiting."""
        return tuple(
            (
                w,
                wk.distributor.phase,
                wk.distributor.version,
                len(wk.distributor.moved),
                len(wk.distributor.hold),
                len(wk.distributor.whitelist),
            )
            for w, wk in sorted(self.workers.items())
        )

    def _leave(self, w: int, deadline: float) -> None:
        """Stops leaving worker ``w`` once a marker from every other worker, sent behind
        everything it sent, has arrived."""
        leaving = self.workers[w]
        others = [o for o in self.workers if o != w]
        for o in others:
            self._send(o, ("marker", w))
        if not leaving.quiet.wait(max(0.0, deadline - time.monotonic())) and others:
            raise GatewayError(f"worker {w} did not get quiet to leave")
        if leaving.sources:
            raise GatewayError(f"worker {w} leaves holding {sorted(leaving.sources)}")
        del self.workers[w]
        leaving.pump.cancel()
        self.executor.remove_thread()

    def status(self) -> list[dict]:
        """Each worker's distributor (phase, version, whitelist and hold sizes, keys moved)
        and its number of sources."""
        out = []
        for w, wk in sorted(self.workers.items()):
            if not wk.loop.is_running():  # the gateway stopped: a coroutine sent there would never run
                out.append({"worker": w, "phase": "stopped"})
                continue
            try:
                out.append(asyncio.run_coroutine_threadsafe(_status(wk), wk.loop).result(5))
            except (concurrent.futures.TimeoutError, RuntimeError):
                out.append({"worker": w, "phase": "unknown"})
        return out

    def stop(self) -> None:
        for wk in self.workers.values():
            if wk.pump is not None:
                wk.pump.cancel()

    # -- on the loops ---------------------------------------------------------------------------

    def _send(self, w: int, item: tuple) -> None:
        worker = self.workers.get(w)
        if worker is None:
            # Only stale control messages can be sent to a worker that left (checked).
            body = item[1].body if item[0] == "receive" else None
            if not isinstance(body, (Data, Acquire)):
                return
            raise GatewayError(f"{body} sent to worker {w}, which has left")
        worker.loop.call_soon_threadsafe(worker.inbox.put_nowait, item)

    def _emit(self, worker: _Worker, out: Out) -> None:
        for dest, message in out:
            if dest is DOWN:
                worker.inbox.put_nowait(("down", message))
            else:
                self._send(dest, ("receive", message))

    async def _pump(self, worker: _Worker) -> None:
        while True:
            kind, item = await worker.inbox.get()
            d = worker.distributor  # replaced by a stop-the-world rescale
            try:
                if kind == "offer":
                    self._emit(worker, d.offer(item))
                elif kind == "receive":
                    self._emit(worker, d.receive(item))
                elif kind == "begin":
                    self._emit(worker, d.begin(item))
                elif kind == "down" and isinstance(item, Collect):
                    # Stopping the source takes a turn of the loop: the next items go on
                    # meanwhile (they are of other keys: K's data is held from now on).
                    task = asyncio.ensure_future(self._collecting(worker, item))
                    worker.collecting.add(task)
                    task.add_done_callback(worker.collecting.discard)
                elif kind == "down":
                    await self._region(worker, item)
                    if isinstance(item, IcaddMessage):
                        self._emit(worker, d.processed(item))
                elif kind == "restore":  # stop-the-world rescale
                    self._acquire(worker, *item)
                    self._restored.release()
                elif kind == "marker":
                    self._send(item, ("marked", worker.index))
                elif kind == "marked":
                    worker.markers.add(item)
                    if worker.markers >= set(self.workers) - {worker.index}:
                        worker.quiet.set()
                self._collect_more(worker)
            except Exception:  # a bug here must not stop the worker silently
                log.exception("worker %d: %s %r", worker.index, kind, item)

    def _collect_more(self, worker: _Worker) -> None:
        d = worker.distributor
        while d.phase is Phase.COLLECT and d.whitelist and len(d.hold) < self.parallel:
            self._emit(worker, d.collect())

    async def _collecting(self, worker: _Worker, collect: Collect) -> None:
        try:
            await self._region(worker, collect)
            self._emit(worker, worker.distributor.processed(collect))
            self._collect_more(worker)
        except Exception:
            log.exception("worker %d: collecting %s", worker.index, collect.key)

    async def _region(self, worker: _Worker, item: Any) -> None:
        """The keyed region's operator: the sources on this worker."""
        if isinstance(item, Data):
            if isinstance(item.payload, Source):
                self._start(worker, item.payload)
            elif (source := worker.sources.get(item.key)) is not None and hasattr(source, "wake"):
                source.wake()
        elif isinstance(item, Interrogate):
            item.add_keys(worker.sources)
        elif isinstance(item, Collect):
            source = worker.sources.get(item.key)
            if source is not None:
                item.add_state(OPERATOR, await self._collect(source))
        elif isinstance(item, Acquire):
            moving = item.take(OPERATOR)
            if moving is not None and moving.kind == "file":
                self._acquire(worker, item.key, moving)
        elif isinstance(item, Drop):
            if item.drop(OPERATOR):
                worker.sources.pop(item.key, None)

    def _start(self, worker: _Worker, source: Source) -> None:
        try:
            self.executor.add(source, thread=worker.index)
        except GatewayError as error:
            # Refused (a full pool): a connection is closed, a new file offered again at a later scan.
            log.warning("source %s not started on worker %d: %s", source.id, worker.index, error)
            source.close()
            watcher = getattr(source, "_watcher", None)
            if isinstance(watcher, RoutedWatcher):
                self.executor.loop(PRODUCER).call_soon_threadsafe(watcher.refused, source)
            return
        if isinstance(source, (FileSource, TcpSource)):
            worker.sources[source.id] = source
        else:
            worker.pinned[source.id] = source  # not moved: see the module

    async def _collect(self, source: Source) -> Moving:
        """Stops the source (its partly filled buffer is delivered first): its state."""
        try:
            await asyncio.wrap_future(self.executor.remove(source.id))
        except GatewayError:
            pass  # it had ended already
        if isinstance(source, TcpSource):
            return Moving("tcp")
        tail, long_record = self.delivery.tail(source.id) if self.delivery is not None else (b"", False)
        assert isinstance(source, FileSource)
        return Moving("file", source.position, source.path, source.generation, tail, long_record)

    def _acquire(self, worker: _Worker, key: str, moving: Moving) -> None:
        watcher = next((w for w in self.watchers if w.watches(moving.path)), None)
        source = FileSource(moving.path, generation=moving.generation, watcher=watcher)
        source.seek(moving.position)
        if watcher is not None:
            watcher.adopt(source)
        if self.on_moving is not None:
            self.on_moving(key, moving)
        self._start(worker, source)


async def _status(worker: _Worker) -> dict:
    return worker.distributor.status() | {"sources": len(worker.sources) + len(worker.pinned)}


class RoutedWatcher(DirectoryWatcher):
    """A directory watcher whose wakes go through the workers' distributors: ``Data(K,
    WAKE)`` reaches K's current owner, which wakes the source it runs."""

    def __init__(self, directory: str, on_source: Callable[[FileSource], None], workers: Workers, **options: Any):
        super().__init__(directory, on_source, **options)
        self._workers = workers
        workers.watchers.append(self)

    def watches(self, path: str) -> bool:
        with self._lock:
            return path in self._current

    def adopt(self, source: FileSource) -> None:
        """``source`` now reads its path (recreated on another worker)."""
        with self._lock:
            if self._current.get(source.path) is not None and self._current[source.path].id == source.id:
                self._current[source.path] = source

    def refused(self, source: FileSource) -> None:
        """Its owner refused ``source`` (a full pool): offered again at the next scan, under
        the same id.  On the watcher's loop."""
        with self._lock:
            if self._current.get(source.path) is not source or self._generations.get(source.path) != source.generation:
                return
            self._generations[source.path] -= 1
            del self._current[source.path]
        self._seen.pop(source.path, None)

    def _wake(self, path: str) -> None:
        with self._lock:
            source = self._current.get(path)
        if source is not None:
            self._workers.wake(source.id)
