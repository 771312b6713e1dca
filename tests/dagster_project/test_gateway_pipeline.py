"""The source gateway in front of a pipeline, end to end: a `dbsp gateway` process reads
1,000 TCP connections and a directory of 1,000 growing files into the bids topic; the
sensor flushes it and cuts steps; Dagster runs them; the view holds every bid exactly once,
also after the gateway is killed with SIGKILL mid-run and restarted (file sources)."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import yaml
from dagster import Definitions, instance_for_test

from circuits.daemon import free_port
from circuits.library.nexmark import nexmark_records
from gateway.control import call, running_url
from sensors.kafka import KafkaClient
from storage.inspect import rows_of_steps
from storage.logs import read_steps
from storage.pipeline import status

from .harness import Harness, integral, project_settings

DEVICES = FILES = 1000


@pytest.fixture
def instance():
    with instance_for_test() as instance:
        yield instance


@pytest.fixture
def gateways():
    """The gateway processes a test starts: killed at its end, whatever happened."""
    started: list[GatewayProcess] = []
    yield started
    for gateway in started:
        if gateway.process is not None and gateway.process.poll() is None:
            gateway.kill()


def wait_until(predicate, what, timeout: float = 120.0) -> None:
    """Waits for ``predicate``; ``what`` (or ``what()``) says what the failure lacked."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what() if callable(what) else what}"
        time.sleep(0.2)


class GatewayProcess:
    """``dbsp gateway`` for a configuration, as a user starts it."""

    def __init__(self, config: str, home: str, log: str) -> None:
        self.config, self.home, self.log = config, home, log
        self.process = None

    def start(self) -> None:
        env = {**os.environ, "DBSP_HOME": self.home}
        with open(self.log, "a") as out:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "dagster_project.cli",
                    "--config",
                    self.config,
                    "gateway",
                    "--report-every",
                    "1",
                ],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        wait_until(
            lambda: running_url(os.path.join(self.home, "gateway")) is not None or self.process.poll() is not None,
            "the gateway to start",
        )
        assert self.process.poll() is None, open(self.log).read()

    def status(self) -> dict:
        return call(running_url(os.path.join(self.home, "gateway")), "/status", timeout=10)

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        assert self.process.wait(60) == 0, open(self.log).read()


