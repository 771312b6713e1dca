"""The embedded local Kafka broker: Apache Kafka, one KRaft node (broker and controller in
one JVM) with its log on disk.

Its JARs come from Maven (:data:`circuits.jvm.KAFKA`, resolved on first use); its data
directory is formatted once (``kafka.tools.StorageTool format --standalone``), so a
restarted broker keeps every record it acknowledged.  It listens on 127.0.0.1:``port``
for clients and on ``port + 1`` (or a port of its own) for its controller.  It serves the
local default and the tests; production points ``bootstrap.servers`` at a Kafka cluster.
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from typing import TYPE_CHECKING

from circuits.daemon import HOST, Daemon, bindable, free_port, listening, write_if_changed
from circuits.jvm import KAFKA, jars

from .errors import BrokerUnavailableError, SourceError
from .kafka import KafkaClient, unreachable

ASK_SECONDS = 2.0  # a question of ensure_topics' wait

if TYPE_CHECKING:
    from typing_extensions import Self

HEAP = "512m"
_QUORUM = "controller.quorum.bootstrap.servers"
LOG_LEVEL = "WARN"


def _properties(port: int, controller_port: int, data_dir: str) -> str:
    settings = {
        "process.roles": "broker,controller",
        "node.id": "1",
        _QUORUM: f"{HOST}:{controller_port}",
        "listeners": f"PLAINTEXT://{HOST}:{port},CONTROLLER://{HOST}:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://{HOST}:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "log.dirs": data_dir,
        # Topics are created on purpose (ensure_topics); a typo must not create one.
        "auto.create.topics.enable": "false",
        # One node: every internal topic has one replica, and one partition is plenty.
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
    }
    return "".join(f"{key}={value}\n" for key, value in settings.items())


def _java() -> str:
    java_home = os.environ.get("JAVA_HOME")
    java = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java")
    if not java or not os.path.exists(java):
        raise SourceError(
            "the embedded Kafka broker needs Java 17 or newer: install it (apt-get install openjdk-17-jre-headless) or set JAVA_HOME"
        )
    return java


def _cluster_id() -> str:
    """A new KRaft cluster id: a random UUID in URL-safe base64, never starting with ``-``
    (Kafka's own ``Uuid.randomUuid`` draws again there: the format tool would read such an
    id as an option)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


class _Node:
    """The files of one node under ``state_dir``: its settings, Log4j settings and data."""

    def __init__(self, daemon: Daemon, port: int, controller_port: int) -> None:
        self.daemon = daemon
        self.data_dir = daemon.path("data")
        self.config = daemon.path("properties")
        write_if_changed(self.config, _properties(port, controller_port, self.data_dir))
        daemon.write_logging(LOG_LEVEL)

    def command(self) -> list[str]:
        """The node's start command, after formatting its data directory if it is new."""
        classpath = os.pathsep.join(jars(KAFKA))
        java = [_java(), f"-Xmx{HEAP}", "-Djava.awt.headless=true", self.daemon.logging_option, "-cp", classpath]
        if not os.path.exists(os.path.join(self.data_dir, "meta.properties")):
            cluster_id = _cluster_id()
            formatted = subprocess.run(
                [*java, "kafka.tools.StorageTool", "format", "--standalone", "--cluster-id", cluster_id]
                + ["--config", self.config],
                capture_output=True,
                text=True,
                stdin=subprocess.DEVNULL,
            )
            if formatted.returncode != 0:
                raise SourceError(
                    f"cannot format the embedded Kafka broker's log directory {self.data_dir}: "
                    f"{(formatted.stderr or formatted.stdout).strip()[-2000:]}"
                )
        return [*java, "kafka.Kafka", self.config]


def _wait_ready(bootstrap: str, timeout: float, log: str, process: subprocess.Popen | None = None) -> None:
    """Waits until the broker at ``bootstrap`` answers a metadata request; fails early if
    ``process`` (the broker being started) exits."""
    client = KafkaClient(bootstrap, timeout=1)
    deadline = time.monotonic() + timeout
    while True:
        if process is not None and process.poll() is not None:
            raise SourceError(
                f"the embedded Kafka broker for {bootstrap} exited with code {process.returncode} while starting"
                f"{_exit_cause(log)}; see {log}"
            )
        try:
            client.topics()
            return
        except BrokerUnavailableError as error:
            if time.monotonic() > deadline:
                raise unreachable(bootstrap, timeout, f"it did not become ready (see {log})") from error
        time.sleep(0.1)


def _exit_cause(log: str) -> str:
    """The address the node's log says it could not bind, as the cause of its exit, or nothing."""
    with contextlib.suppress(OSError), open(log, errors="replace") as text:
        taken = re.findall(r"failed to bind to (\S+): Address already in use", text.read()[-50_000:])
        if taken:
            return f": {taken[-1]} is in use by another process (stop it, or choose another port)"
    return ""


