"""The provided sources, driven by hand or by the executor: TCP, files, HTTP, generators."""

import asyncio
import socket
import threading
import time

import pytest

from gateway.errors import GatewayConfigError, SourceFailed, SourceGone
from gateway.executor import AsyncSourceExecutor
from gateway.pool import BufferPool
from gateway.sources import (
    DirectoryWatcher,
    FileSource,
    GeneratorSource,
    HttpPollSource,
    SourceReplaced,
    SyncGeneratorSource,
    SyncSource,
    TcpListener,
    TcpSource,
    ThreadedSource,
    generated_line,
    latest_generations,
)

CYCLE = bytes(range(251)) * 8000


def pattern(start: int, n: int) -> bytes:
    """Bytes ``start..start + n`` of an endless test stream (a byte's value tells its place)."""
    if n + 251 > len(CYCLE):
        return b"".join(pattern(start + i, min(1_000_000, n - i)) for i in range(0, n, 1_000_000))
    return CYCLE[start % 251 : start % 251 + n]


async def drain(source, size: int = 4096) -> bytes:
    """Every byte of ``source`` up to its end of stream."""
    out, buffer = bytearray(), bytearray(size)
    while n := await source.fill(memoryview(buffer)):
        out += buffer[:n]
    return bytes(out)


async def fill_once(source, size: int = 4096, timeout: float = 2.0) -> bytes:
    buffer = bytearray(size)
    n = await asyncio.wait_for(source.fill(memoryview(buffer)), timeout)
    return bytes(buffer[:n])


async def accept_one(listener: TcpListener, accepted: list) -> TcpSource:
    while not accepted:
        await asyncio.sleep(0.005)
    return accepted.pop()


# -- TCP -------------------------------------------------------------------------------------


def test_tcp_bytes_arrive_in_order_until_the_peer_closes():
    async def main():
        accepted: list[TcpSource] = []
        listener = TcpListener("127.0.0.1", 0, accepted.append)
        serving = asyncio.create_task(listener.run())
        reader, writer = await asyncio.open_connection(*listener.address)
        data = pattern(0, 1_000_000)
        writer.write(data)
        source = await accept_one(listener, accepted)
        host, port = writer.get_extra_info("sockname")[:2]
        assert source.id.startswith(f"tcp:{host}:{port}#") and listener.accepted == 1
        await source.open()
        await writer.drain()
        writer.close()
        assert await drain(source) == data
        source.close()
        serving.cancel()

    asyncio.run(main())


def test_a_cancelled_tcp_fill_loses_nothing():
    async def main():
        accepted: list[TcpSource] = []
        listener = TcpListener("127.0.0.1", 0, accepted.append)
        serving = asyncio.create_task(listener.run())
        _, writer = await asyncio.open_connection(*listener.address)
        source = await accept_one(listener, accepted)
        await source.open()
        buffer = bytearray(16)
        waiting = asyncio.create_task(source.fill(memoryview(buffer)))
        await asyncio.sleep(0.01)
        writer.write(b"first")
        await writer.drain()
        waiting.cancel()  # cancelled with the bytes possibly ready: they must stay in the socket
        await asyncio.sleep(0.01)
        writer.write(b" second")
        writer.close()
        assert await drain(source) == b"first second" and bytes(buffer) == bytes(16)
        source.close()
        serving.cancel()

    asyncio.run(main())


def test_a_connection_refused_by_a_full_pool_is_closed():
    async def main():
        def full(source):
            raise GatewayConfigError("gateway.buffers is 2, too few")

        listener = TcpListener("127.0.0.1", 0, full)
        serving = asyncio.create_task(listener.run())
        reader, writer = await asyncio.open_connection(*listener.address)
        assert await asyncio.wait_for(reader.read(), 2) == b""  # closed by the gateway
        writer.close()
        assert listener.refused == 1 and listener.accepted == 0
        serving.cancel()

    asyncio.run(main())


