"""The gateway against the real broker: files and TCP connections land in a topic as whole
records, every line once and in order per source, across a restart from the cursors."""

import gc
import os
import socket
import struct
import time
import warnings

import pytest
from confluent_kafka import Consumer, TopicPartition

from circuits.daemon import free_port
from circuits.framing import consumer_config, gateway_range
from gateway.config import FilesSpec, GatewaySpec, TcpSpec
from gateway.control import call, running_url
from gateway.delivery import acknowledged_since
from gateway.errors import GatewayBrokerError
from gateway.gateway import Gateway
from sensors.broker import ensure_topics
from sensors.decode import read_ranges
from sensors.kafka import KafkaClient
from storage.cursors import CursorStore
from storage.logs import Range


def lines_in(bootstrap: str, topic: str) -> dict[str, list[bytes]]:
    """Every record of ``topic`` per source, framed as the step's reader frames them."""
    partitions = KafkaClient(bootstrap).partitions([topic])[topic]
    consumer = Consumer(consumer_config(bootstrap))
    found: dict[str, list[bytes]] = {}
    try:
        for p in range(partitions):
            _, high = consumer.get_watermark_offsets(TopicPartition(topic, p), 5)
            consumer.assign([TopicPartition(topic, p, 0)])
            position = 0
            while position < high:
                for m in consumer.consume(high - position, 5):
                    position = m.offset() + 1
                    assert gateway_range(m) is not None
                    found.setdefault(m.key().decode(), []).extend(line for line in m.value().split(b"\n") if line)
    finally:
        consumer.close()
    return found


def connection_id(gateway: Gateway, group: str, client_port: int) -> str:
    """The source id the gateway gave the connection from ``client_port``."""
    prefix = f"{group}:127.0.0.1:{client_port}#"
    wait_until(lambda: any(n.startswith(prefix) for n in gateway.status()["sources"]))
    return next(n for n in gateway.status()["sources"] if n.startswith(prefix))


