"""Live rescale of the gateway's workers with ICADD (docs/gateway.md) against the real
broker: file sources in a growing directory while the gateway goes 2 -> 3 -> 1 I/O
threads; every line lands once and in order per file, in the topic and in the view of a
durable pipeline over it (:func:`check_view`), and every source ends on its owner under the
last layout.  :func:`grow_and_rescale` and :func:`check_view` are also the scenario of
``bench/gateway_rescale.py`` (stall and throughput against a stop-the-world rescale)."""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from circuits import Circuit
from circuits.framing import consumer_config
from circuits.layouts import initial, rescale
from dagster_project import cli
from dagster_project.config import HOME_ENV
from gateway.config import FilesSpec, GatewaySpec
from gateway.control import call
from gateway.errors import GatewayError
from gateway.gateway import Gateway
from gateway.icadd import Placement
from sensors.broker import ensure_topics
from sensors.ingest import KafkaSource
from sensors.kafka import KafkaClient
from storage.cursors import CursorStore
from storage.inspect import rows_of_steps
from storage.logs import Range
from storage.pipeline import Pipeline
from tests.gateway.test_gateway import connection_id, lines_in, wait_for_lines, wait_until

LINE = "file int, n bigint, t bigint"
"""A line's columns: ``{"file": i, "n": n, "t": time_ns}``, the ``n``-th line of file ``i``."""


class Writer(threading.Thread):
    """Appends :data:`LINE` lines (JSON), one to each file per round, ``rounds`` rounds per
    second, until stopped; ``written`` keeps them per path."""

    def __init__(self, paths: list[str], rounds: float):
        super().__init__(name="writer", daemon=True)
        self.paths, self.rounds = paths, rounds
        self.written: dict[str, list[bytes]] = {p: [] for p in paths}
        self.halt = threading.Event()

    def round(self) -> None:
        for i, path in enumerate(self.paths):
            line = f'{{"file": {i}, "n": {len(self.written[path])}, "t": {time.time_ns()}}}'.encode()
            with open(path, "ab") as f:
                f.write(line + b"\n")
            self.written[path].append(line)

    def run(self) -> None:
        start = time.monotonic()
        n = 0
        while not self.halt.is_set():
            self.round()
            n += 1
            self.halt.wait(max(0.0, start + n / self.rounds - time.monotonic()))


class Tail(threading.Thread):
    """Reads the topic as it fills: when each line was seen (the time it was delivered)."""

    def __init__(self, bootstrap: str, topic: str, partitions: int):
        super().__init__(name="tail", daemon=True)
        self.consumer = Consumer(consumer_config(bootstrap, {"fetch.wait.max.ms": 5}))
        self.consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        self.seen: list[tuple[int, int, int]] = []
        """(file, written ns, seen ns) per line."""
        self.halt = threading.Event()

    def run(self) -> None:
        try:
            while not self.halt.is_set():
                for m in self.consumer.consume(1000, 0.05):
                    if m.error() is not None:
                        continue
                    now = time.time_ns()
                    self.seen += [
                        (r["file"], r["t"], now) for r in (json.loads(line) for line in m.value().split(b"\n") if line)
                    ]
        finally:
            self.consumer.close()