def test_tcp_backpressure_blocks_the_writer_and_loses_nothing():
    """A consumer that keeps every buffer: the source stops reading, the client's sends
    block; once buffers come back everything arrives, in order."""
    pool = BufferPool(3, 65536)
    kept, received = [], bytearray()
    lock = threading.Lock()
    releasing = threading.Event()

    def give_back():
        with lock:
            for buffer in kept:
                received.extend(buffer.filled())
                pool.release(buffer)
            kept.clear()

    def deliver(source_id, buffer, start, end):
        with lock:
            assert start == len(received) + sum(b.length for b in kept)
            kept.append(buffer)
        if releasing.is_set():
            give_back()

    executor = AsyncSourceExecutor(pool, deliver)
    executor.start()
    listener = TcpListener("127.0.0.1", 0, executor.add)
    executor.submit(listener.run())
    client = socket.create_connection(listener.address)
    client.setblocking(False)
    sent, blocked_since = 0, None
    try:
        while blocked_since is None or time.monotonic() - blocked_since < 0.5:
            try:
                sent += client.send(pattern(sent, 65536))
                blocked_since = None
            except BlockingIOError:
                blocked_since = blocked_since or time.monotonic()
                time.sleep(0.01)
            assert sent < 200_000_000, "the client never blocked"
        stats = executor.stats()
        assert stats["pool"]["in_use"] == 3 and stats["pool"]["waiting"] == 1
        [figures] = stats["sources"].values()
        assert figures["waits"] >= 1 and figures["held"] == 3
        releasing.set()
        give_back()
        client.setblocking(True)
        client.sendall(pattern(sent, 100_000))
        sent += 100_000
        client.close()
        deadline = time.monotonic() + 5
        while len(received) < sent and time.monotonic() < deadline:
            executor.flush().result(5)
            time.sleep(0.01)
    finally:
        executor.stop()
    assert len(received) == sent and bytes(received) == pattern(0, sent)
    assert sent > 3 * 65536


# -- files -----------------------------------------------------------------------------------


def test_files_are_tailed_and_new_files_found(tmp_path):
    async def main():
        found: list[FileSource] = []
        watcher = DirectoryWatcher(str(tmp_path), found.append, pattern="*.log")
        (tmp_path / "a.log").write_bytes(b"one\n")
        (tmp_path / "skip.txt").write_bytes(b"not matched\n")
        watcher.scan()
        [a] = found
        assert a.id == str(tmp_path / "a.log") and a.rereadable
        await a.open()
        assert await fill_once(a) == b"one\n" and a.position == 4
        waiting = asyncio.create_task(a.fill(memoryview(bytearray(64))))
        await asyncio.sleep(0.05)
        assert not waiting.done()  # at the end of the file: it waits for growth
        with open(tmp_path / "a.log", "ab") as f:
            f.write(b"two\n")
        watcher.scan()
        assert await asyncio.wait_for(waiting, 2) == 4 and a.position == 8
        (tmp_path / "b.log").write_bytes(b"b\n")
        watcher.scan()
        assert [s.id for s in found] == [str(tmp_path / "a.log"), str(tmp_path / "b.log")]
        a.close()

    asyncio.run(main())


def test_a_file_source_resumes_from_a_position(tmp_path):
    async def main():
        (tmp_path / "f").write_bytes(b"0123456789")
        source = FileSource(str(tmp_path / "f"))
        source.seek(4)
        await source.open()
        assert await fill_once(source, size=3) == b"456"
        assert await fill_once(source) == b"789"
        source.close()

    asyncio.run(main())


def test_watched_files_run_by_the_watcher(tmp_path):
    """The watcher's own loop (run) finds growth within its poll interval."""

    async def main():
        found: list[FileSource] = []
        watcher = DirectoryWatcher(str(tmp_path), found.append, poll_interval=0.01)
        (tmp_path / "x").write_bytes(b"x\n")
        watching = asyncio.create_task(watcher.run())
        while not found:
            await asyncio.sleep(0.005)
        await found[0].open()
        assert await fill_once(found[0]) == b"x\n"
        with open(tmp_path / "x", "ab") as f:
            f.write(b"y\n")
        assert await fill_once(found[0]) == b"y\n"
        watching.cancel()
        found[0].close()

    asyncio.run(main())


