"""Where a long command's output goes: the log gets every writer, the terminal only the
progress lines (and the rest too with ``--verbose``)."""

import io
import subprocess
import sys

from dagster_project.console import Progress, log_path

# A process that writes from everywhere a run writes from while its output goes to a log
# (its own process: pytest swaps sys.stdout for objects that bypass descriptor 1).
SCRIPT = """
import logging, os, subprocess, sys
from dagster_project.console import output_to_log

with output_to_log(sys.argv[1], echo=sys.argv[2] == "echo") as terminal:
    print("from print")
    # As Dagster's console logger does, per run: a handler on sys.stderr.
    logging.getLogger("x").addHandler(logging.StreamHandler(sys.stderr))
    logging.getLogger("x").warning("from logging")
    os.write(2, b"from fd 2\\n")
    # A child inherits descriptors 1 and 2, as a JVM does.
    subprocess.run(["sh", "-c", "echo from a child; echo from its stderr >&2"], check=True)
    terminal.write("progress line\\n")
print("after")
"""
WRITERS = ("from print", "from logging", "from fd 2", "from a child", "from its stderr")


def run_script(path: str, mode: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, path, mode], capture_output=True, text=True, timeout=60, check=True
    )


def test_everything_but_the_progress_goes_to_the_log(tmp_path):
    path = log_path(str(tmp_path / "logs"), "demo")
    done = run_script(path, "quiet")
    # The process's own output is back on the terminal after the block.
    assert (done.stdout, done.stderr) == ("progress line\nafter\n", "")
    log = open(path).read()
    assert all(text in log for text in WRITERS), log


def test_verbose_shows_the_log_on_the_terminal_too(tmp_path):
    path = log_path(str(tmp_path), "demo")
    done = run_script(path, "echo")
    log = open(path).read()
    assert all(text in log and text in done.stdout for text in WRITERS), (log, done.stdout)
    assert "progress line" in done.stdout and "progress line" not in log


def test_log_paths_do_not_collide(tmp_path):
    first = log_path(str(tmp_path), "demo")
    open(first, "w").close()
    assert log_path(str(tmp_path), "demo") != first


def test_off_a_terminal_progress_prints_plain_lines_only():
    stream = io.StringIO()
    with Progress(stream) as progress:
        assert not progress.live
        with progress.phase("starting the broker"):
            progress.update("still starting")
            progress.line("step 0: events 0..10 [in brackets]")
    assert stream.getvalue() == "step 0: events 0..10 [in brackets]\n"


LATE = """
import os, sys
from dagster_project.console import output_to_log

with output_to_log(sys.argv[1], until_exit=True) as terminal:
    terminal.write("the last line\\n")
os.write(2, b"a late warning from a client thread\\n")
"""


def test_until_exit_late_writers_go_to_the_log(tmp_path):
    path = log_path(str(tmp_path), "demo")
    done = subprocess.run([sys.executable, "-c", LATE, path], capture_output=True, text=True, timeout=60, check=True)
    assert (done.stdout, done.stderr) == ("the last line\n", "")
    assert "a late warning from a client thread" in open(path).read()