def grow_and_rescale(
    bootstrap: str,
    root: Path,
    *,
    sources: int = 200,
    sizes: tuple[int, ...] = (2, 3, 1),
    stopped: bool = False,
    rounds: float = 10.0,
    settle: float = 1.0,
) -> dict:
    """``sources`` files growing (``rounds`` lines per second each) through a gateway of
    ``sizes[0]`` I/O threads rescaled to each of ``sizes[1:]`` in turn (ICADD, or stop the
    world when ``stopped``), ``settle`` seconds apart; checks every line is in the topic
    once, in order per file.  Returns the figures: per migration its window, and the lines
    written during the migrations with their write-to-delivery times, and the files moved;
    and for :func:`check_view` the topic and ``cuts``, its end offsets per partition just
    before and just after each migration and at the end."""
    topic = f"gwr-{os.urandom(4).hex()}"
    ensure_topics(bootstrap, {topic: 2}, timeout=5)
    landing = root / "landing"
    landing.mkdir(parents=True)
    paths = [str(landing / f"f{i:05d}.log") for i in range(sources)]
    writer = Writer(paths, rounds)
    writer.round()
    spec = GatewaySpec(buffers=2 * sources + 64, buffer_size=1024, io_threads=sizes[0])
    groups = [
        FilesSpec(kind="files", name="files", topic=topic, directory=str(landing), pattern="*.log", poll_interval=0.02)
    ]
    gateway = Gateway(
        spec,
        groups,
        bootstrap,
        {},
        str(root / "gateway"),
        CursorStore.of_gateway(spec.cursors, str(root / "gateway")),
        timeout=30,
    )
    tail = Tail(bootstrap, topic, 2)
    client = KafkaClient(bootstrap)
    cuts: list[dict[int, int]] = []

    def cut() -> None:
        cuts.append({p: high for (_, p), (_, high) in client.offsets([topic]).items()})

    gateway.start()
    try:
        wait_until(lambda: sum(f["status"] == "running" for f in gateway.status()["sources"].values()) == sources)
        tail.start()
        writer.start()
        time.sleep(settle)
        windows = []
        for size in sizes[1:]:
            cut()
            began = time.time_ns()
            figures = gateway.workers.rescale_stopped(size) if stopped else gateway.rescale(size)["rescale"]
            ended = time.time_ns()
            moved = set(range(sources)) if stopped else {paths.index(k) for k in gateway.workers.moved}
            windows.append((began, ended, figures | {"keys": moved}))
            cut()
            time.sleep(settle)
        writer.halt.set()
        writer.join()
        gateway.flush()
        wait_until(lambda: len(tail.seen) >= sum(map(len, writer.written.values())), timeout=60)
        assert lines_in(bootstrap, topic) == writer.written
        cut()
        placement = Placement(gateway.workers.layout)
        threads = {name: f["thread"] for name, f in gateway.status()["sources"].items() if f["status"] == "running"}
        assert len(threads) == sources and all(placement.worker(n) == t for n, t in threads.items())
        status = gateway.status()
    finally:
        tail.halt.set()
        writer.halt.set()
        gateway.stop()
    tail.join()
    return {
        "windows": windows,
        "seen": tail.seen,
        "paths": paths,
        "lines": sum(map(len, writer.written.values())),
        "status": status,
        "settle": settle,
        "topic": topic,
        "cuts": cuts,
    }


def lines_circuit() -> Circuit:
    """The simplest view over the lines: each line a row (its :data:`LINE` columns)."""
    circuit = Circuit("gateway_lines")
    circuit.input("lines", LINE).output("view")
    return circuit