def test_a_truncated_file_is_reported_and_read_again_as_a_new_generation(tmp_path):
    async def main():
        found: list[FileSource] = []
        watcher = DirectoryWatcher(str(tmp_path), found.append)
        path = tmp_path / "t.log"
        path.write_bytes(b"0123456789\n")
        watcher.scan()
        [source] = found
        await source.open()
        await fill_once(source)
        waiting = asyncio.create_task(source.fill(memoryview(bytearray(64))))
        await asyncio.sleep(0.01)
        path.write_bytes(b"new\n")  # truncated below the cursor, then written
        watcher.scan()
        with pytest.raises(SourceReplaced, match="truncated to 4 bytes, below the cursor at 11") as raised:
            await asyncio.wait_for(waiting, 2)
        successor = raised.value.successor
        assert successor.id == f"{path}#2" and successor.position == 0
        await successor.open()
        assert await fill_once(successor) == b"new\n"
        with open(path, "ab") as f:
            f.write(b"more\n")
        watcher.scan()  # the watcher wakes the successor now
        assert await fill_once(successor) == b"more\n"
        source.close()
        successor.close()

    asyncio.run(main())


def test_a_watcher_continues_the_latest_generation_known_from_cursors(tmp_path):
    directory = str(tmp_path)
    (tmp_path / "b#3").write_bytes(b"")  # a file whose own name ends like a generation
    ids = [
        f"{directory}/a.log",
        f"{directory}/a.log#2",
        f"{directory}/a.log#3",
        f"{directory}/c.log#2",
        f"{directory}/b#3",
        f"{directory}/other.txt#4",
        "/elsewhere/a.log#9",
    ]
    # other.txt does not match *.log, /elsewhere is not watched, b#3 is a file's own name.
    assert latest_generations(ids, directory, "*.log") == {f"{directory}/a.log": 3, f"{directory}/c.log": 2}
    assert latest_generations(ids, directory, "*") == {
        f"{directory}/a.log": 3,
        f"{directory}/c.log": 2,
        f"{directory}/other.txt": 4,
    }
    (tmp_path / "a.log").write_bytes(b"x\n")
    (tmp_path / "d.log").write_bytes(b"y\n")
    found: list[FileSource] = []
    DirectoryWatcher(
        directory, found.append, pattern="*.log", generations=latest_generations(ids, directory, "*.log")
    ).scan()
    assert sorted(s.id for s in found) == [f"{directory}/a.log#3", f"{directory}/d.log"]


def test_a_deleted_file_is_read_to_its_end_then_reported(tmp_path):
    async def main():
        found: list[FileSource] = []
        watcher = DirectoryWatcher(str(tmp_path), found.append)
        path = tmp_path / "d.log"
        path.write_bytes(b"first\n")
        watcher.scan()
        [source] = found
        await source.open()
        await fill_once(source)
        with open(path, "ab") as f:
            f.write(b"last\n")
        path.unlink()
        watcher.scan()
        assert await fill_once(source) == b"last\n"  # its bytes are still read
        with pytest.raises(SourceGone, match="deleted or replaced; all 11 bytes of it were read"):
            await fill_once(source)
        source.close()
        path.write_bytes(b"again\n")  # a new file at the same path: a new generation
        watcher.scan()
        assert found[-1].id == f"{path}#2"

    asyncio.run(main())


# -- HTTP ------------------------------------------------------------------------------------


