"""The source interface of the gateway and the provided sources.

A source moves raw bytes into buffers and nothing else: no parsing, no decoding, no
splitting into lines (the asynchronous-sources design's P2); framing and decoding happen downstream.

The contract of :class:`Source` (what the executor relies on):

* ``await open()`` acquires the resources; ``close()`` releases them.  After a fault the
  executor closes the source and, if ``restartable``, opens it again later.
* ``await fill(buffer)`` writes into the memoryview ``buffer`` and returns how many bytes
  it wrote, at least 1; 0 means end of stream.  It waits (without blocking the loop) while
  there is nothing to read.
* ``fill`` is cancellation-safe: when cancelled (a flush, or the executor stopping) it has
  written nothing into the buffer it was given and lost nothing; the bytes it was about to
  read are read by the next ``fill``.  The rule that gives it: take bytes from where they
  come from only after the last ``await`` (a task is cancelled at an ``await`` even when
  what it awaited has just completed), or keep what was taken in the source's own state
  for the next ``fill``.
* ``rereadable`` sources can read their bytes again: ``position`` is the offset of the next
  byte they will read, and ``seek(position)`` before ``open()`` starts them there.

Sources that only have blocking client libraries implement :class:`SyncSource` instead;
:class:`ThreadedSource` runs each on a thread of its own (the asynchronous-sources design's fallback) behind the
same interface.
"""

from __future__ import annotations

import asyncio
import fnmatch
import logging
import os
import queue
import socket
import ssl
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from urllib.parse import urlsplit

from .errors import GatewayConfigError, GatewayError, SourceFailed, SourceGone

log = logging.getLogger(__name__)


class _Base:
    """What sources of both kinds share: an id, whether they can re-read, and seeking."""

    rereadable: bool = False
    """Whether the source can read its bytes again from a ``position``."""
    restartable: bool = True
    """Whether ``open()`` may be called again after a fault to carry on."""

    def __init__(self, source_id: str):
        self.id = source_id

    def close(self) -> None:
        """Releases the source's resources; the source may be opened again."""

    @property
    def position(self) -> int | None:
        """The offset of the next byte a re-readable source reads; None for the others."""
        return None

    def seek(self, position: int) -> None:
        """Starts a re-readable source at ``position``; call it before ``open()``."""
        raise GatewayError(f"source {self.id!r} cannot read its bytes again, so it cannot seek")


class Source(_Base, ABC):
    """A source of raw bytes driven by the executor on an event loop (see the module)."""

    async def open(self) -> None:
        """Acquires the source's resources (a connection, a file)."""

    @abstractmethod
    async def fill(self, buffer: memoryview) -> int:
        """Writes the next bytes into ``buffer``: how many (0 at end of stream)."""


class SourceReplaced(SourceFailed):
    """The source must start over as a new one (a tailed file was truncated below its
    cursor): the executor reports it, delivers what was read, ends the source and adds
    ``successor`` (a new generation with its own id) in its place."""

    def __init__(self, source_id: str, reason: str, successor: Source):
        super().__init__(source_id, reason)
        self.successor = successor


class SyncSource(_Base, ABC):
    """A source whose ``fill`` blocks (a blocking client library); the executor runs each on
    a thread of its own.  The contract is :class:`Source`'s, synchronous; ``close`` may be
    called from another thread while ``fill`` blocks, and should make that ``fill`` return
    or raise."""

    def open(self) -> None:
        """Acquires the source's resources."""

    @abstractmethod
    def fill(self, buffer: memoryview) -> int:
        """Writes the next bytes into ``buffer``, blocking until there are some: how many (0 at end)."""


_STOP = object()