def check_view(spark, bootstrap: str, result: dict, root: str) -> dict:
    """Runs the topic of a :func:`grow_and_rescale` run through a durable pipeline, the way a
    deployment does (divisions recorded, each step's ranges read and framed by the step
    reader of :mod:`sensors.decode`, persisted, run, checkpointed), one step per stretch
    between its ``cuts``; asserts the view (the integral of the outputs) holds every line
    of every file on disk exactly once, no dead letter, and every file in order: at each
    step's end the view holds a prefix of the file, i.e. a line's step never decreases
    with its line number.  The view is a Z-set, so the step at which a line entered it is
    the only order it has: a line seen before its predecessor, or after its successor,
    breaks the prefix.  Returns the figures: lines, steps, seconds."""
    started = time.perf_counter()
    topic, cuts = result["topic"], result["cuts"]
    ends = [c for i, c in enumerate(cuts) if i == 0 or c != cuts[i - 1]]  # empty steps dropped
    pipeline = Pipeline(spark, root, lines_circuit())
    previous: dict[int, int] = {p: 0 for p in ends[0]}
    for step, end in enumerate(ends):
        pipeline.divisions.record(step, [Range(topic, p, previous[p], end[p]) for p in sorted(end)])
        previous = end
    last = len(ends) - 1
    assert list(pipeline.run_steps(KafkaSource(bootstrap, {"lines": topic}).read, 0, last)) == list(range(len(ends)))
    dead = rows_of_steps(pipeline.inputs.dead_letters_uri, 0, last)
    assert dead == 0, f"{dead} dead letter(s): {pipeline.inputs.dead_letters().limit(3).collect()}"
    changes = Counter()
    for row in pipeline.outputs.read("view", 0, last).collect():
        changes[(row["file"], row["n"], row["t"], row["_step"])] += row["_weight"]
    view = Counter()
    for (f, n, t, _), w in changes.items():
        view[(f, n, t)] += w
    on_disk = Counter()
    for path in result["paths"]:
        with open(path, "rb") as lines:
            on_disk.update((r["file"], r["n"], r["t"]) for r in map(json.loads, lines))
    lost, extra = on_disk - view, +view - on_disk
    assert not lost and not extra, (
        f"view against the files: {len(lost)} line(s) lost (e.g. {sorted(lost)[:3]}), "
        f"{len(extra)} extra or repeated (e.g. {sorted(extra)[:3]})"
    )
    assert all(w == 1 for w in changes.values()), "a line added more than once, or retracted"
    steps: dict[int, list[tuple[int, int]]] = {}
    for f, n, _, step in changes:
        steps.setdefault(f, []).append((n, step))
    out_of_order = {f: s for f, s in steps.items() if [st for _, st in sorted(s)] != sorted(st for _, st in s)}
    assert not out_of_order, (
        f"{len(out_of_order)} file(s) whose lines entered the view out of order, e.g. "
        f"{sorted(next(iter(out_of_order.values())))[:20]} ((line, step))"
    )
    assert len({step for _, _, _, step in changes}) == len(ends), "a step holds no line"
    return {
        "lines": sum(view.values()),
        "steps": len(ends),
        "files": len(steps),
        "seconds": round(time.perf_counter() - started, 1),
    }


@pytest.mark.slow
@pytest.mark.parametrize("sources", [200])
def test_live_rescale_2_3_1_every_line_once_in_order(spark, broker, tmp_path, sources):
    result = grow_and_rescale(broker.bootstrap, tmp_path, sources=sources)
    # In the view too: steps cut just before and just after each migration.
    view = check_view(spark, broker.bootstrap, result, str(tmp_path / "pipeline"))
    assert view["lines"] == result["lines"] and view["files"] == sources and view["steps"] >= 3
    status = result["status"]
    assert [w["worker"] for w in status["workers"]] == [0]
    assert all(w["phase"] == "steady" and w["version"] == 2 for w in status["workers"])
    first, second = (figures for _, _, figures in result["windows"])
    # 2 -> 3 moves about a third of the sources, 3 -> 1 the two thirds on workers 1 and 2.
    assert 0.2 * sources < first["moved"] < 0.5 * sources
    assert 0.5 * sources < second["moved"] < 0.8 * sources
    assert status["migrations"] == [{k: v for k, v in f.items() if k != "keys"} for f in (first, second)]
    # Exactly the files whose owner changed moved, each once.
    w2 = initial(256, 2)
    layouts = [w2, rescale(w2, 3), rescale(rescale(w2, 3), 1)]
    paths = result["paths"]
    for figures, (before, after) in zip((first, second), zip(layouts, layouts[1:])):
        assert figures["keys"] == {
            i for i, p in enumerate(paths) if Placement(before).worker(p) != Placement(after).worker(p)
        }