class TinyHttp:
    """A test HTTP server: ``/ok`` answers ``body`` with a Content-Length, ``/close`` answers
    it to the close, ``/fail`` answers 500, ``/stall`` sends 10 of 100 bytes and falls
    silent; counts the requests."""

    def __init__(self, body: bytes):
        self.body = body
        self.requests = 0

    async def start(self) -> int:
        self.server = await asyncio.start_server(self.serve, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def serve(self, reader, writer):
        try:
            await self.answer(await reader.readuntil(b"\r\n\r\n"), writer)
        finally:
            writer.close()

    async def answer(self, request: bytes, writer):
        self.requests += 1
        path = request.split(b" ")[1]
        if path == b"/stall":
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789")
            await writer.drain()
            await asyncio.sleep(5)
        elif path == b"/fail":
            writer.write(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 4\r\n\r\noops")
        elif path == b"/close":
            writer.write(b"HTTP/1.1 200 OK\r\n\r\n" + self.body)
        else:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(self.body) + self.body)
        await writer.drain()


@pytest.mark.parametrize("path", ["/ok", "/close"])
def test_http_polls_bodies_larger_than_the_buffer(path):
    async def main():
        server = TinyHttp(pattern(0, 10_000))
        port = await server.start()
        source = HttpPollSource(f"http://127.0.0.1:{port}{path}", 0.05)
        await source.open()
        got = bytearray()
        while len(got) < 20_000:
            got += await fill_once(source, size=3000)
        assert bytes(got) == server.body * 2 and server.requests == 2
        started = time.monotonic()
        await fill_once(source)
        assert time.monotonic() - started > 0.02  # the third poll waits for its interval
        source.close()
        server.server.close()

    asyncio.run(main())


def test_http_error_status_fails_the_poll():
    async def main():
        server = TinyHttp(b"")
        port = await server.start()
        source = HttpPollSource(f"http://127.0.0.1:{port}/fail", 0.05)
        await source.open()
        with pytest.raises(SourceFailed, match="answered 500 Internal Server Error"):
            await fill_once(source)
        source.close()
        server.server.close()

    asyncio.run(main())


def test_http_a_stalled_body_fails_the_poll():
    async def main():
        server = TinyHttp(b"")
        port = await server.start()
        source = HttpPollSource(f"http://127.0.0.1:{port}/stall", 1, timeout=0.1)
        await source.open()
        assert await fill_once(source) == b"0123456789"
        with pytest.raises(SourceFailed, match="no bytes of the body for 0.1 s"):
            await fill_once(source)
        source.close()
        server.server.close()

    asyncio.run(main())


def test_http_settings_are_checked():
    with pytest.raises(GatewayConfigError, match=r"sources\[i\]\.url"):
        HttpPollSource("ftp://x/y", 1)
    with pytest.raises(GatewayConfigError, match=r"sources\[i\]\.interval"):
        HttpPollSource("http://x/y", 0)


# -- generators and the threaded fallback ------------------------------------------------


def test_generator_writes_its_lines_then_ends():
    async def main():
        source = GeneratorSource("g", lines=100, line_size=40)
        data = await drain(source, size=333)  # lines split across fills: raw bytes only
        assert data == b"".join(generated_line("g", i, 40) for i in range(100))
        assert len(generated_line("g", 0, 40)) == 40

    asyncio.run(main())


def test_generator_rate():
    async def main():
        started = time.monotonic()
        data = await drain(GeneratorSource("g", lines=20, rate=200))
        assert data.count(b"\n") == 20 and time.monotonic() - started >= 19 / 200

    asyncio.run(main())


def test_sync_generator_behind_a_thread_of_its_own():
    async def main():
        source = ThreadedSource(SyncGeneratorSource("s", lines=50, rate=1000))
        await source.open()
        assert any(t.name == "source:s" for t in threading.enumerate())
        assert await drain(source, size=100) == b"".join(generated_line("s", i, 64) for i in range(50))
        source.close()

    asyncio.run(main())


class Gate(SyncSource):
    """A blocking source: each fill waits for the test to open the gate, then writes ``abc``."""

    def __init__(self):
        super().__init__("gate")
        self.gate = threading.Event()

    def fill(self, buffer):
        self.gate.wait()
        self.gate.clear()
        buffer[:3] = b"abc"
        return 3


def test_a_cancelled_threaded_fill_keeps_its_bytes():
    async def main():
        inner = Gate()
        source = ThreadedSource(inner)
        await source.open()
        first = bytearray(8)
        waiting = asyncio.create_task(source.fill(memoryview(first)))
        await asyncio.sleep(0.01)
        waiting.cancel()
        inner.gate.set()  # the blocking fill completes after its waiter was cancelled
        await asyncio.sleep(0.05)
        assert bytes(first) == bytes(8)  # nothing written into the cancelled fill's buffer
        assert await fill_once(source, size=2) == b"ab"
        assert await fill_once(source, size=2) == b"c"
        inner.gate.set()
        source.close()

    asyncio.run(main())


def test_a_file_refused_by_a_full_pool_is_offered_again_under_the_same_id(tmp_path):
    offered: list[str] = []

    def full_then_room(source):
        offered.append(source.id)
        if len(offered) < 3:
            raise GatewayConfigError("gateway.buffers is 2, too few")

    watcher = DirectoryWatcher(str(tmp_path), full_then_room)
    (tmp_path / "f").write_bytes(b"x")
    for _ in range(4):
        watcher.scan()
    assert offered == [str(tmp_path / "f")] * 3  # accepted at the third scan, then known
