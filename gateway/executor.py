"""The executor of the gateway's sources (the asynchronous-sources design's ``AsyncSourceExecutor``).

``io_threads`` threads each run one asyncio event loop; every source is assigned to the
loop with the fewest sources and driven there by a *runner* coroutine, so thousands of
sources share a few threads and none of them blocks a thread while it waits (the asynchronous-sources design's
P1).  A :class:`~.sources.SyncSource` runs behind a :class:`~.sources.ThreadedSource`,
on a thread of its own (the asynchronous-sources design's fallback).

A runner: opens its source; then, over and over, awaits a buffer from the pool, fills it
until it is full, the stream ends or a flush asks for it, and hands it to
``deliver(source_id, buffer, start, end)``, where ``[start, end)`` is the buffer's range
of the source's bytes (counted from the source's ``position`` at open for re-readable
sources, from 0 for the others).  ``deliver`` runs on the loop's thread and must not
block; the buffer is then the consumer's, who returns it with ``pool.release``.  An
empty buffer is released, never delivered.

Flush (demand-based, no timers): :meth:`AsyncSourceExecutor.flush` cancels the pending
``fill`` of every source whose buffer is partly filled (sources are cancellation-safe:
see :mod:`.sources`), and the runner delivers what it has at once.  The latency of a
byte is then bounded by the consumer's demand: it is delivered at the next flush, or
earlier when its buffer fills.

Faults: an exception from ``open`` or ``fill`` is counted (``errors``, ``last_error``)
and logged; the bytes already in the buffer are delivered, the source is closed and,
after a backoff doubling from ``backoff[0]`` to at most ``backoff[1]`` seconds (reset once
the source reads again), opened again; a re-readable source resumes at its position.
Other sources go on meanwhile.  Exceptions: a source that is not ``restartable`` (a TCP
connection) ends with status ``failed``; :class:`~.errors.SourceGone` ends it with
status ``gone``; :class:`~.sources.SourceReplaced` ends it with status ``replaced`` and
adds its successor.  End of stream ends a source with status ``finished``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, field

from .errors import GatewayConfigError, GatewayError, SourceGone
from .pool import Buffer, BufferPool
from .sources import Source, SourceReplaced, SyncSource, ThreadedSource

log = logging.getLogger(__name__)

Deliver = Callable[[str, Buffer, int, int], None]
"""``deliver(source_id, buffer, start, end)``: takes a filled buffer (see the module)."""

STARTING, RUNNING, RETRYING = "starting", "running", "retrying"
FINISHED, GONE, REPLACED, FAILED, STOPPED = "finished", "gone", "replaced", "failed", "stopped"
"""A source's statuses; the last five are final (``stopped``: removed, or the executor stopped)."""
FINAL = frozenset({FINISHED, GONE, REPLACED, FAILED, STOPPED})

ENDED_KEPT = 1000
"""How many ended sources ``stats`` still shows (the most recent)."""


@dataclass(eq=False)
class _IoThread:
    """One I/O thread and its event loop."""

    index: int
    loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.new_event_loop)
    sources: int = 0
    """Sources assigned to it (under the executor's lock)."""

    def __post_init__(self) -> None:
        self.thread = threading.Thread(target=self.loop.run_forever, name=f"gateway-io-{self.index}", daemon=True)


@dataclass(eq=False)
class _Runner:
    """A source and its runner's state; touched only on its loop, except the figures."""

    source: Source
    io: _IoThread
    status: str = STARTING
    offset: int = 0
    """The source offset of the next byte read: the ``start`` of the next buffer."""
    bytes: int = 0
    buffers: int = 0
    errors: int = 0
    last_error: str | None = None
    task: asyncio.Task | None = None
    fill: asyncio.Task | None = None
    """The pending ``fill`` while the runner waits for it."""
    buffer: Buffer | None = None
    """The buffer being filled."""
    flush: bool = False
    flushed: list[asyncio.Future] = field(default_factory=list)
    """Flush requests waiting for this buffer's delivery."""
    rewind: int | None = None
    """A position to read again from, asked by :meth:`AsyncSourceExecutor.rewind`."""
    successor: Source | None = None
    removed: bool = False
    ended: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)

    @property
    def id(self) -> str:
        return self.source.id


