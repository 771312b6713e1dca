"""The engine's property tests again, on a classic in-process Spark session.

The rest of the suite runs over Spark Connect; one process cannot hold both kinds of
session, so this runs the property tests in a pytest of its own, at two workers only: the
Connect run covers every worker count, this one that each operator runs on a classic session."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ..conftest import CLASSIC

PROJECT = Path(__file__).resolve().parents[2]
PROPERTY_TESTS = [
    "tests/circuits/test_operators.py::test_every_operator_equals_recomputation[2]",
    "tests/circuits/test_views.py::test_nexmark_views_equal_recomputation[2]",
    "tests/circuits/test_views.py::test_word_count_equals_recomputation[2]",
]


@pytest.mark.slow
@pytest.mark.skipif(bool(os.environ.get(CLASSIC)), reason="this run is the classic one")
def test_the_property_tests_pass_on_a_classic_session():
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", *PROPERTY_TESTS],
        cwd=PROJECT,
        env={**os.environ, CLASSIC: "1"},
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert run.returncode == 0, run.stdout[-5000:] + run.stderr[-2000:]
    assert " passed" in run.stdout.splitlines()[-1] and "skipped" not in run.stdout.splitlines()[-1], run.stdout[-500:]
