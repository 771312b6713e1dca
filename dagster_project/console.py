"""What a long ``dbsp`` command shows on the terminal, and where everything else goes.

Two parts:

- :func:`output_to_log` points the process's file descriptors 1 and 2 at a log file.  At
  the descriptor level, not ``sys.stdout``: that catches every writer at once, Dagster's
  console logger (a handler on ``sys.stderr`` made per run), python ``logging`` handlers,
  PySpark's and py4j's prints, and any child process that inherits them.  The terminal
  stays reachable through a duplicate of the original descriptor, which only
  :class:`Progress` writes to.
- :class:`Progress` draws a live status line (a spinner, the phase, its seconds) with
  ``rich`` when that duplicate is a terminal, and prints only the permanent lines
  otherwise (tests, CI, a pipe), so that those logs carry no animation.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Iterator
from typing import IO

from rich.console import Console
from rich.progress import Progress as RichProgress
from rich.progress import SpinnerColumn, TextColumn, TimeElapsedColumn


def log_path(directory: str, command: str) -> str:
    """A new log file's path, ``<directory>/<command>-<local time>.log``."""
    os.makedirs(directory, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = os.path.join(directory, f"{command}-{stamp}.log")
    n = 1
    while os.path.exists(path):  # two runs in one second
        n += 1
        path = os.path.join(directory, f"{command}-{stamp}-{n}.log")
    return path


@contextlib.contextmanager
def output_to_log(path: str, echo: bool = False, until_exit: bool = False) -> Iterator[IO[str]]:
    """Sends everything written to descriptors 1 and 2 to ``path`` (and, with ``echo``, to
    the terminal as well) for the block; yields a text stream on the original stdout.
    With ``until_exit`` (and no ``echo``) they stay on the log after the block: a client's
    threads may still write (Spark Connect's releases of a failed query warn), and the
    terminal's last line is the command's own."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    saved = os.dup(1), os.dup(2)
    terminal = os.fdopen(os.dup(saved[0]), "w", buffering=1)
    with open(path, "ab", buffering=0) as log:
        tee = _Tee(log, saved[0]) if echo else None
        target = tee.write_fd if tee else log.fileno()
        os.dup2(target, 1)
        os.dup2(target, 2)
        try:
            yield terminal
        finally:
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
            if tee or not until_exit:
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
            if tee:
                tee.close()
            for fd in saved:
                os.close(fd)
            terminal.close()


class _Tee:
    """A pipe whose bytes a thread copies to the log and to the terminal (``--verbose``)."""

    def __init__(self, log: IO[bytes], terminal_fd: int) -> None:
        self._read, self.write_fd = os.pipe()
        self._thread = threading.Thread(target=self._copy, args=(log, terminal_fd), daemon=True)
        self._thread.start()

    def _copy(self, log: IO[bytes], terminal_fd: int) -> None:
        while chunk := os.read(self._read, 65536):
            log.write(chunk)
            os.write(terminal_fd, chunk)

    def close(self) -> None:
        # fds 1 and 2 were pointed back already: closing the last write end ends the copy
        # (a child that still holds the pipe, such as a daemon, would keep it open, so the
        # wait is bounded).
        os.close(self.write_fd)
        self._thread.join(timeout=5)
        os.close(self._read)


class Progress:
    """Permanent lines, and a live line for the phase under way (only on a terminal)."""

    def __init__(self, stream: IO[str], live: bool | None = None, mirror: IO[str] | None = None) -> None:
        self.mirror = mirror  # the log file gets the permanent lines too, so it reads whole
        self.console = Console(file=stream, highlight=False, markup=False, soft_wrap=True)
        self.live = self.console.is_terminal if live is None else live
        self._bar = (
            RichProgress(
                SpinnerColumn(),
                TextColumn("{task.description}", markup=False),
                TimeElapsedColumn(),
                # Rich would otherwise swap sys.stdout/err for proxies that print on the terminal,
                # taking back what output_to_log sent to the log.
                console=self.console,
                transient=True,
                redirect_stdout=False,
                redirect_stderr=False,
            )
            if self.live
            else None
        )
        self._task = None

    def __enter__(self) -> Progress:
        if self._bar:
            self._bar.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._bar:
            self._bar.stop()

    def line(self, text: str = "") -> None:
        """A line that stays (printed above the live line)."""
        if self.mirror:
            print(text, file=self.mirror, flush=True)
        if self._bar:
            self._bar.console.print(text)
        else:
            print(text, file=self.console.file, flush=True)

    @contextlib.contextmanager
    def phase(self, text: str) -> Iterator[None]:
        """Shows ``text`` and its elapsed seconds while the block runs."""
        if not self._bar:
            yield
            return
        self._task = self._bar.add_task(text)
        try:
            yield
        finally:
            self._bar.remove_task(self._task)
            self._task = None

    def update(self, text: str) -> None:
        """Changes the current phase's text (a sub-phase), keeping its clock."""
        if self._bar and self._task is not None:
            self._bar.update(self._task, description=text)