class _Rewind(Exception):
    """Raised in a runner to read its source again from ``_Runner.rewind``."""


class AsyncSourceExecutor:
    """Runs sources on ``io_threads`` event loops, filling buffers of ``pool`` for ``deliver``.

    ``on_add(source)`` is called in :meth:`add` for every source before it reads (also for
    a successor the executor adds itself); ``on_status(source_id, status, last_error)`` on
    the source's loop at every change of status.  Both must not block.  ``idle()``, when
    given, says whether downstream waits for work (the producer's queue is empty): then a
    runner delivers after every fill instead of filling its buffer first, the second demand
    of the asynchronous-sources design's flush (a quiet gateway delivers at once, a busy one in full buffers).
    """

    def __init__(
        self,
        pool: BufferPool,
        deliver: Deliver,
        io_threads: int = 1,
        *,
        backoff: tuple[float, float] = (0.1, 5.0),
        on_add: Callable[[Source], None] | None = None,
        on_status: Callable[[str, str, str | None], None] | None = None,
        idle: Callable[[], bool] | None = None,
    ):
        if io_threads < 1:
            raise GatewayConfigError(f"gateway.io_threads is {io_threads}: set it to 1 or more")
        if not 0 < backoff[0] <= backoff[1]:
            raise GatewayConfigError(
                f"the retry backoff {backoff} must be (first, longest) seconds, 0 < first <= longest"
            )
        self.pool = pool
        self._deliver = deliver
        self._backoff = backoff
        self._on_add = on_add
        self._on_status = on_status
        self._idle = idle
        self._threads = [_IoThread(i) for i in range(io_threads)]
        self._runners: dict[str, _Runner] = {}
        self._ended: dict[str, dict] = {}
        self._lock = threading.Lock()
        self._started = self._stopped = False

    # -- control, from any thread -------------------------------------------------------------

    def start(self) -> None:
        """Starts the I/O threads; sources added before start begin now."""
        with self._lock:
            if self._started:
                return
            self._started = True
        for io in self._threads:
            io.thread.start()

    def add(self, source: Source | SyncSource, thread: int | None = None) -> None:
        """Runs ``source`` (a :class:`SyncSource` on a thread of its own) on I/O thread
        ``thread`` (None: the one with the fewest sources); raises the pool's
        :class:`GatewayConfigError` when it has no room for one more source."""
        if isinstance(source, SyncSource):
            source = ThreadedSource(source)
        with self._lock:
            if self._stopped:
                raise GatewayError(f"source {source.id!r} added to a stopped executor")
            if source.id in self._runners:
                raise GatewayError(f"source {source.id!r} is already running")
            if thread is not None and not 0 <= thread < len(self._threads):
                raise GatewayError(f"source {source.id!r} added to I/O thread {thread} of {len(self._threads)}")
            self.pool.register(source.id)
            io = self._threads[thread] if thread is not None else min(self._threads, key=lambda t: t.sources)
            io.sources += 1
            runner = self._runners[source.id] = _Runner(source, io)
        try:
            if self._on_add is not None:
                self._on_add(source)
        except BaseException:
            self._forget(runner)
            raise
        io.loop.call_soon_threadsafe(self._launch, runner)

    def remove(self, source_id: str) -> concurrent.futures.Future:
        """Stops a source (its partly filled buffer is delivered, then it is closed); the
        future completes with its final status once it ended."""
        runner = self._runner(source_id)
        runner.io.loop.call_soon_threadsafe(self._cancel, runner)
        return runner.ended

    def flush(self, source_id: str | None = None) -> concurrent.futures.Future:
        """Asks every source (or one) to deliver its partly filled buffer now.  The future
        completes once each source that had a partly filled buffer when the request reached
        its loop has delivered it."""
        runners = [self._runner(source_id)] if source_id is not None else None
        with self._lock:
            runners = runners or list(self._runners.values())
            running = self._started and not self._stopped
        if not running:
            return _completed()
        by_loop: dict[_IoThread, list[_Runner]] = {}
        for runner in runners:
            by_loop.setdefault(runner.io, []).append(runner)
        return _all_of([asyncio.run_coroutine_threadsafe(self._flush_here(rs), io.loop) for io, rs in by_loop.items()])

    def rewind(self, source_id: str, position: int) -> None:
        """Makes a re-readable source read again from ``position`` (the bytes it read beyond
        it were lost downstream): its partly filled buffer is dropped, not delivered."""
        runner = self._runner(source_id)
        if not runner.source.rereadable:
            raise GatewayError(f"source {source_id!r} cannot read its bytes again")
        runner.io.loop.call_soon_threadsafe(self._ask_rewind, runner, position)

    def submit(self, coroutine: Coroutine, thread: int = 0) -> concurrent.futures.Future:
        """Runs ``coroutine`` (a listener's or a watcher's ``run()``) on I/O thread
        ``thread``'s loop until it ends or the executor stops."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._threads[thread].loop)

    def add_thread(self) -> int:
        """One more I/O thread (started if the executor is): its index."""
        with self._lock:
            if self._stopped:
                raise GatewayError("I/O thread added to a stopped executor")
            io = _IoThread(len(self._threads))
            self._threads.append(io)
            started = self._started
        if started:
            io.thread.start()
        return io.index

    def remove_thread(self, timeout: float = 10.0) -> None:
        """Stops the last I/O thread, which must have no sources left (its submitted
        coroutines are cancelled)."""
        with self._lock:
            if len(self._threads) == 1 or self._threads[-1].sources:
                raise GatewayError(
                    f"the last I/O thread cannot stop: {len(self._threads)} thread(s), "
                    f"{self._threads[-1].sources} source(s) on it"
                )
            io = self._threads.pop()
            started = self._started and not self._stopped
        if started:
            asyncio.run_coroutine_threadsafe(_shutdown(), io.loop).result(timeout)
            io.loop.call_soon_threadsafe(io.loop.stop)
            io.thread.join(timeout)
        io.loop.close()

    def loop(self, thread: int) -> asyncio.AbstractEventLoop:
        """The event loop of I/O thread ``thread``."""
        return self._threads[thread].loop

    def stop(self, timeout: float = 10.0) -> None:
        """Stops every source (partly filled buffers are delivered: stop the consumer after)
        and submitted coroutine, closes the sources, joins the I/O threads."""
        self.start()  # sources added but never started are ended the same way
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        for done in [asyncio.run_coroutine_threadsafe(_shutdown(), io.loop) for io in self._threads]:
            done.result(timeout)
        for io in self._threads:
            io.loop.call_soon_threadsafe(io.loop.stop)
            io.thread.join(timeout)
            io.loop.close()

    def stats(self) -> dict:
        """``threads``; ``pool``: the pool's figures; ``sources``: per source ``status``,
        ``thread``, ``position`` (offset of the next byte), ``bytes``, ``buffers``
        (delivered), ``errors``, ``last_error``, and from the pool ``held``, ``acquired``,
        ``waits`` (for a buffer) and ``wait_seconds``.  Ended sources stay, with their last
        figures (the latest :data:`ENDED_KEPT`)."""
        pool = self.pool.stats()
        pool_sources = pool.pop("sources")
        with self._lock:
            sources = dict(self._ended)
            runners = list(self._runners.values())
        for runner in runners:
            sources[runner.id] = {**_figures(runner), **pool_sources.get(runner.id, {})}
        return {"threads": len(self._threads), "pool": pool, "sources": sources}

    def _forget(self, runner: _Runner) -> dict:
        """Unregisters an ended (or never started) source: its last figures."""
        figures = {**_figures(runner), **self.pool.source_stats(runner.id)}
        self.pool.unregister(runner.id)
        with self._lock:
            del self._runners[runner.id]
            runner.io.sources -= 1
        return figures

    def _runner(self, source_id: str) -> _Runner:
        with self._lock:
            runner = self._runners.get(source_id)
        if runner is None:
            raise GatewayError(f"no source {source_id!r} is running")
        return runner

    # -- on the loops -------------------------------------------------------------------------

    def _launch(self, runner: _Runner) -> None:
        runner.task = asyncio.get_running_loop().create_task(self._run(runner), name=f"source:{runner.id}")
        # A callback, not a finally: it runs even for a task cancelled before it started.
        runner.task.add_done_callback(lambda _: self._end(runner))
        if runner.removed:
            runner.task.cancel()

    @staticmethod
    def _cancel(runner: _Runner) -> None:
        runner.removed = True  # remove() may overtake add()'s launch from another thread
        if runner.task is not None:
            runner.task.cancel()

    @staticmethod
    def _ask_rewind(runner: _Runner, position: int) -> None:
        runner.rewind = position
        if runner.fill is not None:
            runner.fill.cancel()

    async def _flush_here(self, runners: Iterable[_Runner]) -> None:
        waits = []
        loop = asyncio.get_running_loop()
        for runner in runners:
            if runner.buffer is None or not runner.buffer.length:
                continue  # nothing read that waits: done
            runner.flush = True
            runner.flushed.append(loop.create_future())
            waits.append(runner.flushed[-1])
            if runner.fill is not None:
                runner.fill.cancel()  # if it already completed, the runner sees the flag
        await asyncio.gather(*waits)

    async def _run(self, runner: _Runner) -> None:
        """Runs the source through its faults until it ends (or is cancelled)."""
        faults = 0
        while True:
            before = runner.bytes
            fault = await self._attempt(runner)
            if isinstance(fault, _Rewind):
                runner.source.seek(runner.rewind)
                runner.rewind = None
                continue
            if fault is not None:
                self._report(runner, fault)
            final = _final_status(runner, fault)
            if final is not None:
                runner.successor = fault.successor if isinstance(fault, SourceReplaced) else None
                self._set_status(runner, final)
                return
            faults = 1 if runner.bytes > before else faults + 1
            self._set_status(runner, RETRYING)
            await asyncio.sleep(min(self._backoff[1], self._backoff[0] * 2 ** (faults - 1)))

    async def _attempt(self, runner: _Runner) -> Exception | None:
        """Opens the source and pumps it to its end (None) or its fault (returned)."""
        try:
            await runner.source.open()
            if runner.source.rereadable:
                runner.offset = runner.source.position
            self._set_status(runner, RUNNING)
            await self._pump(runner)
            return None
        except Exception as fault:  # a fault of this source only: reported, and retried
            return fault
        finally:
            _close(runner.source)

    async def _pump(self, runner: _Runner) -> None:
        """Fills and delivers buffers until the end of the stream."""
        while True:
            buffer = await self.pool.acquire(runner.id)
            try:
                ended = await self._fill(runner, buffer)
            finally:
                self._hand_over(runner, buffer)
            if ended:
                return

    async def _fill(self, runner: _Runner, buffer: Buffer) -> bool:
        """Fills ``buffer`` until it is full or a flush asks for it: True at end of stream."""
        runner.buffer = buffer
        try:
            while not buffer.full and not (runner.flush and buffer.length):
                if runner.rewind is not None:
                    raise _Rewind()
                fill = runner.fill = asyncio.ensure_future(runner.source.fill(buffer.view()))
                try:
                    await asyncio.wait((fill,))  # a cancelled fill (flush) does not cancel us
                except asyncio.CancelledError:
                    # The runner stops.  A pending fill, cancelled, has written nothing and
                    # will not; one that completed meanwhile wrote bytes that must count.
                    if not fill.cancel():
                        buffer.length += _written(fill)
                    raise
                finally:
                    runner.fill = None
                if fill.cancelled():
                    continue  # a flush or a rewind: the loop's conditions say which
                n = fill.result()  # the source's fault, if any, is raised here
                if n == 0:
                    return True
                buffer.length += n
                if self._idle is not None and self._idle():
                    break
            return False
        finally:
            runner.buffer = None

    def _hand_over(self, runner: _Runner, buffer: Buffer) -> None:
        """Delivers a filled buffer (releases an empty one, or one a rewind drops)."""
        try:
            if buffer.length == 0 or runner.rewind is not None:
                self.pool.release(buffer)
                return
            start = runner.offset
            runner.offset += buffer.length
            runner.bytes += buffer.length
            runner.buffers += 1
            self._deliver(runner.id, buffer, start, runner.offset)
        finally:
            self._flushed(runner)

    @staticmethod
    def _flushed(runner: _Runner) -> None:
        runner.flush = False
        for waiter in runner.flushed:
            if not waiter.done():
                waiter.set_result(None)
        runner.flushed.clear()

    def _report(self, runner: _Runner, fault: Exception) -> None:
        runner.errors += 1
        runner.last_error = f"{type(fault).__name__}: {fault}"
        log.warning("source %s: %s", runner.id, runner.last_error)

    def _set_status(self, runner: _Runner, status: str) -> None:
        runner.status = status
        if self._on_status is not None:
            self._on_status(runner.id, status, runner.last_error)

    def _end(self, runner: _Runner) -> None:
        """The source ended: unregisters it, keeps its figures, adds its successor."""
        if runner.status not in FINAL:
            self._set_status(runner, STOPPED)  # cancelled
        self._flushed(runner)
        figures = self._forget(runner)
        with self._lock:
            self._ended[runner.id] = figures
            while len(self._ended) > ENDED_KEPT:
                del self._ended[next(iter(self._ended))]
        runner.ended.set_result(runner.status)
        if runner.successor is not None:
            try:
                self.add(runner.successor)
            except GatewayError as error:
                log.warning("source %s could not start after %s: %s", runner.successor.id, runner.id, error)


def _final_status(runner: _Runner, fault: Exception | None) -> str | None:
    """The status that ends the source after ``fault`` (None: its end of stream); None when
    the fault is retried."""
    if fault is None:
        return FINISHED
    if isinstance(fault, SourceReplaced):
        return REPLACED
    if isinstance(fault, SourceGone):
        return GONE
    return None if runner.source.restartable else FAILED


def _written(fill: asyncio.Task) -> int:
    """The bytes a completed fill wrote; its fault, if any, is dropped (the runner stops)."""
    if fill.cancelled() or fill.exception() is not None:
        return 0
    return fill.result()


def _figures(runner: _Runner) -> dict:
    return {
        "status": runner.status,
        "thread": runner.io.index,
        "position": runner.offset,
        "bytes": runner.bytes,
        "buffers": runner.buffers,
        "errors": runner.errors,
        "last_error": runner.last_error,
    }


def _close(source: Source) -> None:
    try:
        source.close()
    except Exception as error:  # closing must not stop the runner: it is done with the source
        log.warning("source %s: closing failed: %s", source.id, error)


async def _shutdown() -> None:
    """Cancels every other task of the running loop and waits for them to end (again for
    tasks that ending ones start, such as a runner's last fill)."""
    while tasks := [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _completed() -> concurrent.futures.Future:
    done = concurrent.futures.Future()
    done.set_result(None)
    return done


def _all_of(futures: list[concurrent.futures.Future]) -> concurrent.futures.Future:
    """A future that completes when every one of ``futures`` has."""
    if not futures:
        return _completed()
    done = concurrent.futures.Future()
    remaining = [len(futures)]
    lock = threading.Lock()

    def one(_: concurrent.futures.Future) -> None:
        with lock:
            remaining[0] -= 1
            last = remaining[0] == 0
        if last:
            done.set_result(None)

    for future in futures:
        future.add_done_callback(one)
    return done
