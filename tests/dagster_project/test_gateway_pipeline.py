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
from sensors.broker import local_producer_config
from sensors.kafka import KafkaClient
from sensors.gateway.control import call, running_url
from storage.inspect import rows_of_steps
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
            self.process = subprocess.Popen([sys.executable, "-m", "dagster_project.cli", "--config", self.config, "gateway",
                                             "--report-every", "1"], env=env, stdout=out, stderr=subprocess.STDOUT)
        wait_until(lambda: running_url(os.path.join(self.home, "gateway")) is not None or self.process.poll() is not None,
                   "the gateway to start")
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
    # The test broker is tansu: its watermark counts one message per produced batch.
    settings["resources"]["kafka"]["config"] = {k: str(v) for k, v in local_producer_config().items()}
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
    by_device, by_file = bids[: len(bids) // 3], bids[len(bids) // 3:]

    # 1,000 devices, each a TCP connection sending its bids in pieces that split records.
    sockets = [socket.create_connection(("127.0.0.1", port)) for _ in range(DEVICES)]
    for i, device in enumerate(sockets):
        data = lines(by_device[i::DEVICES])
        for start in range(0, len(data), 100):
            device.sendall(data[start:start + 100])
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
            wait_until(lambda: acked() > before, "part of the round to be delivered")
            gateway.kill()
            gateway.start()
        result = h.tick()  # flushes the gateway, cuts a step
        for request in result.run_requests:
            runs.append(h.run(int(request.partition_key)))
            assert runs[-1].success

    sizes = {str(p): p.stat().st_size for p in paths}
    behind = lambda: {p: (gateway.status()["sources"].get(p), n) for p, n in sizes.items()
                      if gateway.status()["sources"].get(p, {}).get("acked") != n}
    wait_until(lambda: not behind(), lambda: f"every file's bytes to be acknowledged: {list(behind().items())[:3]}")
    figures = gateway.status()
    assert figures["pool"]["in_use"] <= figures["pool"]["buffers"]
    shown = subprocess.run([sys.executable, "-m", "dagster_project.cli", "--config", str(config), "gateway", "status"],
                           env={**os.environ, "DBSP_HOME": home}, capture_output=True, text=True, timeout=60)
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
    from sensors.gateway.config import FilesSpec, GatewaySpec
    from sensors.gateway.gateway import Gateway

    monkeypatch.setenv("DBSP_HOME", str(tmp_path / "home"))
    settings = project_settings(str(tmp_path / "store"), broker.bootstrap, "gw")
    settings["sources"] = [{"kind": "files", "name": "in", "topic": "gw.bids", "directory": str(tmp_path)}]
    defs = build_definitions(parse_project(settings, "test"))
    Definitions.validate_loadable(defs)  # as a code location loads it: op and job names unique
    job = defs.resolve_job_def("gateway_rescale")
    with instance_for_test() as instance:
        missing = job.execute_in_process(run_config={"ops": {"rescale_gateway": {"config": {"workers": 2}}}},
                                         instance=instance, raise_on_error=False)
        assert not missing.success  # no gateway runs: the error says how to start one
        assert "start one with: dbsp gateway" in str(missing.get_step_failure_events()[0].event_specific_data.error)
        ensure = KafkaClient(broker.bootstrap)
        ensure.create_topics({"gw.bids": 1})
        gateway = Gateway(GatewaySpec(buffers=16, buffer_size=256), [FilesSpec(**settings["sources"][0])],
                          broker.bootstrap, local_producer_config(), str(tmp_path / "home" / "gateway"), timeout=10)
        gateway.start()
        try:
            run = job.execute_in_process(run_config={"ops": {"rescale_gateway": {"config": {"workers": 2}}}},
                                         instance=instance)
            assert run.success
            assert [w["phase"] for w in gateway.status()["workers"]] == ["steady", "steady"]
        finally:
            gateway.stop()