class ThreadedSource(Source):
    """Runs a :class:`SyncSource` on a dedicated thread (one per source, the asynchronous-sources design's
    fallback) behind the async interface.

    The thread fills a scratch buffer of its own and the loop copies the bytes into the
    buffer ``fill`` was given: a cancelled ``fill`` cannot be stopped inside the blocking
    call, so its bytes are kept and handed out by the next ``fill`` (cancellation-safe at
    the cost of one copy).  The position of a re-readable one counts the bytes handed out,
    so that bytes read but not handed out when it closed are read again after a restart.
    """

    def __init__(self, inner: SyncSource):
        super().__init__(inner.id)
        self.inner = inner
        self.rereadable = inner.rereadable
        self.restartable = inner.restartable
        self._position = inner.position
        self._requests: queue.SimpleQueue | None = None
        self._scratch = bytearray()
        self._inflight: asyncio.Future | None = None
        self._ready = memoryview(b"")
        """Bytes a cancelled fill read and the next fill hands out."""

    @property
    def position(self) -> int | None:
        return self._position

    def seek(self, position: int) -> None:
        self.inner.seek(position)
        self._position = position

    async def open(self) -> None:
        if self.rereadable:
            self.inner.seek(self._position)
        self._requests = queue.SimpleQueue()
        threading.Thread(target=self._serve, args=(self._requests,), name=f"source:{self.id}", daemon=True).start()
        await self._submit(self.inner.open)

    async def fill(self, buffer: memoryview) -> int:
        if not self._ready:
            if self._inflight is None:
                if len(self._scratch) < len(buffer):
                    self._scratch = bytearray(len(buffer))
                scratch = memoryview(self._scratch)[: len(buffer)]
                self._inflight = self._submit(lambda: scratch[: self.inner.fill(scratch)])
            try:
                self._ready = await asyncio.shield(self._inflight)
            except asyncio.CancelledError:
                raise  # the blocking fill goes on; the next fill takes its bytes
            except BaseException:
                self._inflight = None
                raise
            self._inflight = None
        n = min(len(buffer), len(self._ready))
        buffer[:n] = self._ready[:n]
        self._ready = self._ready[n:]
        if self._position is not None:
            self._position += n
        return n

    def close(self) -> None:
        # Closing first makes a fill blocked in the client return, so the thread can stop.
        self.inner.close()
        if self._requests is not None:
            self._requests.put(_STOP)
        if self._inflight is not None:
            _discard(self._inflight)
        self._requests = self._inflight = None
        self._ready = memoryview(b"")
        self._scratch = bytearray()  # a fill that outlives close may still write into the old one

    def _submit(self, function: Callable[[], object]) -> asyncio.Future:
        """Runs ``function`` on the source's thread; its result arrives on this loop."""
        future = asyncio.get_running_loop().create_future()
        self._requests.put((function, future))
        return future

    @staticmethod
    def _serve(requests: queue.SimpleQueue) -> None:
        while (request := requests.get()) is not _STOP:
            function, future = request
            try:
                outcome, failed = function(), False
            except BaseException as error:  # handed to the awaiting coroutine
                outcome, failed = error, True
            try:
                future.get_loop().call_soon_threadsafe(_settle, future, outcome, failed)
            except RuntimeError:  # the loop is closed: nobody waits for this any more
                return


def _discard(future: asyncio.Future) -> None:
    """Drops a future nobody will await: cancels it, or takes its exception so asyncio does not
    report it as never retrieved."""
    if not future.cancel() and not future.cancelled():
        future.exception()


def _settle(future: asyncio.Future, outcome: object, failed: bool) -> None:
    if future.done():  # the source was closed meanwhile
        return
    if failed:
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


# -- TCP -------------------------------------------------------------------------------------


class TcpSource(Source):
    """One accepted TCP connection: its bytes, in order, until the peer closes it.

    ``fill`` receives straight into the buffer (``recv_into``): no copy and no buffering in
    user space, so while no buffer is available nothing is read, the socket's receive
    buffer fills and TCP flow control stops the device.  It awaits readability, then
    receives without awaiting again, so a cancelled fill has received nothing (asyncio's
    ``sock_recv_into`` receives in the readiness callback: a fill cancelled after that
    would lose the bytes).  A TCP stream cannot be read again, nor reopened: a fault ends
    the source and the device reconnects.
    """

    restartable = False

    def __init__(self, sock: socket.socket, source_id: str):
        super().__init__(source_id)
        self._sock = sock
        sock.setblocking(False)

    async def fill(self, buffer: memoryview) -> int:
        while True:
            try:
                return self._sock.recv_into(buffer)
            except (BlockingIOError, InterruptedError):
                await self._readable()

    def close(self) -> None:
        self._sock.close()

    async def _readable(self) -> None:
        loop = asyncio.get_running_loop()
        ready = loop.create_future()
        fd = self._sock.fileno()
        loop.add_reader(fd, _resolve_once, ready)
        try:
            await ready
        finally:
            loop.remove_reader(fd)


