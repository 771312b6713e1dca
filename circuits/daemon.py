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

    def ensure(self, command: list[str], ready: Ready, env: Mapping[str, str] | None = None) -> bool:
        """Starts the daemon with ``command`` unless a healthy one listens; whether it started one.

        The lock keeps two processes from both finding the port free and starting two."""
        os.makedirs(self.state_dir, exist_ok=True)
        with locked(self.path("lock")):
            if listening(self.port):
                try:
                    ready(None)
                    return False
                except Exception:
                    self.stop()
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
