"""A pytest plugin: a test still running after ``timeout`` (pyproject.toml) fails with every
thread's stack, whatever the test catches.

pytest-timeout's ``signal`` method fails a test by raising pytest's ``Failed`` in it. A
property test (hypothesis) takes that for its example's failure and shrinks it: it calls the
hung code again, with no alarm left, and the run hangs after all.  Here the alarm raises
:class:`Hung`, which no ``except Exception`` catches and hypothesis lets through, and rings
again every minute while the test goes on (a ``finally`` may call the stuck server again).
The threads it left stuck would hold up the tests after it in its process: they are
skipped, naming it, and the run fails by it.
"""

import signal
import sys
import threading
import traceback

import pytest

AGAIN = 60.0
"""Seconds between alarms after the first, while the test is still running."""


class Hung(BaseException):
    """The test ran past its timeout; the message holds the other threads' stacks."""


def stacks() -> str:
    """Every thread's stack but the calling one's (which the report's traceback shows)."""
    names = {t.ident: t.name for t in threading.enumerate()}
    me = threading.get_ident()
    return "".join(
        f"\n--- thread {names.get(ident, '?')} ({ident}) ---\n" + "".join(traceback.format_stack(frame))
        for ident, frame in sys._current_frames().items()
        if ident != me
    )


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item, settings):
    if settings.method != "signal" or threading.current_thread() is not threading.main_thread():
        return None  # pytest-timeout's own timer

    def alarm(signum, frame):
        raise Hung(f"Timeout: still running after {settings.timeout:g} s (pytest-timeout)\n{stacks()}")

    def cancel():
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)

    item.cancel_timeout = cancel  # pytest-timeout's cancelling hook calls it
    signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, settings.timeout, AGAIN)
    return True


_hung: list[str] = []  # a test of this process that hung


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if call.excinfo is not None and isinstance(call.excinfo.value, Hung):
        _hung.append(item.nodeid)
    return report


def pytest_runtest_setup(item):
    if _hung:
        pytest.skip(f"{_hung[0]} hung in this test process")
