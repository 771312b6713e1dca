"""The executor: many sources on one loop, flush on demand, faults, the threaded fallback."""

import asyncio
import socket
import threading
import time

import pytest

from gateway.errors import GatewayConfigError, GatewayError, SourceFailed
from gateway.executor import AsyncSourceExecutor
from gateway.pool import BufferPool
from gateway.sources import (
    DirectoryWatcher,
    GeneratorSource,
    Source,
    SyncGeneratorSource,
    SyncSource,
    TcpListener,
    generated_line,
)


class Collector:
    """A consumer: keeps each source's bytes (checking that ranges follow each other),
    returns every buffer at once, and records statuses."""

    def __init__(self, pool: BufferPool):
        self.pool = pool
        self.data: dict[str, bytearray] = {}
        self.deliveries: list[tuple[str, int, int, float, str]] = []
        self.statuses: list[tuple[str, str]] = []
        self.changed = threading.Condition()

    def deliver(self, source_id, buffer, start, end):
        with self.changed:
            data = self.data.setdefault(source_id, bytearray())
            assert start == len(data) and end - start == buffer.length > 0, (source_id, start, end, len(data))
            data += buffer.filled()
            self.deliveries.append((source_id, start, end, time.monotonic(), threading.current_thread().name))
            self.changed.notify_all()
        self.pool.release(buffer)

    def on_status(self, source_id, status, error):
        with self.changed:
            self.statuses.append((source_id, status))
            self.changed.notify_all()

    def wait(self, condition, timeout: float = 8.0):
        with self.changed:
            assert self.changed.wait_for(condition, timeout), "timed out"

    def flushing(self, executor, condition, timeout: float = 8.0):
        """Waits for ``condition``, asking the executor for partly filled buffers meanwhile
        (as a consumer with nothing to do does)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            executor.flush().result(2)
            with self.changed:
                if condition():
                    return
            time.sleep(0.01)
        raise AssertionError("timed out")

    def ended(self, n: int, status: str = "finished"):
        self.wait(lambda: sum(1 for _, s in self.statuses if s == status) >= n)


def executor_of(buffers: int, size: int, io_threads: int = 1, **options):
    pool = BufferPool(buffers, size)
    collector = Collector(pool)
    executor = AsyncSourceExecutor(pool, collector.deliver, io_threads, on_status=collector.on_status, **options)
    return executor, collector


def lines(source_id: str, n: int, size: int = 64) -> bytes:
    return b"".join(generated_line(source_id, i, size) for i in range(n))


class Memory(Source):
    """A re-readable source of ``data`` that raises ``fault`` once when it reaches
    ``fail_at``, and counts its opens."""

    rereadable = True

    def __init__(
        self, source_id: str, data: bytes, fail_at: int | None = None, fault: Exception | None = None, chunk: int = 10
    ):
        super().__init__(source_id)
        self.data, self.fail_at, self.fault, self.chunk = data, fail_at, fault, chunk
        self._position = 0
        self.opens = 0

    @property
    def position(self):
        return self._position

    def seek(self, position):
        self._position = position

    async def open(self):
        self.opens += 1

    async def fill(self, buffer):
        await asyncio.sleep(0)
        if self.fail_at is not None and self._position >= self.fail_at:
            self.fail_at = None
            raise self.fault
        n = min(len(buffer), self.chunk, len(self.data) - self._position)
        buffer[:n] = self.data[self._position : self._position + n]
        self._position += n
        return n


def test_a_thousand_sources_on_one_loop_deliver_every_byte_in_order():
    executor, collector = executor_of(1100, 4096)
    executor.start()
    try:
        for i in range(1000):
            executor.add(GeneratorSource(f"g{i}", lines=100))
        collector.ended(1000)
        assert [t.name for t in threading.enumerate() if t.name.startswith("gateway-io")] == ["gateway-io-0"]
        stats = executor.stats()
    finally:
        executor.stop()
    assert all(collector.data[f"g{i}"] == lines(f"g{i}", 100) for i in range(1000))
    assert stats["threads"] == 1 and stats["pool"]["in_use"] == 0
    figures = stats["sources"]["g7"]
    assert figures["status"] == "finished" and figures["bytes"] == 6400 and figures["buffers"] == 2


def test_the_pool_refuses_a_source_too_many():
    executor, _ = executor_of(3, 64)
    executor.add(GeneratorSource("a"))
    executor.add(GeneratorSource("b"))
    with pytest.raises(GatewayConfigError, match=r"gateway\.buffers is 3.*at least 4"):
        executor.add(GeneratorSource("c"))
    with pytest.raises(GatewayError, match="already running"):
        executor.add(GeneratorSource("a"))
    executor.stop()
    with pytest.raises(GatewayConfigError, match=r"gateway\.io_threads"):
        AsyncSourceExecutor(BufferPool(2, 64), print, io_threads=0)


def test_flush_delivers_a_partly_filled_buffer_at_once():
    """A slow source fills a large buffer for seconds; nothing is delivered until a flush,
    then its bytes are delivered within a short bound (no timer in the runner)."""
    executor, collector = executor_of(4, 1 << 20)
    executor.start()
    try:
        executor.add(GeneratorSource("slow", rate=50))
        time.sleep(0.3)
        assert collector.deliveries == []  # a partly filled buffer waits for demand
        for _ in range(3):
            asked = time.monotonic()
            executor.flush().result(2)
            source, start, end, at, _ = collector.deliveries[-1]
            assert at - asked < 0.1, f"delivered {at - asked:.3f} s after the flush"
            assert source == "slow" and end - start >= 64
            time.sleep(0.1)
        executor.flush("slow").result(2)
        assert executor.flush("slow").result(2) is None  # nothing new: completes at once
    finally:
        executor.stop()
    n = len(collector.data["slow"]) // 64
    assert collector.data["slow"] == lines("slow", n)


def test_flush_of_a_tcp_source_loses_nothing():
    executor, collector = executor_of(4, 4096)
    executor.start()
    listener = TcpListener("127.0.0.1", 0, executor.add)
    executor.submit(listener.run())
    client = socket.create_connection(listener.address)
    try:
        sent = b""
        for part in (b"one ", b"two ", b"three"):
            client.sendall(part)
            sent += part
            time.sleep(0.02)
            executor.flush().result(2)
            collector.wait(lambda sent=sent: sum(len(d) for d in collector.data.values()) == len(sent))
        client.close()
        collector.ended(1)
    finally:
        executor.stop()
    [(source_id, data)] = collector.data.items()
    assert data == sent and source_id.startswith("tcp:127.0.0.1:")
    assert [end for _, _, end, _, _ in collector.deliveries] == [4, 8, 13]


def test_a_failing_source_is_retried_with_backoff_and_the_others_go_on():
    executor, collector = executor_of(10, 64, backoff=(0.02, 0.05))
    opens: list[float] = []

    class Flaky(Memory):
        async def open(self):
            opens.append(time.monotonic())
            await super().open()
            if len(opens) <= 3:
                raise ConnectionRefusedError("not yet")

    data = bytes(range(200))
    executor.add(Flaky("flaky", data))
    executor.add(GeneratorSource("steady", lines=1000, rate=5000))
    executor.add(Memory("broken", data, fail_at=100, fault=SourceFailed("broken", "HTTP 503")))
    executor.start()
    try:
        collector.wait(
            lambda: len(collector.data.get("flaky", b"")) == 200 and len(collector.data.get("broken", b"")) == 200
        )
        stats = executor.stats()["sources"]
        collector.wait(lambda: ("steady", "finished") in collector.statuses)
    finally:
        executor.stop()
    assert collector.data["steady"] == lines("steady", 1000)
    assert collector.data["flaky"] == data and collector.data["broken"] == data  # resumed at its position
    gaps = [b - a for a, b in zip(opens, opens[1:])]
    # 0.02, 0.04, then 0.05 (the longest); lower bounds only: a loaded machine adds to each
    assert gaps[0] >= 0.019 and gaps[1] >= 0.039 and gaps[2] >= 0.049 and len(gaps) == 3, gaps
    assert stats["flaky"]["errors"] == 3 and stats["flaky"]["last_error"] == "ConnectionRefusedError: not yet"
    assert stats["broken"]["errors"] == 1 and "HTTP 503" in stats["broken"]["last_error"]
    assert ("flaky", "retrying") in collector.statuses and stats["steady"]["errors"] == 0


def test_a_source_that_cannot_restart_ends_failed():
    class Once(Memory):
        restartable = False

    executor, collector = executor_of(4, 64)
    executor.add(Once("once", b"x" * 50, fail_at=20, fault=ConnectionResetError("reset by peer")))
    executor.start()
    try:
        collector.ended(1, "failed")
    finally:
        executor.stop()
    assert collector.data["once"] == b"x" * 20  # what it read before the fault is delivered
    assert executor.stats()["sources"]["once"]["errors"] == 1


def test_sync_sources_run_on_a_thread_each():
    executor, collector = executor_of(20, 256)
    executor.start()
    try:
        for i in range(5):
            executor.add(SyncGeneratorSource(f"s{i}", rate=200))  # endless: running while counted
        deadline = time.monotonic() + 5
        while len(threads := sorted(t.name for t in threading.enumerate() if t.name.startswith("source:"))) < 5:
            assert time.monotonic() < deadline, threads
            time.sleep(0.01)
        collector.flushing(executor, lambda: all(len(collector.data.get(f"s{i}", b"")) >= 640 for i in range(5)))
    finally:
        executor.stop()
    assert threads == [f"source:s{i}" for i in range(5)]
    assert [t for t in threading.enumerate() if t.name.startswith("gateway-io")] == []
    for i in range(5):
        data = collector.data[f"s{i}"]
        assert data == lines(f"s{i}", len(data) // 64 + 1)[: len(data)]


class SyncMemory(SyncSource):
    """A blocking, re-readable source of ``data`` that fails once at ``fail_at``."""

    rereadable = True

    def __init__(self, source_id: str, data: bytes, fail_at: int):
        super().__init__(source_id)
        self.data, self.fail_at, self._position = data, fail_at, 0

    @property
    def position(self):
        return self._position

    def seek(self, position):
        self._position = position

    def fill(self, buffer):
        if self.fail_at is not None and self._position >= self.fail_at:
            self.fail_at = None
            raise OSError("disk hiccup")
        n = min(len(buffer), 7, len(self.data) - self._position)
        buffer[:n] = self.data[self._position : self._position + n]
        self._position += n
        return n


def test_a_failing_sync_source_resumes_at_its_position():
    executor, collector = executor_of(4, 32, backoff=(0.01, 0.01))
    data = bytes(range(200))
    executor.add(SyncMemory("sm", data, fail_at=100))
    executor.start()
    try:
        collector.ended(1)
    finally:
        executor.stop()
    assert collector.data["sm"] == data and executor.stats()["sources"]["sm"]["errors"] == 1


def test_two_io_threads():
    executor, collector = executor_of(60, 512, io_threads=2)
    for i in range(40):  # before start: none ends before all are placed on the least loaded loop
        executor.add(GeneratorSource(f"g{i}", lines=200))
    executor.start()
    try:
        collector.ended(40)
        stats = executor.stats()
    finally:
        executor.stop()
    assert all(collector.data[f"g{i}"] == lines(f"g{i}", 200) for i in range(40))
    assert sorted(s["thread"] for s in stats["sources"].values()) == [0] * 20 + [1] * 20
    assert {name for *_, name in collector.deliveries} == {"gateway-io-0", "gateway-io-1"}


def test_a_truncated_file_restarts_as_a_new_generation_and_a_deleted_one_ends(tmp_path):
    executor, collector = executor_of(10, 64)
    watcher = DirectoryWatcher(str(tmp_path), executor.add, poll_interval=0.01)
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(b"a" * 100)
    b.write_bytes(b"b" * 30)
    executor.start()
    executor.submit(watcher.run())
    try:
        collector.flushing(executor, lambda: len(collector.data.get(str(a), b"")) == 100)
        a.write_bytes(b"new\n")
        collector.flushing(executor, lambda: collector.data.get(f"{a}#2") == b"new\n")
        collector.flushing(executor, lambda: len(collector.data.get(str(b), b"")) == 30)
        with open(b, "ab") as f:
            f.write(b"end")
        b.unlink()
        collector.ended(1, "gone")
    finally:
        executor.stop()
    assert collector.data[str(b)] == b"b" * 30 + b"end"
    assert (str(a), "replaced") in collector.statuses and (str(b), "gone") in collector.statuses
    stats = executor.stats()["sources"]
    assert "truncated to 4 bytes" in stats[str(a)]["last_error"] and stats[f"{a}#2"]["status"] == "stopped"


def test_rewind_reads_again_and_remove_stops_a_source():
    executor, collector = executor_of(6, 16)
    data = bytes(range(100)) * 2

    class Waiting(Memory):
        async def fill(self, buffer):  # after its data, waits for more (as a tailed file)
            if self._position >= len(self.data):
                await asyncio.Event().wait()
            return await super().fill(buffer)

    executor.add(Waiting("m", data))
    executor.start()
    try:
        collector.flushing(executor, lambda: len(collector.data.get("m", b"")) == 200)
        with collector.changed:
            collector.data["m"] = bytearray(data[:50])  # downstream lost everything after byte 50
        executor.rewind("m", 50)
        collector.flushing(executor, lambda: len(collector.data["m"]) == 200)
        assert executor.remove("m").result(2) == "stopped"
    finally:
        executor.stop()
    assert collector.data["m"] == data
    with pytest.raises(GatewayError, match="no source 'm'"):
        executor.flush("m")


def test_flushes_racing_a_tcp_stream_lose_nothing():
    """Flushes in a tight loop while a client streams: a fill cancelled just as its bytes
    arrived must leave them to the next fill."""
    executor, collector = executor_of(4, 4096)
    executor.start()
    listener = TcpListener("127.0.0.1", 0, executor.add)
    executor.submit(listener.run())
    sent = bytes(range(256)) * 8 * 1000  # 2 MB
    client = socket.create_connection(listener.address)

    def stream():
        for i in range(0, len(sent), 1000):
            client.sendall(sent[i : i + 1000])
        client.close()

    writer = threading.Thread(target=stream)
    writer.start()
    try:
        flushes = 0
        while writer.is_alive() or flushes < 100:
            executor.flush().result(2)
            flushes += 1
        collector.ended(1)
    finally:
        writer.join()
        executor.stop()
    [data] = collector.data.values()
    assert len(data) == len(sent) and data == sent
    assert len(collector.deliveries) > 100  # flushes cut buffers short many times
