"""The gateway's I/O buffer pool (the asynchronous-sources design's ``BufferManager``, I/O side only).

A fixed number of fixed-size :class:`Buffer` objects, allocated once and separate from
everything else, so that sources and their consumers never compete with other work for
memory (the asynchronous-sources design's P3).  Sources must be registered; a source asks for one buffer at a
time and awaits it (an asyncio future resolved by a release: no polling, no timers).

Definitions and rules:

* A source *holds* a buffer from its grant until the consumer releases it (a delivered
  buffer is still held by its source until then).
* The *reserve* is one buffer for every registered source that holds none.  Invariant:
  there are more buffers than registered sources, so at least one buffer is never part of
  the reserve; registering a source that would break it is refused.
* *Spare* buffers are the free buffers beyond the reserve.
* A request of a source that holds nothing can be served by any free buffer (its own
  reserve); a request of a source that holds buffers can be served only by a spare one.
  A fast source therefore buffers as much as is spare under low load, but never takes
  the buffers that slow sources need to make progress.
* Requests wait in one FIFO queue, ordered by arrival; a release serves the first waiting
  request that can be served.  Waiting requests of holders all need a spare buffer, so
  none of them can pass another; a source holding nothing is served from its reserve even
  when holders that arrived earlier still wait for a spare buffer (it never waits behind
  them).  Hence between a request and its grant no other source is served twice, except
  from its reserve (a source whose every buffer came back in the meantime).
* A source that registers while the spare buffers are held may find its reserve on loan:
  its first request then waits until a buffer comes back, and from then on the reserve is
  kept.

The pool may be shared by several I/O threads, each with its own event loop: its state
is guarded by a lock, and a waiting request is resolved on the loop it was made on.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import threading
import time
from dataclasses import dataclass

from .errors import GatewayConfigError, GatewayError

HOLDER, EMPTY = "holder", "empty"
"""Which queue a waiting request sits in: its source holds buffers, or holds none."""


class Buffer:
    """One buffer of the pool: ``data`` (fixed size), of which the first ``length`` bytes
    are filled; ``source`` is the id of the source holding it (None while free)."""

    __slots__ = ("data", "length", "source", "_account", "_pool")

    def __init__(self, size: int, pool: BufferPool):
        self.data = bytearray(size)
        self._pool = pool
        self.length = 0
        self.source: str | None = None
        self._account: _Account | None = None

    @property
    def full(self) -> bool:
        return self.length == len(self.data)

    def view(self) -> memoryview:
        """The unfilled part, for a source to write into."""
        return memoryview(self.data)[self.length :]

    def filled(self) -> memoryview:
        """The filled part, ``data[:length]``."""
        return memoryview(self.data)[: self.length]

    def _reset(self) -> None:
        self.length = 0
        self.source = None
        self._account = None


@dataclass(eq=False)
class _Account:
    """A registered source's standing with the pool and its figures."""

    source_id: str
    held: int = 0
    acquired: int = 0
    waits: int = 0
    wait_seconds: float = 0.0
    request: _Request | None = None
    """The source's waiting request (one at most)."""
    registered: bool = True


@dataclass(eq=False)
class _Request:
    """A waiting request: resolved with ``buffer`` on ``loop`` once granted."""

    account: _Account
    seq: int
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    since: float
    queue: str
    buffer: Buffer | None = None