def test_rescale_is_refused_while_a_migration_runs_and_status_shows_the_workers(broker, tmp_path, monkeypatch, capsys):
    topic = f"gwr-{os.urandom(4).hex()}"
    ensure_topics(broker.bootstrap, {topic: 1}, timeout=5)
    (tmp_path / "landing").mkdir()
    gateway = Gateway(
        GatewaySpec(buffers=16, buffer_size=256, io_threads=1),
        [FilesSpec(kind="files", name="f", topic=topic, directory=str(tmp_path / "landing"))],
        broker.bootstrap,
        {},
        str(tmp_path / "home" / "gateway"),
        CursorStore.of_gateway(
            GatewaySpec(buffers=16, buffer_size=256, io_threads=1).cursors, str(tmp_path / "home" / "gateway")
        ),
        timeout=10,
    )
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "home"))
    gateway.start()
    try:
        gateway.workers._migrating = True
        with pytest.raises(GatewayError, match="a migration is running"):
            call(gateway.control.url, "/rescale?workers=2", timeout=10)
        gateway.workers._migrating = False
        answer = call(gateway.control.url, "/rescale?workers=2", timeout=30)
        assert answer["rescale"]["to"] == 2
        workers = call(gateway.control.url, "/status", timeout=10)["workers"]
        assert [(w["worker"], w["phase"], w["version"], w["whitelist"], w["hold"]) for w in workers] == [
            (0, "steady", 1, 0, 0),
            (1, "steady", 1, 0, 0),
        ]
        capsys.readouterr()
        assert cli.main(["gateway", "rescale", "--workers", "1"]) == 0
        assert "rescaled 2 -> 1 workers (version 2)" in capsys.readouterr().out
        assert cli.main(["gateway", "status"]) == 0
        assert "worker 0: steady, version 2" in capsys.readouterr().out
    finally:
        gateway.stop()


def test_the_executor_adds_a_source_on_a_given_thread_and_grows_and_shrinks_its_loops():
    from gateway.sources import GeneratorSource
    from tests.gateway.test_executor import executor_of, lines

    executor, collector = executor_of(16, 256)
    executor.start()
    try:
        assert executor.add_thread() == 1 and executor.add_thread() == 2
        executor.add(GeneratorSource("g", lines=10), thread=2)
        collector.ended(1)
        assert collector.deliveries[0][4] == "gateway-io-2"
        assert executor.stats()["sources"]["g"]["thread"] == 2
        with pytest.raises(GatewayError, match="I/O thread 3 of 3"):
            executor.add(GeneratorSource("h"), thread=3)
        executor.add(GeneratorSource("endless", rate=100), thread=2)
        with pytest.raises(GatewayError, match=r"[12] source\(s\) on it"):  # "g" may not be forgotten yet
            executor.remove_thread()
        assert executor.remove("endless").result(5) == "stopped"
        executor.remove_thread()
        executor.remove_thread()
        assert executor.stats()["threads"] == 1
        assert [t.name for t in threading.enumerate() if t.name.startswith("gateway-io")] == ["gateway-io-0"]
        with pytest.raises(GatewayError, match="1 thread"):
            executor.remove_thread()
    finally:
        executor.stop()
    assert collector.data["g"] == lines("g", 10)


def test_a_file_its_owner_refuses_for_a_full_pool_is_offered_again_when_there_is_room(broker, tmp_path):
    topic = f"gwr-{os.urandom(4).hex()}"
    ensure_topics(broker.bootstrap, {topic: 1}, timeout=5)
    landing = tmp_path / "landing"
    landing.mkdir()
    for name in ("a", "b", "c"):
        (landing / f"{name}.log").write_bytes(f"{name} 0\n".encode())
    gateway = Gateway(
        GatewaySpec(buffers=3, buffer_size=256, io_threads=2),
        [FilesSpec(kind="files", name="f", topic=topic, directory=str(landing), poll_interval=0.02)],
        broker.bootstrap,
        {},
        str(tmp_path / "gateway"),
        CursorStore.of_gateway(
            GatewaySpec(buffers=3, buffer_size=256, io_threads=2).cursors, str(tmp_path / "gateway")
        ),
        timeout=10,
    )
    gateway.start()
    try:

        def running() -> set[str]:
            return {Path(n).stem for n, f in gateway.status()["sources"].items() if f["status"] == "running"}

        wait_until(lambda: len(running()) == 2)
        time.sleep(0.2)
        assert len(running()) == 2
        (refused,) = {"a", "b", "c"} - running()
        gone = sorted(running())[0]
        (landing / f"{gone}.log").unlink()
        wait_until(lambda: refused in running())
        gateway.flush()
        wait_until(
            lambda: (
                {Path(k).stem: v for k, v in lines_in(broker.bootstrap, topic).items()}
                == {n: [f"{n} 0".encode()] for n in ("a", "b", "c")}
            )
        )
    finally:
        gateway.stop()