def lines(rows: list[dict]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


@pytest.mark.slow
def test_a_thousand_connections_and_files_land_exactly_once_across_a_gateway_kill(
    spark_resource, spark, broker, tmp_path, instance, monkeypatch, gateways
):
    home = str(tmp_path / "home")
    monkeypatch.setenv("DBSP_HOME", home)  # the sensor finds the gateway here
    h = Harness(tmp_path, broker.bootstrap, instance, spark=spark_resource)
    landing = tmp_path / "landing"
    landing.mkdir()
    port = free_port()
    settings = project_settings(str(tmp_path / "store"), broker.bootstrap, h.name, spark_resource)
    settings["sources"] = [
        {"kind": "files", "name": "files", "topic": f"{h.name}.bids", "directory": str(landing), "pattern": "*.jsonl"},
        {"kind": "tcp", "name": "devices", "topic": f"{h.name}.bids", "port": port},
    ]
    settings["gateway"] = {"buffers": 2 * (DEVICES + FILES) + 64, "buffer_size": 2048}
    config = tmp_path / "dbsp.yaml"
    config.write_text(yaml.safe_dump(settings))
    gateway = GatewayProcess(str(config), home, str(tmp_path / "gateway.out"))
    gateways.append(gateway)
    gateway.start()

    records = nexmark_records(0, 12_000)
    for handle in ("persons", "auctions"):
        h.send(handle, [json.dumps(r).encode() for r in records[handle]])
        h.produced[handle] += records[handle]
    bids = records["bids"]
    by_device, by_file = bids[: len(bids) // 3], bids[len(bids) // 3 :]

    # 1,000 devices, each a TCP connection sending its bids in pieces that split records.
    sockets = [socket.create_connection(("127.0.0.1", port)) for _ in range(DEVICES)]
    for i, device in enumerate(sockets):
        data = lines(by_device[i::DEVICES])
        for start in range(0, len(data), 100):
            device.sendall(data[start : start + 100])
    for device in sockets:
        device.close()
    h.produced["bids"] += by_device
    devices = lambda: [f for n, f in gateway.status()["sources"].items() if n.startswith("devices:")]
    wait_until(lambda: len(devices()) == DEVICES and all(f["status"] == "finished" for f in devices()), "the devices")
    assert sum(f["bytes"] for f in devices()) == sum(len(lines(by_device[i::DEVICES])) for i in range(DEVICES))

    # 1,000 files growing in rounds; the gateway is killed mid-run and restarted.
    paths = [landing / f"sensor-{i:04d}.jsonl" for i in range(FILES)]
    rounds, runs = 4, []
    acked = lambda: sum(f.get("acked", 0) for n, f in gateway.status()["sources"].items() if n.endswith(".jsonl"))
    for r in range(rounds):
        before = acked()
        for i, path in enumerate(paths):
            mine = by_file[i::FILES]
            with open(path, "ab") as f:
                f.write(lines(mine[r::rounds]))
        h.produced["bids"] += [b for i in range(FILES) for b in by_file[i::FILES][r::rounds]]
        if r == 1:
            # Killed once it delivered part of this round, after its last cursor commit: the
            # restarted gateway must find those bytes on the broker and not send them again.
            wait_until(lambda before=before: acked() > before, "part of the round to be delivered")
            gateway.kill()
            gateway.start()
        result = h.tick()  # flushes the gateway, cuts a step
        for request in result.run_requests:
            runs.append(h.run(int(request.partition_key)))
            assert runs[-1].success

    sizes = {str(p): p.stat().st_size for p in paths}
    behind = lambda: {
        p: (gateway.status()["sources"].get(p), n)
        for p, n in sizes.items()
        if gateway.status()["sources"].get(p, {}).get("acked") != n
    }
    wait_until(lambda: not behind(), lambda: f"every file's bytes to be acknowledged: {list(behind().items())[:3]}")
    figures = gateway.status()
    assert figures["pool"]["in_use"] <= figures["pool"]["buffers"]
    shown = subprocess.run(
        [sys.executable, "-m", "dagster_project.cli", "--config", str(config), "gateway", "status"],
        env={**os.environ, "DBSP_HOME": home},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0 and f"gateway pid {gateway.process.pid}" in shown.stdout, shown.stderr
    assert "waits" in shown.stdout and "sensor-" in shown.stdout
    gateway.stop()
    for request in h.tick().run_requests:  # whatever the last round's step had not yet
        assert h.run(int(request.partition_key)).success
    at = status(h.root)
    assert at.committed_step == at.divided_step
    pipeline = h.pipeline(spark)
    assert rows_of_steps(pipeline.inputs.uri("bids"), 0, at.committed_step) == len(h.produced["bids"])  # each once
    assert rows_of_steps(pipeline.inputs.dead_letters_uri, 0, at.committed_step) == 0
    view = integral(pipeline.outputs.read("bids_by_category", 0, 10**9))
    assert view == h.expected_revenue()
    # What the gateway read for a step reaches the step's materialization.
    metadata = runs[0].get_asset_materialization_events()[0].materialization.metadata
    assert metadata["gateway/sources"].value >= FILES and metadata["gateway/bytes"].value > 0
    assert "| errors |" in metadata["gateway/by_source"].value


def test_the_gateway_rescale_job_moves_the_running_gateway_to_n_workers(spark, broker, tmp_path, monkeypatch):
    from dagster_project.config import parse_project
    from dagster_project.factory import build_definitions
    from gateway.config import FilesSpec, GatewaySpec
    from gateway.gateway import Gateway
    from storage.cursors import CursorStore

    monkeypatch.setenv("DBSP_HOME", str(tmp_path / "home"))
    settings = project_settings(str(tmp_path / "store"), broker.bootstrap, "gw")
    settings["sources"] = [{"kind": "files", "name": "in", "topic": "gw.bids", "directory": str(tmp_path)}]
    defs = build_definitions(parse_project(settings, "test"))
    Definitions.validate_loadable(defs)  # as a code location loads it: op and job names unique
    job = defs.resolve_job_def("gateway_rescale")
    with instance_for_test() as instance:
        missing = job.execute_in_process(
            run_config={"ops": {"rescale_gateway": {"config": {"workers": 2}}}}, instance=instance, raise_on_error=False
        )
        assert not missing.success  # no gateway runs: the error says how to start one
        assert "start one with: dbsp gateway" in str(missing.get_step_failure_events()[0].event_specific_data.error)
        ensure = KafkaClient(broker.bootstrap)
        ensure.create_topics({"gw.bids": 1})
        gateway = Gateway(
            GatewaySpec(buffers=16, buffer_size=256),
            [FilesSpec(**settings["sources"][0])],
            broker.bootstrap,
            {},
            str(tmp_path / "home" / "gateway"),
            CursorStore.of_gateway(
                GatewaySpec(buffers=16, buffer_size=256).cursors, str(tmp_path / "home" / "gateway")
            ),
            timeout=10,
        )
        gateway.start()
        try:
            run = job.execute_in_process(
                run_config={"ops": {"rescale_gateway": {"config": {"workers": 2}}}}, instance=instance
            )
            assert run.success
            assert [w["phase"] for w in gateway.status()["workers"]] == ["steady", "steady"]
        finally:
            gateway.stop()


@pytest.mark.slow
def test_a_gateway_killed_before_its_first_flush_leaves_every_line_once_and_in_order(
    spark_resource, spark, broker, tmp_path, instance, monkeypatch, gateways, capfd
):
    """Files read by a gateway that is killed with SIGKILL before any flush or cursor
    commit; a step is cut while it is down (no flush: said in the sensor's log and the
    step's metadata), it restarts, more steps are cut with its flush: the input log holds
    every line of every file once, each file's lines in order over the steps."""
    home = str(tmp_path / "home")
    monkeypatch.setenv("DBSP_HOME", home)
    landing = tmp_path / "landing"
    landing.mkdir()
    name = "killed"
    sources = [
        {"kind": "files", "name": "files", "topic": f"{name}.bids", "directory": str(landing), "pattern": "*.jsonl"}
    ]
    h = Harness(
        tmp_path,
        broker.bootstrap,
        instance,
        name=name,
        spark=spark_resource,
        project={
            "sources": sources,
            # No cursor commit before the kill: only the broker knows what was delivered.
            "gateway": {
                "buffers": 64,
                "buffer_size": 1024,
                "cursor_commit_seconds": 3600,
                "cursor_commit_bytes": 1 << 40,
            },
        },
    )
    config = tmp_path / "dbsp.yaml"
    config.write_text(yaml.safe_dump(h.settings))
    gateway = GatewayProcess(str(config), home, str(tmp_path / "gateway.out"))
    gateways.append(gateway)
    paths = [landing / f"file-{i:02d}.jsonl" for i in range(8)]
    written = {i: 0 for i in range(len(paths))}

    def append(lines: int) -> None:
        for i, path in enumerate(paths):
            bids = [
                {"auction": i, "bidder": n, "price": n, "channel": "c", "date_time": n}
                for n in range(written[i], written[i] + lines)
            ]
            with open(path, "ab") as f:
                f.write(b"".join(json.dumps(b).encode() + b"\n" for b in bids))
            written[i] += lines

    def delivered() -> bool:
        sources = gateway.status()["sources"]
        return all(sources.get(str(p), {}).get("acked") == p.stat().st_size for p in paths)

    def cut_and_run() -> list:
        runs = [h.run(int(r.partition_key)) for r in h.tick().run_requests]
        assert runs and all(run.success for run in runs)
        return runs

    gateway.start()
    append(150)
    wait_until(delivered, "the files to be delivered")
    gateway.kill()
    capfd.readouterr()
    unflushed = cut_and_run()  # the gateway is down: no flush
    assert "step 0 was cut without the gateway's flush: no gateway runs" in capfd.readouterr().err  # the sensor's log
    metadata = unflushed[0].get_asset_materialization_events()[0].materialization.metadata
    assert "no gateway runs" in metadata["gateway/unflushed_cuts"].value
    append(50)
    gateway.start()
    wait_until(delivered, "the files to be delivered after the restart")
    cut_and_run()
    append(40)
    wait_until(delivered, "the last lines to be delivered")
    cut_and_run()
    gateway.stop()

    at = status(h.root)
    rows = read_steps(spark, h.pipeline(spark).inputs.uri("bids"), 0, at.committed_step).select(
        "auction", "bidder", "_step"
    )
    steps: dict[int, list[tuple[int, int]]] = {}
    for r in rows.collect():
        steps.setdefault(r.auction, []).append((r.bidder, r._step))
    for i, found in steps.items():
        assert sorted(n for n, _ in found) == list(range(written[i])), f"file {i}: every line once"
        in_order = [s for _, s in sorted(found)]
        assert in_order == sorted(in_order), f"file {i}: its lines in order over the steps"
    assert sorted(steps) == list(range(len(paths)))
