"""``dbsp dev``: ``dagster dev`` as a child that a Ctrl-C stops, whole, within seconds.

Why not ``exec`` it: ``dagster dev`` stops its webserver and daemon itself on Ctrl-C, but
waits up to 60 s for each of them in turn (``_SUBPROCESS_WAIT_TIMEOUT`` in
``dagster/_cli/dev.py``), and its code servers and their run processes, each a child of a
child, are stopped only after those waits or by their own heartbeat timeouts (30-45 s).
One of them slow to take the signal (a run in a Spark call, a sensor tick waiting on
Kafka, a webserver that failed to bind) keeps them all.  Here ``dbsp`` stays the parent
with a deadline: ``dagster dev`` gets :data:`GRACE` seconds, then every process left in
the tree is terminated, then killed.

The embedded Kafka broker and Spark Connect server are not stopped: they run in their
own sessions on purpose (shared by every command; ``dbsp stop`` ends them).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from .config import POSTGRES_ENV, ConfigError

if TYPE_CHECKING:
    from dagster import DagsterInstance

GRACE = 5.0  # for dagster dev to stop its services itself
TERM_GRACE = 2.0  # for what is left to end on SIGTERM before SIGKILL
PR_SET_CHILD_SUBREAPER = 36
INTERRUPTED = 130  # the shell's code for a Ctrl-C


def dagster_dev_command(target: Sequence[str], dagster_args: Sequence[str]) -> list[str]:
    """``dagster dev`` from the interpreter running ``dbsp``: its venv need not be on PATH."""
    return [sys.executable, "-m", "dagster", "dev", *target, *dagster_args]


def create_instance(dagster_home: str) -> None:
    """Creates the instance's databases in ``dagster_home`` if they are missing.  ``dagster
    dev``'s webserver, daemon and code server would otherwise each create a new home's at
    once, and the set-up of the event log that ``dbsp`` configures does not retry: one of
    them fails on alembic's version table."""
    open_instance(dagster_home).dispose()


def open_instance(dagster_home: str | None = None) -> DagsterInstance:
    """The Dagster instance of ``dagster_home`` (default ``$DAGSTER_HOME``).  A PostgreSQL
    storage that does not answer is named with what it said (dagster-postgres says only
    that it retried)."""
    from dagster import DagsterInstance
    from dagster_postgres.utils import DagsterPostgresException

    try:
        return DagsterInstance.from_config(dagster_home) if dagster_home else DagsterInstance.get()
    except DagsterPostgresException as e:
        seen = str(getattr(e.__cause__, "orig", None) or e.__cause__ or e).strip().splitlines()[0]
        home = dagster_home or os.environ.get("DAGSTER_HOME", "")
        raise ConfigError(
            f"the Dagster instance's PostgreSQL database did not answer ({seen}); check the database that "
            f"{POSTGRES_ENV} (or the storage section of {os.path.join(home, 'dagster.yaml')}) names, "
            "and that its server runs"
        ) from e


def address(dagster_args: Sequence[str]) -> tuple[str, int]:
    """The host and port the webserver will bind (``dagster dev``'s ``-h``/``-p``, defaults)."""
    host, port = "127.0.0.1", 3000
    args = list(dagster_args)
    for i, arg in enumerate(args):
        name, _, value = arg.partition("=")
        if not value and i + 1 < len(args):
            value = args[i + 1]
        if name in ("-p", "--port"):
            port = int(value)
        elif name in ("-h", "--host"):
            host = value
    return host, port