class BufferPool:
    """``buffers`` buffers of ``buffer_size`` bytes each, lent to registered sources."""

    def __init__(self, buffers: int, buffer_size: int):
        if buffer_size < 1:
            raise GatewayConfigError(f"gateway.buffer_size is {buffer_size}: set it to a positive number of bytes")
        if buffers < 2:
            raise GatewayConfigError(
                f"gateway.buffers is {buffers}: the pool needs more buffers than sources; set it to at least 2"
            )
        self.buffers = buffers
        self.buffer_size = buffer_size
        self._free = [Buffer(buffer_size, self) for _ in range(buffers)]
        self._accounts: dict[str, _Account] = {}
        self._idle = 0
        """Registered sources holding no buffer: the size of the reserve."""
        # Two heaps of (arrival, request) make the one FIFO queue: the first servable
        # request is the earlier of the two heads that can be served.  A request whose
        # source's last buffer comes back moves to the EMPTY heap keeping its arrival.
        self._queues: dict[str, list[tuple[int, _Request]]] = {HOLDER: [], EMPTY: []}
        self._arrivals = itertools.count()
        self._lock = threading.Lock()

    def register(self, source_id: str) -> None:
        """Admits a source; refused when the pool would no longer have more buffers than sources."""
        with self._lock:
            if source_id in self._accounts:
                raise GatewayError(f"source {source_id!r} is already registered with the buffer pool")
            sources = len(self._accounts) + 1
            if sources >= self.buffers:
                raise GatewayConfigError(
                    f"gateway.buffers is {self.buffers}, too few for {sources} sources: the pool keeps one "
                    f"buffer in reserve for every source and needs more buffers than sources; set "
                    f"gateway.buffers to at least {sources + 1}"
                )
            self._accounts[source_id] = _Account(source_id)
            self._idle += 1

    def unregister(self, source_id: str) -> None:
        """Removes a source with no waiting request; buffers it still holds come back by release."""
        with self._lock:
            account = self._account(source_id)
            if account.request is not None:
                raise GatewayError(f"source {source_id!r} still waits for a buffer: cancel its acquire first")
            del self._accounts[source_id]
            account.registered = False
            if account.held == 0:
                self._idle -= 1
            granted = self._dispatch()  # its reserve may now be spare for a waiting holder
        self._resolve(granted)

    async def acquire(self, source_id: str) -> Buffer:
        """A buffer for ``source_id``, as soon as the rules allow; cancelling the wait is safe."""
        loop = asyncio.get_running_loop()
        with self._lock:
            account = self._account(source_id)
            if account.request is not None:
                raise GatewayError(
                    f"source {source_id!r} asked for a buffer while its previous request still waits: "
                    f"a source has one outstanding request at a time"
                )
            # No waiting request is servable (every change dispatches), so serving this one at
            # once cannot pass a request that could have been served before it.
            if self._servable(account):
                return self._take(account)
            request = _Request(
                account,
                next(self._arrivals),
                loop,
                loop.create_future(),
                time.monotonic(),
                HOLDER if account.held else EMPTY,
            )
            account.request = request
            account.waits += 1
            heapq.heappush(self._queues[request.queue], (request.seq, request))
        try:
            return await request.future
        except asyncio.CancelledError:
            self._withdraw(request)
            raise

    def release(self, buffer: Buffer) -> None:
        """Returns a held buffer; thread-safe, callable from any thread or loop."""
        with self._lock:
            if buffer._pool is not self or buffer._account is None:
                raise GatewayError("released a buffer that is not checked out of this pool")
            self._return(buffer)
            granted = self._dispatch()
        self._resolve(granted)

    def stats(self) -> dict:
        """Figures: ``buffers``, ``buffer_size``, ``in_use``, ``free``, ``reserved`` (free
        buffers kept for sources holding none), ``waiting`` (requests), and per source in
        ``sources``: ``held``, ``acquired``, ``waits`` (requests that had to wait) and
        ``wait_seconds`` (their total wait)."""
        with self._lock:
            free = len(self._free)
            return {
                "buffers": self.buffers,
                "buffer_size": self.buffer_size,
                "in_use": self.buffers - free,
                "free": free,
                "reserved": min(self._idle, free),
                "waiting": sum(1 for a in self._accounts.values() if a.request is not None),
                "sources": {a.source_id: _figures(a) for a in self._accounts.values()},
            }

    def source_stats(self, source_id: str) -> dict:
        """One registered source's figures, as in :meth:`stats`."""
        with self._lock:
            return _figures(self._account(source_id))

    # -- under the lock --------------------------------------------------------------------

    def _account(self, source_id: str) -> _Account:
        account = self._accounts.get(source_id)
        if account is None:
            raise GatewayError(f"source {source_id!r} is not registered with the buffer pool")
        return account

    def _spare(self) -> int:
        return len(self._free) - self._idle

    def _servable(self, account: _Account) -> bool:
        return bool(self._free) and (account.held == 0 or self._spare() >= 1)

    def _take(self, account: _Account) -> Buffer:
        buffer = self._free.pop()
        buffer.source = account.source_id
        buffer._account = account
        if account.held == 0 and account.registered:
            self._idle -= 1
        account.held += 1
        account.acquired += 1
        return buffer

    def _return(self, buffer: Buffer) -> None:
        account = buffer._account
        buffer._reset()
        self._free.append(buffer)
        account.held -= 1
        if account.held == 0 and account.registered:
            self._idle += 1
            request = account.request
            if request is not None and request.queue == HOLDER:
                request.queue = EMPTY  # served from its reserve now, in its place of arrival
                heapq.heappush(self._queues[EMPTY], (request.seq, request))

    def _head(self, queue: str) -> _Request | None:
        """The first live request of a queue; entries left behind by moves and withdrawals go."""
        heap = self._queues[queue]
        while heap:
            request = heap[0][1]
            if request.account.request is request and request.queue == queue:
                return request
            heapq.heappop(heap)
        return None

    def _dispatch(self) -> list[_Request]:
        """Serves waiting requests in FIFO order while any can be served."""
        granted = []
        while self._free:
            candidates = [r for r in (self._head(EMPTY), self._head(HOLDER)) if r and self._servable(r.account)]
            if not candidates:
                break
            request = min(candidates, key=lambda r: r.seq)
            heapq.heappop(self._queues[request.queue])
            request.account.request = None
            request.account.wait_seconds += time.monotonic() - request.since
            request.buffer = self._take(request.account)
            granted.append(request)
        return granted

    # -- outside the lock ------------------------------------------------------------------

    def _resolve(self, granted: list[_Request]) -> None:
        """Hands each granted buffer to its waiter, on the waiter's loop."""
        for request in granted:
            if _running_loop() is request.loop:
                _set_result(request)
                continue
            try:
                request.loop.call_soon_threadsafe(_set_result, request)
            except RuntimeError:  # its loop is closed: nobody will take the buffer
                self._withdraw(request)

    def _withdraw(self, request: _Request) -> None:
        """The waiter is gone: drops its request, or gives back the buffer granted to it."""
        with self._lock:
            if request.buffer is None:
                if request.account.request is request:
                    request.account.request = None
                return
            self._return(request.buffer)
            granted = self._dispatch()
        self._resolve(granted)


def _figures(account: _Account) -> dict:
    return {
        "held": account.held,
        "acquired": account.acquired,
        "waits": account.waits,
        "wait_seconds": account.wait_seconds,
    }


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _set_result(request: _Request) -> None:
    # A cancelled waiter gives the buffer back itself (acquire's except clause).
    if not request.future.done():
        request.future.set_result(request.buffer)
