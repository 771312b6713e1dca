"""The suite's guard against hangs (``tests/hung.py``): a hung test fails with its stacks."""

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

HANGS = """
import threading

from hypothesis import given, settings, strategies as st

stuck = threading.Event()


@settings(deadline=None, database=None)
@given(st.integers())
def test_hangs_in_a_property_test(n):
    try:
        stuck.wait()
    except Exception:
        pass  # an engine's retry would swallow pytest-timeout's failure too
"""


@pytest.mark.slow
def test_a_hung_property_test_fails_with_its_stacks_instead_of_shrinking(tmp_path):
    (tmp_path / "test_hangs.py").write_text(textwrap.dedent(HANGS))
    (tmp_path / "pytest.ini").write_text("[pytest]\ntimeout = 2\ntimeout_method = signal\n")
    began = time.monotonic()
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.hung", "-p", "no:xdist", "-p", "no:cacheprovider", "-q"],
        cwd=tmp_path,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert time.monotonic() - began < 60, run.stdout
    assert run.returncode == 1, run.stdout + run.stderr
    assert "Hung: Timeout: still running after 2 s" in run.stdout, run.stdout
    assert "1 failed" in run.stdout, run.stdout