def port_problem(host: str, port: int) -> str | None:
    """Why the webserver could not listen on ``host:port``, or None.  Dagster itself would
    only log the bind error and keep its daemon and code servers running with no UI."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind((host, port))
        except OSError as e:
            reason = "address already in use" if e.errno == errno.EADDRINUSE else e.strerror
            return f"cannot serve on {host}:{port}: {reason}"
    return None


def step_worker_command() -> list[str]:
    """The resident step worker (:mod:`dagster_project.step_worker`) from this interpreter."""
    return [sys.executable, "-m", "dagster_project.step_worker"]


def run(command: Sequence[str], say: Callable[[str], None], beside: Sequence[str] | None = None) -> int:
    """Runs ``command`` until it ends or a SIGINT/SIGTERM; returns its exit code (130 when
    interrupted).  ``beside``: a process kept running as long as ``command`` (started again
    when it dies).  No process of the tree outlives the call by more than GRACE + TERM_GRACE."""
    _become_subreaper()
    stop_at: list[float] = []
    started: list[subprocess.Popen] = []

    def stop(signum, _frame) -> None:
        if stop_at:
            return  # a second Ctrl-C changes nothing: the deadline stands
        stop_at.append(time.monotonic() + GRACE)
        if signum != signal.SIGINT:
            # A terminal's SIGINT reached the whole group already; SIGTERM (kill, a
            # supervisor) reached only us: ask dagster dev to stop the way Ctrl-C does.
            for child in started:
                with contextlib.suppress(ProcessLookupError):
                    child.send_signal(signal.SIGINT)
        say("dbsp dev: stopping Dagster (webserver, daemon, code servers)...")

    # Handlers first: a Ctrl-C right after the start must not kill dbsp and orphan the tree.
    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        child = subprocess.Popen(command)  # our process group: a terminal's Ctrl-C reaches it too
        started.append(child)
        if beside:
            started.append(subprocess.Popen(beside))
        last_start = time.monotonic()
        while child.poll() is None and not (stop_at and time.monotonic() > stop_at[0]):
            # At most one start a second: a companion that cannot start does not spin.
            if beside and not stop_at and started[1].poll() is not None and time.monotonic() > last_start + 1:
                say(f"dbsp dev: {beside[-1]} exited ({_exit(started[1].returncode)}); starting it again")
                started[1], last_start = subprocess.Popen(beside), time.monotonic()
            time.sleep(0.1)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        # What dagster dev left (or all of it, past the deadline) gets the rest of GRACE.
        left = end_tree(grace=max(0.0, stop_at[0] - time.monotonic()) if stop_at else TERM_GRACE)
    if left:
        say(f"dbsp dev: terminated {len(left)} process(es) that had not stopped in time")
    code = child.poll()
    return INTERRUPTED if stop_at else (code if code is not None else 1)


def _exit(code: int) -> str:
    return f"killed by signal {-code}" if code < 0 else f"exit code {code}"


def end_tree(grace: float) -> list[int]:
    """Ends every descendant of this process in its session: waits ``grace`` seconds, then
    SIGTERM, then SIGKILL after TERM_GRACE.  Returns those it had to signal."""
    deadline = time.monotonic() + grace
    while descendants() and time.monotonic() < deadline:
        _reap()
        time.sleep(0.1)
    signalled = descendants()
    for sig, wait in ((signal.SIGTERM, TERM_GRACE), (signal.SIGKILL, 1.0)):
        for pid in descendants():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while descendants() and time.monotonic() < deadline:
            _reap()
            time.sleep(0.05)
    _reap()
    return signalled


def descendants(root: int | None = None) -> list[int]:
    """Live (not zombie) descendants of ``root`` (this process) in its session.  Daemons
    that detached into a session of their own (the embedded broker and Spark server) are
    left alone on purpose."""
    root = root or os.getpid()
    session = os.getsid(root)
    children: dict[int, list[int]] = {}
    states: dict[int, tuple[str, int]] = {}
    for pid, ppid, state, sid in _processes():
        children.setdefault(ppid, []).append(pid)
        states[pid] = (state, sid)
    found, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        state, sid = states[pid]
        if state != "Z" and sid == session:
            found.append(pid)
    return found


def _processes():
    """(pid, ppid, state, session id) of every process, from /proc."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue  # gone meanwhile
        fields = stat[stat.rindex(")") + 2 :].split()  # the command name may hold spaces
        yield int(name), int(fields[1]), fields[0], int(fields[3])


def _become_subreaper() -> None:
    """Orphans of the tree (a code server whose parent died first) become our children,
    not init's, so :func:`descendants` still finds them (Linux only; elsewhere a no-op)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _reap() -> None:
    """Collects exited children (adopted orphans included), so they leave no zombies."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