class LocalBroker:
    """A Kafka node on 127.0.0.1 owned by this process, its data in ``state_dir`` (a new
    temporary directory, removed by :meth:`stop`, when not given).  :meth:`kill` ends it as
    a crash would; :meth:`start` starts it again on the same data and ports."""

    def __init__(self, port: int | None = None, state_dir: str | None = None, timeout: float = 60.0) -> None:
        self.port = port or free_port()
        self.bootstrap = f"{HOST}:{self.port}"
        if listening(self.port):
            raise SourceError(f"cannot start a local Kafka broker: port {self.port} is in use; choose another port")
        self._owned = state_dir is None
        self.state_dir = state_dir or tempfile.mkdtemp(prefix="kafka-")
        self._timeout = timeout
        self._node = _Node(Daemon("kafka", self.port, self.state_dir), self.port, free_port())
        self.process: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        with open(self._node.daemon.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self._node.command(), stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=self.state_dir
            )
        try:
            _wait_ready(self.bootstrap, self._timeout, self._node.daemon.log_path, self.process)
        except BaseException:
            self.kill()
            raise

    def kill(self) -> None:
        """Ends the node with SIGKILL: no shutdown, as a crash."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def stop(self) -> None:
        """Stops the node (and removes its data if this object made the directory)."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()
        if self._owned:
            shutil.rmtree(self.state_dir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc) -> None:
        self.stop()


def _daemon(port: int, state_dir: str) -> Daemon:
    return Daemon("kafka", port, state_dir)


def ensure_local_broker(port: int, state_dir: str, timeout: float = 60.0) -> str:
    """The bootstrap servers of a broker on 127.0.0.1:``port``, starting a detached local
    node there (its controller on ``port + 1``, or a free port when that one is taken, kept in
    its settings; its data, pid and log in ``state_dir``) if no
    healthy one listens (see :class:`circuits.daemon.Daemon`; :func:`stop_local_broker` ends it)."""
    bootstrap = f"{HOST}:{port}"
    daemon = _daemon(port, state_dir)
    node = _Node(daemon, port, _controller_port(daemon, port))
    daemon.ensure(node.command, lambda process: _wait_ready(bootstrap, timeout, daemon.log_path, process))
    return bootstrap


def _controller_port(daemon: Daemon, port: int) -> int:
    """The node's controller port: the one its settings hold (its formatted data names that
    endpoint as the quorum's voter), else ``port + 1`` when nothing holds it, else any free
    port (``port + 1`` may be another process's)."""
    with contextlib.suppress(FileNotFoundError), open(daemon.path("properties")) as settings:
        for line in settings:
            if line.startswith(f"{_QUORUM}="):
                return int(line.rsplit(":", 1)[1])
    return port + 1 if bindable(port + 1) else free_port()


def stop_local_broker(port: int, state_dir: str) -> bool:
    """Stops the broker :func:`ensure_local_broker` started on ``port``; whether one was running.
    Its records stay in ``state_dir`` for the next start."""
    return _daemon(port, state_dir).stop()


def ensure_topics(
    bootstrap_servers: str, topics: dict[str, int], timeout: float = 10.0, config: dict | None = None
) -> None:
    """Creates the missing ones of ``topics`` (name: partition count) and waits until the
    broker serves them: each partition has a leader that answers for its offsets (a topic
    in the metadata may not have one yet); topics that exist already are left as they are."""
    client = KafkaClient(bootstrap_servers, config, timeout)
    existing = client.topics()
    missing = {t: n for t, n in topics.items() if t not in existing}
    client.create_topics(missing)
    # Each question waits briefly, so ``timeout`` is the one deadline for the whole wait.
    asking = KafkaClient(bootstrap_servers, config, min(timeout, ASK_SECONDS))
    deadline = time.monotonic() + timeout
    while (seen := _unserved(asking, missing)) is not None:
        if time.monotonic() > deadline:
            raise SourceError(
                f"topics {sorted(missing)} were created on {bootstrap_servers!r} but were not served within "
                f"{timeout:g} s (last seen: {seen})"
            )
        time.sleep(0.05)


def _unserved(client: KafkaClient, topics: dict[str, int]) -> str | None:
    """Why ``topics`` are not served yet, or None when every partition answers."""
    try:
        partitions = client.topics()
        if short := sorted(t for t, n in topics.items() if partitions.get(t) != n):
            return f"{short} not in the metadata with all their partitions"
        client.offsets(list(topics))
    except SourceError as e:  # a new partition the broker does not serve yet: ask again until the deadline
        return str(e)
    return None