def test_generators_stay_where_they_started_and_their_worker_cannot_leave(broker, tmp_path):
    from gateway.config import GeneratorSpec

    topic = f"gwr-{os.urandom(4).hex()}"
    ensure_topics(broker.bootstrap, {topic: 1}, timeout=5)
    gateway = Gateway(
        GatewaySpec(buffers=64, buffer_size=256, io_threads=2),
        [GeneratorSpec(kind="generator", name="g", topic=topic, count=20, lines=10_000, rate=20)],
        broker.bootstrap,
        {},
        str(tmp_path / "gateway"),
        CursorStore.of_gateway(
            GatewaySpec(buffers=64, buffer_size=256, io_threads=2).cursors, str(tmp_path / "gateway")
        ),
        timeout=10,
    )
    gateway.start()
    try:
        wait_until(lambda: sum(f["status"] == "running" for f in gateway.status()["sources"].values()) == 20)
        before = {n: f["thread"] for n, f in gateway.status()["sources"].items()}
        assert gateway.rescale(3)["rescale"]["moved"] == 0
        assert {n: f["thread"] for n, f in gateway.status()["sources"].items()} == before
        with pytest.raises(GatewayError, match="do not move: rescale to 2 workers or more"):
            gateway.rescale(1)
    finally:
        gateway.stop()


def test_a_moving_tcp_connection_is_closed_and_the_device_reconnects_to_its_new_owner(broker, tmp_path):
    import socket

    from gateway.config import TcpSpec

    topic = f"gwr-{os.urandom(4).hex()}"
    ensure_topics(broker.bootstrap, {topic: 1}, timeout=5)
    gateway = Gateway(
        GatewaySpec(buffers=64, buffer_size=256, io_threads=2),
        [TcpSpec(kind="tcp", name="dev", topic=topic, port=0)],
        broker.bootstrap,
        {},
        str(tmp_path / "gateway"),
        CursorStore.of_gateway(
            GatewaySpec(buffers=64, buffer_size=256, io_threads=2).cursors, str(tmp_path / "gateway")
        ),
        timeout=10,
    )
    gateway.start()
    host, port = gateway.status()["listeners"]["dev"].split(":")
    sent: dict[str, list[bytes]] = {}

    def connect() -> tuple[socket.socket, str]:
        device = socket.create_connection((host, int(port)))
        return device, connection_id(gateway, "dev", device.getsockname()[1])

    def send(device: socket.socket, name: str, n: int) -> None:
        lines = [f"{name} {len(sent.setdefault(name, [])) + i}".encode() for i in range(n)]
        device.sendall(b"".join(line + b"\n" for line in lines))
        sent[name] += lines

    try:
        devices = dict(connect() for _ in range(12))
        devices = {name: device for device, name in devices.items()}
        for name, device in devices.items():
            send(device, name, 5)
        wait_until(lambda: sum(f["status"] == "running" for f in gateway.status()["sources"].values()) == 12)
        gateway.flush()
        wait_for_lines(broker.bootstrap, topic, sent)
        on_1 = {n for n, f in gateway.status()["sources"].items() if f["thread"] == 1}
        assert on_1 and len(on_1) < 12
        assert gateway.rescale(1)["rescale"]["moved"] == len(on_1)
        status = gateway.status()["sources"]
        assert {n for n, f in status.items() if f["status"] == "stopped"} == on_1
        for name in on_1:  # the device finds its connection closed...
            devices[name].settimeout(5)
            assert devices[name].recv(10) == b""
            devices[name].close()
            device, new = connect()  # ...and reconnects: the listener places it on its owner
            devices[new] = device
        for name, device in devices.items():
            if name not in on_1:
                send(device, name, 5)
        wait_until(lambda: sum(f["status"] == "running" for f in gateway.status()["sources"].values()) == 12)
        assert all(f["thread"] == 0 for f in gateway.status()["sources"].values() if f["status"] == "running")
        gateway.flush()
        wait_for_lines(broker.bootstrap, topic, sent)
    finally:
        for device in devices.values():
            device.close()
        gateway.stop()