def _resolve_once(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


class TcpListener:
    """Listens on ``host:port`` (port 0: any free one, see ``address``); each accepted
    connection becomes a :class:`TcpSource` with id
    ``<prefix>:<peer host>:<peer port>#<session>.<n>``, handed to ``on_source`` (the
    executor's ``add``).  A connection that ``on_source`` refuses (a full pool) is closed
    and counted in ``refused``.

    A connection's byte ranges start at 0, and the step's reader drops bytes of a source
    below what it already took; so no two connections may share an id, even when a device
    reconnects from a port it used before.  ``n`` counts this listener's connections and
    ``session`` (the listener's start, in milliseconds since the epoch) tells apart the
    listeners of successive gateway processes.

    The socket is bound on construction; ``await run()`` accepts on the running loop until
    cancelled, then closes the socket.
    """

    def __init__(
        self, host: str, port: int, on_source: Callable[[TcpSource], None], *, prefix: str = "tcp", backlog: int = 1024
    ):
        self._sock = socket.create_server((host, port), backlog=backlog, reuse_port=False)
        self._sock.setblocking(False)
        self._on_source = on_source
        self._prefix = prefix
        self._session = time.time_ns() // 1_000_000
        self._connections = 0
        self.accepted = 0
        self.refused = 0

    @property
    def address(self) -> tuple[str, int]:
        return self._sock.getsockname()[:2]

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                conn, peer = await loop.sock_accept(self._sock)
                self._admit(conn, peer)
        finally:
            self._sock.close()

    def _admit(self, conn: socket.socket, peer: tuple) -> None:
        self._connections += 1
        source = TcpSource(conn, f"{self._prefix}:{peer[0]}:{peer[1]}#{self._session}.{self._connections}")
        try:
            self._on_source(source)
        except GatewayError as error:
            self.refused += 1
            log.warning("refused connection %s: %s", source.id, error)
            conn.close()
        else:
            self.accepted += 1


# -- files -----------------------------------------------------------------------------------


class FileSource(Source):
    """Tails one file from ``position`` (0 unless sought): re-readable, it never ends at end of
    file but waits until it grows.

    Growth has no readiness event in asyncio: the file's :class:`DirectoryWatcher` calls
    ``wake()`` when its size changed (a source without a watcher waits until someone does).
    At end of file the source checks its file: deleted or replaced by another file at the
    same path raises :class:`SourceGone` (every byte of it was read by then: the source reads
    through its open descriptor); a size below the cursor (truncated) raises
    :class:`SourceReplaced` whose successor reads the file from 0 as generation ``n + 1``,
    id ``<path>#<n + 1>``.  A truncation that grows back past the cursor before the source
    looks goes unnoticed, as with ``tail -F``.
    """

    rereadable = True

    def __init__(self, path: str, *, generation: int = 1, watcher: DirectoryWatcher | None = None):
        super().__init__(path if generation == 1 else f"{path}#{generation}")
        self.path = path
        self.generation = generation
        self._watcher = watcher
        self._position = 0
        self._fd: int | None = None
        self._inode: tuple[int, int] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._grown: asyncio.Event | None = None

    @property
    def position(self) -> int:
        return self._position

    def seek(self, position: int) -> None:
        self._position = position

    async def open(self) -> None:
        try:
            self._fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            raise SourceGone(self.id, f"{self.path} was deleted before it could be opened") from None
        stat = os.fstat(self._fd)
        self._inode = (stat.st_dev, stat.st_ino)
        self._loop = asyncio.get_running_loop()
        self._grown = asyncio.Event()

    async def fill(self, buffer: memoryview) -> int:
        while True:
            self._grown.clear()  # before reading: a wake from now on is not missed
            # A regular file's read does not wait on a device for long; at most one buffer.
            n = os.preadv(self._fd, [buffer], self._position)
            if n:
                self._position += n
                return n
            self._check_file()
            await self._grown.wait()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
        self._fd = self._loop = self._grown = None

    def wake(self) -> None:
        """The file changed: a waiting ``fill`` looks again.  Callable from any thread."""
        loop, grown = self._loop, self._grown
        if loop is not None and grown is not None:
            try:
                loop.call_soon_threadsafe(grown.set)
            except RuntimeError:  # its loop is closed: nothing waits
                pass

    def successor(self) -> FileSource:
        """The next generation of this path, read from 0."""
        if self._watcher is not None:
            return self._watcher.successor(self)
        return FileSource(self.path, generation=self.generation + 1)

    def _check_file(self) -> None:
        """At end of file: raises if the file was deleted, replaced or truncated."""
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            stat = None
        if stat is None or (stat.st_dev, stat.st_ino) != self._inode:
            raise SourceGone(
                self.id, f"{self.path} was deleted or replaced; all {self._position} bytes of it were read"
            )
        size = os.fstat(self._fd).st_size
        if size < self._position:
            raise SourceReplaced(
                self.id,
                f"{self.path} was truncated to {size} bytes, below the cursor at {self._position}; "
                f"it is read again from 0 as a new source",
                self.successor(),
            )


def latest_generations(source_ids: Iterable[str], directory: str, pattern: str) -> dict[str, int]:
    """Per path of ``directory`` matching ``pattern``: the latest generation among the
    :class:`FileSource` ids ``source_ids`` (``<path>`` is generation 1, ``<path>#<n>``
    generation n), where it is above 1."""
    latest: dict[str, int] = {}
    for source_id in source_ids:
        path, mark, n = source_id.rpartition("#")
        if not (mark and n.isdigit()) or os.path.exists(source_id):  # a file whose name ends in #n
            continue
        name = os.path.basename(path)
        if os.path.join(directory, name) == path and fnmatch.fnmatchcase(name, pattern):  # as a scan names it
            latest[path] = max(latest.get(path, 1), int(n))
    return latest


class DirectoryWatcher:
    """Finds the files of ``directory`` whose names match ``pattern`` and wakes their sources.

    Every ``poll_interval`` seconds a scan lists the directory and stats its files: a new
    file (or a new file at a known path) becomes a :class:`FileSource` handed to
    ``on_source`` (which may ``seek`` it to a committed cursor before adding it to the
    executor); a file whose size changed, or that disappeared, wakes its source.  This scan
    is the gateway's one timer: the standard library has no file-change notification
    (inotify would need a dependency), so growth is found by looking.  A grown file is seen
    within ``poll_interval`` (the latency this adds); the cost is one ``stat`` per file per
    scan, on the loop.

    A file rotated under another name that also matches ``pattern`` is read again as a new
    file: choose a pattern that excludes rotated names.
    """

    def __init__(
        self,
        directory: str,
        on_source: Callable[[FileSource], None],
        *,
        pattern: str = "*",
        poll_interval: float = 0.05,
        generations: Mapping[str, int] | None = None,
    ):
        """``generations``: each path's latest generation when an earlier run stopped (see
        :func:`latest_generations`); the file found there first continues it, so it resumes
        at that generation's cursor.  A file replaced while no gateway ran cannot be told
        from its predecessor (inodes are not recorded): it resumes at the cursor too, or, if
        it is shorter, is read from 0 as the next generation."""
        if poll_interval <= 0:
            raise GatewayConfigError(
                f"poll_interval of {directory} is {poll_interval}: set sources[i].poll_interval "
                f"to a positive number of seconds"
            )
        self.directory = directory
        self.pattern = pattern
        self.poll_interval = poll_interval
        self._on_source = on_source
        self._lock = threading.Lock()  # successor() is called from the loops of the sources
        self._current: dict[str, FileSource] = {}
        self._seen: dict[str, tuple[tuple[int, int], int]] = {}
        """Per path: (device, inode) and size at the last scan."""
        self._generations: dict[str, int] = {path: n - 1 for path, n in (generations or {}).items()}
        """Per path: its latest generation (kept after the file is gone, so ids are never reused)."""
        self._refused: set[str] = set()
        """Paths whose source was refused (logged once), offered again at every scan."""

    async def run(self) -> None:
        """Scans until cancelled."""
        while True:
            self.scan()
            await asyncio.sleep(self.poll_interval)

    def scan(self) -> None:
        """One look at the directory: new files get sources, changed ones are woken."""
        found = self._list()
        for path in self._seen.keys() - found.keys():
            del self._seen[path]
            self._wake(path)  # deleted: its source finds out at end of file
        for path, (inode, size) in found.items():
            before = self._seen.get(path)
            self._seen[path] = (inode, size)
            if before is None or before[0] != inode:
                if not self._offer(path):
                    del self._seen[path]  # offered again at the next scan, under the same id
            elif before[1] != size:
                self._wake(path)

    def successor(self, source: FileSource) -> FileSource:
        """The next generation of ``source``'s path, which this watcher wakes from now on."""
        with self._lock:
            return self._next_generation(source.path)

    def _list(self) -> dict[str, tuple[tuple[int, int], int]]:
        found = {}
        try:
            entries = list(os.scandir(self.directory))
        except FileNotFoundError:
            return found
        for entry in entries:
            if not fnmatch.fnmatchcase(entry.name, self.pattern):
                continue
            try:
                stat = entry.stat()
            except FileNotFoundError:  # deleted since the listing
                continue
            if entry.is_file():
                found[entry.path] = ((stat.st_dev, stat.st_ino), stat.st_size)
        return found

    def _offer(self, path: str) -> bool:
        """Hands a new file's source to ``on_source``; False if it was refused (a full pool)."""
        with self._lock:
            previous = self._current.get(path)
            source = self._next_generation(path)
        try:
            self._on_source(source)
        except GatewayError as error:
            if path not in self._refused:
                log.warning("file %s waits for room in the gateway: %s", path, error)
            self._refused.add(path)
            with self._lock:
                self._generations[path] -= 1
                if previous is None:
                    del self._current[path]
                else:
                    self._current[path] = previous
            return False
        self._refused.discard(path)
        return True

    def _next_generation(self, path: str) -> FileSource:
        generation = self._generations.get(path, 0) + 1
        self._generations[path] = generation
        source = FileSource(path, generation=generation, watcher=self)
        self._current[path] = source
        return source

    def _wake(self, path: str) -> None:
        with self._lock:
            source = self._current.get(path)
        if source is not None:
            source.wake()


# -- HTTP polling ----------------------------------------------------------------------------


class HttpPollSource(Source):
    """GETs ``url`` every ``interval`` seconds (from the start of one poll to the next); each
    response body is the source's next bytes.  HTTP/1.1 with ``Connection: close``; the body
    is ``Content-Length`` bytes, or everything to the close without it (chunked transfer is
    not supported).  A body larger than the buffer continues in the next fill.  A status
    other than 2xx raises :class:`SourceFailed` naming it.

    Cancellation safety: the request and the response head are read by a task of their own
    that a cancelled ``fill`` leaves running; the body is read with ``StreamReader.read``,
    which takes bytes from the stream only after its last await.  A server silent for
    ``timeout`` seconds (connecting, answering, or in the body) fails the poll.
    """

    def __init__(self, url: str, interval: float, *, source_id: str | None = None, timeout: float = 30.0):
        super().__init__(source_id or url)
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise GatewayConfigError(
                f"url {url!r} of source {self.id!r} is not http(s)://host[:port]/path: set sources[i].url to one"
            )
        if interval <= 0:
            raise GatewayConfigError(
                f"interval of source {self.id!r} is {interval}: set sources[i].interval to a positive number of seconds"
            )
        self.url, self.interval, self.timeout = url, interval, timeout
        self._parts = parts
        self._next_poll = 0.0
        self._head: asyncio.Task | None = None
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._remaining: int | None = None
        """Body bytes still to read; None: read to the close."""
        self._stalled = False

    async def fill(self, buffer: memoryview) -> int:
        while True:
            if self._reader is None:
                await self._next_response()
            if self._remaining == 0:
                self._end_response()
                continue
            data = await self._read(min(len(buffer), self._remaining or len(buffer)))
            if data:
                buffer[: len(data)] = data
                if self._remaining is not None:
                    self._remaining -= len(data)
                return len(data)
            if self._remaining:
                raise SourceFailed(
                    self.id,
                    f"GET {self.url}: the server closed the connection "
                    f"{self._remaining} bytes short of the Content-Length",
                )
            self._end_response()

    def close(self) -> None:
        if self._head is not None:
            _discard(self._head)
            self._head = None
        self._end_response()

    async def _next_response(self) -> None:
        """Waits for the next response's head, in a task a cancelled fill leaves running."""
        if self._head is None:
            self._head = asyncio.ensure_future(self._request())
        try:
            await asyncio.shield(self._head)
        except asyncio.CancelledError:
            raise
        except BaseException:
            self._head = None
            raise
        self._head = None

    async def _read(self, n: int) -> bytes:
        """Up to ``n`` bytes of the body.  Read in this task, not a task of ``wait_for``: a
        result taken by another task is lost when this one is cancelled; a stalled server
        is cut off by a timer instead."""
        timer = asyncio.get_running_loop().call_later(self.timeout, self._cut_off)
        try:
            data = await self._reader.read(n)
        finally:
            timer.cancel()
        if self._stalled:
            raise SourceFailed(self.id, f"GET {self.url}: no bytes of the body for {self.timeout} s")
        return data

    def _cut_off(self) -> None:
        self._stalled = True
        self._writer.transport.abort()

    async def _request(self) -> None:
        """Waits for the poll's time, sends the request and reads the response head."""
        loop = asyncio.get_running_loop()
        await asyncio.sleep(max(0.0, self._next_poll - loop.time()))
        self._next_poll = loop.time() + self.interval
        try:
            reader, writer = await asyncio.wait_for(self._connect(), self.timeout)
        except asyncio.TimeoutError:
            raise SourceFailed(self.id, f"GET {self.url}: no connection within {self.timeout} s") from None
        try:
            status, reason, headers = await asyncio.wait_for(self._read_head(reader, writer), self.timeout)
        except BaseException as error:
            writer.close()
            if isinstance(error, asyncio.TimeoutError):
                raise SourceFailed(self.id, f"GET {self.url}: no response within {self.timeout} s") from None
            raise
        if not 200 <= status < 300:
            writer.close()
            raise SourceFailed(self.id, f"GET {self.url} answered {status} {reason}")
        length = headers.get("content-length")
        self._reader, self._writer = reader, writer
        self._remaining = int(length) if length is not None else None

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        secure = self._parts.scheme == "https"
        port = self._parts.port or (443 if secure else 80)
        return await asyncio.open_connection(
            self._parts.hostname, port, ssl=ssl.create_default_context() if secure else None
        )

    async def _read_head(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> tuple[int, str, dict]:
        target = self._parts.path or "/"
        if self._parts.query:
            target += "?" + self._parts.query
        writer.write(
            f"GET {target} HTTP/1.1\r\nHost: {self._parts.netloc}\r\nConnection: close\r\n"
            f"Accept: */*\r\nUser-Agent: dbsp-gateway\r\n\r\n".encode("latin-1")
        )
        await writer.drain()
        line = (await reader.readline()).decode("latin-1")
        fields = line.split(" ", 2)
        if len(fields) < 2 or not fields[0].startswith("HTTP/") or not fields[1].isdigit():
            raise SourceFailed(self.id, f"GET {self.url}: not an HTTP response: {line[:80]!r}")
        headers = {}
        while header := (await reader.readline()).decode("latin-1").strip():
            name, _, value = header.partition(":")
            headers[name.strip().lower()] = value.strip()
        if headers.get("transfer-encoding", "identity").lower() != "identity":
            raise SourceFailed(
                self.id,
                f"GET {self.url}: the response is {headers['transfer-encoding']}-encoded; "
                f"only Content-Length or read-to-close bodies are supported",
            )
        return int(fields[1]), fields[2].strip() if len(fields) > 2 else "", headers

    def _end_response(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None
        self._remaining = None
        self._stalled = False


# -- generators ------------------------------------------------------------------------------


def generated_line(source_id: str, number: int, size: int) -> bytes:
    """Line ``number`` of a generator: ``<id> <number> xxx…\\n``, ``size`` bytes (or just
    long enough for the id and number)."""
    head = f"{source_id} {number:012d} "
    return (head + "x" * max(0, size - len(head) - 1) + "\n").encode()


class _Lines:
    """The byte stream of a generator: ``lines`` lines (None: endless), at most ``rate``
    lines per second from the first fill on."""

    def __init__(self, source_id: str, lines: int | None, line_size: int, rate: float | None):
        if rate is not None and rate <= 0:
            raise GatewayConfigError(
                f"rate of source {source_id!r} is {rate}: set sources[i].rate to a positive "
                f"number of lines per second, or leave it out"
            )
        self.source_id, self.lines, self.line_size, self.rate = source_id, lines, line_size, rate
        self.number = 0
        self._rest = memoryview(b"")
        self._start: float | None = None

    def take(self, buffer: memoryview, now: float) -> tuple[int, float]:
        """Writes due bytes into ``buffer``: (bytes written, seconds until more are due;
        0 when none will ever be, at the end)."""
        if self._start is None:
            self._start = now
        written = 0
        while written < len(buffer):
            if not self._rest:
                if self.lines is not None and self.number >= self.lines:
                    break
                due = self._due(now)
                if due > 0:
                    return written, due
                self._rest = memoryview(generated_line(self.source_id, self.number, self.line_size))
                self.number += 1
            n = min(len(buffer) - written, len(self._rest))
            buffer[written : written + n] = self._rest[:n]
            self._rest = self._rest[n:]
            written += n
        return written, 0.0

    def _due(self, now: float) -> float:
        if self.rate is None:
            return 0.0
        return self._start + self.number / self.rate - now


class GeneratorSource(Source):
    """Synthetic newline-terminated lines (see :func:`generated_line`): ``lines`` of them
    then end of stream (None: endless), at most ``rate`` lines per second (None: as fast as
    buffers come), waiting with ``asyncio.sleep``."""

    def __init__(self, source_id: str, *, lines: int | None = None, line_size: int = 64, rate: float | None = None):
        super().__init__(source_id)
        self._lines = _Lines(source_id, lines, line_size, rate)

    async def fill(self, buffer: memoryview) -> int:
        loop = asyncio.get_running_loop()
        while True:
            written, wait = self._lines.take(buffer, loop.time())
            if written or not wait:
                return written
            await asyncio.sleep(wait)  # nothing written yet: cancelling here loses nothing


class SyncGeneratorSource(SyncSource):
    """:class:`GeneratorSource` with a blocking ``fill`` (``time.sleep``): the thread-per-source
    baseline."""

    def __init__(self, source_id: str, *, lines: int | None = None, line_size: int = 64, rate: float | None = None):
        super().__init__(source_id)
        self._lines = _Lines(source_id, lines, line_size, rate)
        self._closed = threading.Event()

    def open(self) -> None:
        self._closed.clear()

    def fill(self, buffer: memoryview) -> int:
        while True:
            written, wait = self._lines.take(buffer, time.monotonic())
            if written or not wait:
                return written
            if self._closed.wait(wait):  # a sleep that close() cuts short
                return 0

    def close(self) -> None:
        self._closed.set()
