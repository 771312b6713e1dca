"""Local daemons that every process on the machine shares: the embedded Kafka broker and
the embedded Spark Connect server.

A daemon listens on a port of 127.0.0.1.  The first process that needs it starts it
detached (its own session, so it outlives that process and ignores the terminal's
Ctrl-C); its pid and log go to a state directory, so later processes find it running and
:meth:`Daemon.stop` can end it.  One that listens but fails its health check (left by a
crash, or hung) is replaced.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

HOST = "127.0.0.1"


def listening(port: int, host: str = HOST, timeout: float = 1.0) -> bool:
    """Whether anything accepts connections on ``host:port``."""
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=timeout):
        return True
    return False


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


def bindable(port: int) -> bool:
    """Whether a server could listen on ``port`` now (nothing else holds it)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the JVM's server sockets
        try:
            probe.bind((HOST, port))
        except OSError:
            return False
    return True


@contextlib.contextmanager
def locked(path: str) -> Iterator[None]:
    """Holds an exclusive lock on ``path`` (across processes) for the block."""
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


Ready = Callable[["subprocess.Popen | None"], None]
"""Waits until the daemon answers (raising when it does not); given the process being
started, it fails early when that process exits."""


@dataclass(frozen=True)
class Daemon:
    """The daemon ``name`` on 127.0.0.1:``port``, with its pid and log in ``state_dir``."""

    name: str
    port: int
    state_dir: str

    def path(self, suffix: str) -> str:
        return os.path.join(self.state_dir, f"{self.name}-{self.port}.{suffix}")

    @property
    def log_path(self) -> str:
        return self.path("log")

    def write_logging(self, level: str) -> None:
        """Writes the daemon's Log4j 2 settings (:func:`log4j2_properties`), read by a JVM
        started with :attr:`logging_option`."""
        write_if_changed(self.path("log4j2.properties"), log4j2_properties(self.log_path, level))

    @property
    def logging_option(self) -> str:
        return f"-Dlog4j2.configurationFile=file:{self.path('log4j2.properties')}"

    def ensure(
        self, command: list[str] | Callable[[], list[str]], ready: Ready, env: Mapping[str, str] | None = None
    ) -> bool:
        """Starts the daemon with ``command`` (or the one it returns, asked only when starting)
        unless a healthy one listens; whether it started one.

        The lock keeps two processes from both finding the port free and starting two."""
        os.makedirs(self.state_dir, exist_ok=True)
        with locked(self.path("lock")):
            if listening(self.port):
                try:
                    ready(None)
                    return False
                except Exception:
                    self.stop()
            if callable(command):
                command = command()
            with open(self.log_path, "ab") as log:
                process = subprocess.Popen(
                    command,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    start_new_session=True,
                    cwd=self.state_dir,
                    env=None if env is None else {**os.environ, **env},
                )
            with open(self.path("pid"), "w") as pid_file:
                pid_file.write(str(process.pid))
            try:
                ready(process)
            except BaseException:
                _end(process.pid, self.port)
                raise
        return True

    def pid(self) -> int | None:
        with contextlib.suppress(FileNotFoundError, ValueError), open(self.path("pid")) as pid_file:
            return int(pid_file.read())
        return None

    def stop(self) -> bool:
        """Stops the daemon :meth:`ensure` started; whether one was running."""
        pid = self.pid()
        if pid is None:
            return False
        os.remove(self.path("pid"))
        # A daemon that died leaves its pid to be reused: signal only while its port listens.
        if not listening(self.port):
            return False
        _end(pid, self.port)
        return True


def _end(pid: int, port: int, timeout: float = 10.0) -> None:
    """Terminates ``pid`` (killing it if it lingers) and waits for ``port`` to close, so
    that a daemon started next can take it."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        deadline = time.monotonic() + timeout
        while listening(port, timeout=0.2) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not listening(port, timeout=0.2):
            return


LOG_BYTES = 10 * 2**20
LOG_FILES = 3  # kept besides the current one


def write_if_changed(path: str, text: str) -> None:
    # Every process that ensures a daemon writes its settings: rewriting the file each time could let a
    # starting server read it half written.
    with contextlib.suppress(FileNotFoundError), open(path) as f:
        if f.read() == text:
            return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def log4j2_properties(path: str, level: str) -> str:
    """Log4j 2 settings of a JVM daemon: ``level`` and above, into ``path``, rolled over.
    The JVM's own stdout and stderr go to ``path`` too (the daemon's log): both append."""
    return "\n".join(
        [
            f"rootLogger.level = {level}",
            "rootLogger.appenderRef.file.ref = file",
            "appender.file.type = RollingFile",
            "appender.file.name = file",
            f"appender.file.fileName = {path}",
            f"appender.file.filePattern = {path}.%i",
            "appender.file.layout.type = PatternLayout",
            "appender.file.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex",
            "appender.file.policies.type = Policies",
            "appender.file.policies.size.type = SizeBasedTriggeringPolicy",
            f"appender.file.policies.size.size = {LOG_BYTES}",
            "appender.file.strategy.type = DefaultRolloverStrategy",
            f"appender.file.strategy.max = {LOG_FILES}",
            "",
        ]
    )