def wait_until(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def wait_for_lines(bootstrap: str, topic: str, expected: dict[str, list[bytes]], timeout: float = 30.0) -> None:
    """Wait until the topic holds exactly ``expected``; on time-out, fail showing the difference."""
    deadline = time.monotonic() + timeout
    while (found := lines_in(bootstrap, topic)) != expected and time.monotonic() < deadline:
        time.sleep(0.05)
    assert found == expected


@pytest.fixture
def topic(broker):
    name = f"gw-{os.urandom(4).hex()}"
    ensure_topics(broker.bootstrap, {name: 2}, timeout=5)
    return name


@pytest.mark.slow
def test_files_and_tcp_land_whole_once_in_order_and_resume_from_cursors(broker, topic, tmp_path):
    landing = tmp_path / "landing"
    landing.mkdir()
    groups = [
        FilesSpec(kind="files", name="files", topic=topic, directory=str(landing), pattern="*.log"),
        TcpSpec(kind="tcp", name="dev", topic=topic, port=0),
    ]
    spec = GatewaySpec(buffers=64, buffer_size=256)
    home = str(tmp_path / "gateway")
    gateway = Gateway(
        spec,
        groups,
        broker.bootstrap,
        {},
        home,
        CursorStore.of_gateway(spec.cursors, home),
        timeout=10,
    )
    gateway.start()
    files = {f"f{i}": landing / f"f{i}.log" for i in range(5)}
    written: dict[str, list[bytes]] = {str(path): [] for path in files.values()}

    def append(path, first: int, count: int) -> None:
        lines = [f'{{"n": {n}, "pad": "{"x" * (n % 40)}"}}'.encode() for n in range(first, first + count)]
        with open(path, "ab") as f:
            f.write(b"\n".join(lines) + b"\n")
        written[str(path)].extend(lines)

    for path in files.values():
        append(path, 0, 50)
    host, port = gateway.status()["listeners"]["dev"].split(":")
    devices = [socket.create_connection((host, int(port))) for _ in range(3)]
    sent = {}
    for i, device in enumerate(devices):
        records = [f'{{"device": {i}, "n": {n}}}'.encode() for n in range(40)]
        # In pieces that split records, as a stream may deliver them.
        data = b"\n".join(records) + b"\n"
        for start in range(0, len(data), 37):
            device.sendall(data[start : start + 37])
        sent[device.getsockname()[1]] = records
    for device in devices:
        device.close()
    wait_until(
        lambda: all(f["status"] == "finished" for n, f in gateway.status()["sources"].items() if n.startswith("dev:"))
    )
    sent = {connection_id(gateway, "dev", port): records for port, records in sent.items()}
    # The files are found by polling their directory, so they may land after the connections.
    wait_for_lines(broker.bootstrap, topic, written | sent)
    assert running_url(home) == gateway.control.url
    figures = call(gateway.control.url, "/flush", timeout=10)
    assert figures["cursor_version"] >= 0

    # Delivered after the last cursor commit: a restart must find these on the broker, not resend them.
    for path in files.values():
        append(path, 50, 20)
    wait_for_lines(broker.bootstrap, topic, written | sent)
    crash(gateway, home)  # it dies without committing its cursors again
    for path in files.values():
        append(path, 70, 30)
    restarted = Gateway(
        spec,
        groups,
        broker.bootstrap,
        {},
        str(tmp_path / "gateway"),
        CursorStore.of_gateway(spec.cursors, str(tmp_path / "gateway")),
        timeout=10,
    )
    restarted.start()
    try:
        wait_until(lambda: sum(f["bytes"] for n, f in restarted.status()["sources"].items()) > 0)
        restarted.flush()
        wait_for_lines(broker.bootstrap, topic, written | sent)
    finally:
        restarted.stop()


@pytest.mark.slow
def test_a_truncated_file_resumes_at_its_generation_after_a_restart(broker, topic, tmp_path):
    """A file truncated and rewritten becomes ``<path>#2``; after a restart the file found
    at that path continues generation 2 at its cursor, rather than being taken for
    generation 1 and read from generation 1's cursor, in the middle of its records."""
    landing = tmp_path / "landing"
    landing.mkdir()
    groups = [FilesSpec(kind="files", name="files", topic=topic, directory=str(landing), pattern="*.log")]
    spec, home = GatewaySpec(buffers=8, buffer_size=256), str(tmp_path / "gateway")
    path = landing / "f.log"
    key = str(path)

    def write(mode: str, first: int, count: int) -> list[bytes]:
        lines = [f'{{"n": {n}}}'.encode() for n in range(first, first + count)]
        with open(path, mode) as f:
            f.write(b"\n".join(lines) + b"\n")
        return lines

    gateway = Gateway(
        spec,
        groups,
        broker.bootstrap,
        {},
        home,
        CursorStore.of_gateway(spec.cursors, home),
        timeout=10,
    )
    gateway.start()
    try:
        before = write("wb", 0, 30)
        wait_for_lines(broker.bootstrap, topic, {key: before})
        after = write("wb", 100, 10)  # shorter than what was read: truncated
        wait_for_lines(broker.bootstrap, topic, {key: before, f"{key}#2": after})
    finally:
        gateway.stop()
    after += write("ab", 110, 40)  # now longer than generation 1 was
    restarted = Gateway(
        spec,
        groups,
        broker.bootstrap,
        {},
        home,
        CursorStore.of_gateway(spec.cursors, home),
        timeout=10,
    )
    restarted.start()
    try:
        wait_until(lambda: len(lines_in(broker.bootstrap, topic).get(f"{key}#2", [])) >= len(after))
        restarted.flush()
        assert lines_in(broker.bootstrap, topic) == {key: before, f"{key}#2": after}
    finally:
        restarted.stop()


def test_a_device_reconnecting_from_a_port_it_used_before_loses_no_line(spark, broker, topic, tmp_path):
    """Two connections one after the other from the same client port, 20 then 10 lines:
    each is a source of its own (its byte ranges start at 0), so the step's reader keeps
    all 30 rather than taking the second connection's lines for a re-send of the first's."""
    spec, home = GatewaySpec(buffers=8, buffer_size=256), str(tmp_path / "gateway")
    gateway = Gateway(
        spec,
        [TcpSpec(kind="tcp", name="dev", topic=topic, port=0)],
        broker.bootstrap,
        {},
        home,
        CursorStore.of_gateway(spec.cursors, home),
        timeout=10,
    )
    gateway.start()
    host, port = gateway.status()["listeners"]["dev"].split(":")
    client_port = free_port()
    try:
        for first, count in ((0, 20), (20, 10)):
            device = socket.socket()
            device.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            device.bind(("127.0.0.1", client_port))
            device.connect((host, int(port)))
            data = b"".join(b'{"n": %d}\n' % n for n in range(first, first + count))
            device.sendall(data)
            size = len(data)
            wait_until(
                lambda size=size: any(
                    f["status"] == "running" and f["bytes"] == size for f in gateway.status()["sources"].values()
                )
            )
            # Reset rather than closed: no TIME_WAIT keeps the port from the next connection.
            device.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            device.close()
            wait_until(lambda: all(f["status"] != "running" for f in gateway.status()["sources"].values()))
        gateway.flush()
    finally:
        gateway.stop()
    high = KafkaClient(broker.bootstrap).offsets([topic])
    ranges = [Range(t, p, 0, end) for (t, p), (_, end) in high.items()]
    decoded = read_ranges(spark, broker.bootstrap, None, ranges, {topic: "n bigint"})
    try:
        assert sorted(r.n for r in decoded.inputs[topic].collect()) == list(range(30))
    finally:
        decoded.unpersist()


def test_the_status_of_a_stopped_gateway_leaves_no_coroutine_unawaited(broker, topic, tmp_path):
    """``dbsp gateway`` prints the figures after the stop (on SIGTERM): asking a closed
    loop for a worker's figures must not leave the coroutine it made behind."""
    gateway = Gateway(
        GatewaySpec(buffers=8, buffer_size=256),
        [TcpSpec(kind="tcp", name="dev", topic=topic, port=0)],
        broker.bootstrap,
        {},
        str(tmp_path / "gateway"),
        CursorStore.of_gateway(GatewaySpec(buffers=8, buffer_size=256).cursors, str(tmp_path / "gateway")),
        timeout=10,
    )
    gateway.start()
    gateway.stop()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        workers = gateway.status()["workers"]
        gc.collect()
    assert [str(w.message) for w in caught if "never awaited" in str(w.message)] == []
    assert [w["phase"] for w in workers] == ["stopped"]


NO_PERIODIC_COMMITS = {"cursor_commit_seconds": 3600, "cursor_commit_bytes": 1 << 40}


def crash(gateway: Gateway, home: str) -> None:
    """The gateway dies as on ``kill -9``: it stops reading and commits nothing more."""
    gateway._stopping.set()
    gateway.delivery.commit_due.set()
    gateway._committer.join()
    gateway.executor.stop()
    gateway.delivery.close()
    gateway.control.stop(home)


def test_a_gateway_that_dies_before_its_first_commit_resends_nothing_after_its_restart(broker, topic, tmp_path):
    """No cursor was ever committed: the restarted gateway reads every partition of its
    topics back from the start and resumes each file where its bytes on the broker end."""
    landing = tmp_path / "landing"
    landing.mkdir()
    groups = [FilesSpec(kind="files", name="files", topic=topic, directory=str(landing), pattern="*.log")]
    spec, home = GatewaySpec(buffers=16, buffer_size=256, **NO_PERIODIC_COMMITS), str(tmp_path / "gateway")
    written: dict[str, list[bytes]] = {}

    def append(path, first: int, count: int) -> None:
        lines = [f'{{"n": {n}}}'.encode() for n in range(first, first + count)]
        with open(path, "ab") as f:
            f.write(b"\n".join(lines) + b"\n")
        written.setdefault(str(path), []).extend(lines)

    gateway = Gateway(
        spec,
        groups,
        broker.bootstrap,
        {},
        home,
        CursorStore.of_gateway(spec.cursors, home),
        timeout=10,
    )
    gateway.start()
    for i in range(4):
        append(landing / f"f{i}.log", 0, 60)
    wait_for_lines(broker.bootstrap, topic, written)
    crash(gateway, home)
    for i in range(4):
        append(landing / f"f{i}.log", 60, 10)
    restarted = Gateway(
        spec,
        groups,
        broker.bootstrap,
        {},
        home,
        CursorStore.of_gateway(spec.cursors, home),
        timeout=10,
    )
    restarted.start()
    try:
        wait_until(
            lambda: all(restarted.status()["sources"].get(p, {}).get("acked") == os.path.getsize(p) for p in written)
        )
        assert lines_in(broker.bootstrap, topic) == written
    finally:
        restarted.stop()


def test_the_cursors_are_committed_without_a_flush(broker, topic, tmp_path):
    landing = tmp_path / "landing"
    landing.mkdir()
    groups = [FilesSpec(kind="files", name="files", topic=topic, directory=str(landing), pattern="*.log")]
    spec = GatewaySpec(buffers=16, buffer_size=256, cursor_commit_seconds=0.2)
    gateway = Gateway(
        spec,
        groups,
        broker.bootstrap,
        {},
        str(tmp_path / "gateway"),
        CursorStore.of_gateway(spec.cursors, str(tmp_path / "gateway")),
        timeout=10,
    )
    gateway.start()
    try:
        path = landing / "f.log"
        path.write_bytes(b"".join(b'{"n": %d}\n' % n for n in range(100)))
        committed = lambda: gateway.cursors.load().positions.get((topic, str(path)))
        wait_until(lambda: committed() == path.stat().st_size)
    finally:
        gateway.stop()


def test_a_restarted_gateway_keeps_the_read_back_offsets_of_partitions_it_wrote_nothing_to(broker, topic, tmp_path):
    """Otherwise its next restart would read those partitions back from their start."""
    landing = tmp_path / "landing"
    landing.mkdir()
    groups = [FilesSpec(kind="files", name="files", topic=topic, directory=str(landing), pattern="*.log")]
    spec, home = GatewaySpec(buffers=32, buffer_size=256), str(tmp_path / "gateway")
    for i in range(20):  # enough files for both partitions of the topic
        (landing / f"f{i}.log").write_bytes(b'{"n": 1}\n')
    gateway = Gateway(
        spec,
        groups,
        broker.bootstrap,
        {},
        home,
        CursorStore.of_gateway(spec.cursors, home),
        timeout=10,
    )
    gateway.start()
    wait_until(
        lambda: (
            len(gateway.status()["sources"]) == 20 and all(f.get("acked") for f in gateway.status()["sources"].values())
        )
    )
    gateway.flush()
    gateway.stop()
    committed = gateway.cursors.load().read_back
    assert {p for _, p in committed} == {0, 1}
    restarted = Gateway(
        spec,
        groups,
        broker.bootstrap,
        {},
        home,
        CursorStore.of_gateway(spec.cursors, home),
        timeout=10,
    )
    restarted.start()
    try:
        restarted.flush()  # nothing new was written: no acknowledgement in this process
    finally:
        restarted.stop()
    assert restarted.cursors.load().read_back == committed


def test_reading_back_names_a_missing_topic_without_creating_it_and_an_absent_broker(broker):
    missing = f"missing-{os.getpid()}-{time.monotonic_ns()}"
    with pytest.raises(GatewayBrokerError, match=f"topic\\(s\\) '{missing}' do not exist"):
        acknowledged_since(broker.bootstrap, None, {}, [missing], timeout=5)
    assert missing not in KafkaClient(broker.bootstrap).topics()  # asking created nothing
    nobody = f"127.0.0.1:{free_port()}"
    with pytest.raises(GatewayBrokerError, match=f"no Kafka broker at bootstrap servers '{nobody}' answered within"):
        acknowledged_since(nobody, None, {}, [missing], timeout=1)


def test_an_idle_notice_during_a_running_flush_flushes_again_once_it_ends():
    """A source may fill a buffer after the running flush passed it; if the notice that came
    meanwhile were dropped, nothing more sent means no later notice, and the bytes would wait."""
    import concurrent.futures

    from gateway.gateway import flush_on_idle

    class Executor:
        def __init__(self):
            self.flushes: list[concurrent.futures.Future] = []

        def flush(self):
            self.flushes.append(concurrent.futures.Future())
            return self.flushes[-1]

    class Delivery:
        def on_idle(self, listener):
            self.notice = listener

    executor, delivery = Executor(), Delivery()
    flush_on_idle(delivery, executor)
    delivery.notice()
    delivery.notice()  # while the first runs: kept
    delivery.notice()  # and coalesced with the one before
    assert len(executor.flushes) == 1
    executor.flushes[0].set_result(None)
    assert len(executor.flushes) == 2
    executor.flushes[1].set_result(None)
    assert len(executor.flushes) == 2  # nothing came meanwhile: no third flush
    delivery.notice()
    assert len(executor.flushes) == 3
