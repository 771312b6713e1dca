"""The pipeline lease (KLogs, docs/klogs.md): one holder at a time, fenced by Delta's commit protocol."""

import os
import threading
import time

import pytest

from storage.errors import LeaseHeldError
from storage.lease import Holder, Lease, LeaseRecord
from storage.tables import open_table


def race(root: str, contenders: int) -> tuple[list[tuple[str, int]], list[str]]:
    """``contenders`` threads acquire the lease at ``root`` at the same moment."""
    barrier, won, refused = threading.Barrier(contenders), [], []

    def contend(name: str) -> None:
        barrier.wait()
        try:
            won.append((name, Lease(root).acquire(name)))
        except LeaseHeldError:
            refused.append(name)

    threads = [threading.Thread(target=contend, args=(f"run{i}",)) for i in range(contenders)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    return won, refused


@pytest.mark.slow
def test_of_runs_racing_for_the_lease_exactly_one_wins(tmp_path):
    for trial in range(10):
        root = str(tmp_path / f"t{trial}")
        for _ in range(trial % 3):  # a new lease, and one held and released before
            with Lease(root).held():
                pass
        won, refused = race(root, 4)
        assert len(won) == 1 and len(refused) == 3, (won, refused)
        assert Lease(root).current().holder == won[0][0]


def test_the_lease_reads_one_file_however_many_runs_held_it(tmp_path):
    lease = Lease(str(tmp_path))
    tokens = []
    for run in range(12):  # past a Delta checkpoint (every 10 commits)
        with lease.held(Holder(f"run-{run}")) as token:
            tokens.append(token)
    assert tokens == sorted(set(tokens))
    assert len(open_table(lease.uri).file_uris()) == 1
    assert lease.current() == LeaseRecord(tokens[-1], "run-11", lease.current().since, lease.current().expires, True)


def test_a_held_lease_names_its_holder_and_the_fix_and_is_free_once_its_run_is_gone(tmp_path):
    lease = Lease(str(tmp_path))
    token = lease.acquire("run-a")
    with pytest.raises(LeaseHeldError, match="run-a.*dbsp recover --break-lease"):
        lease.acquire("run-b", wait=0.3, poll=0.1)
    taken = lease.acquire("run-b", holder_gone=lambda holder: holder == "run-a")
    assert taken > token
    lease.release(token)  # a stale token releases nothing
    assert lease.current().holder == "run-b" and not lease.current().released
    lease.release(taken)
    assert lease.current().released
    with lease.held(Holder("run-c")) as third:
        assert lease.current().token == third
    assert lease.current().released


def test_a_holder_waits_its_seconds_and_takes_the_lease_once_it_tells_the_holder_is_gone(tmp_path):
    lease, gone = Lease(str(tmp_path)), []
    lease.acquire("run-a")
    started = time.monotonic()
    with pytest.raises(LeaseHeldError, match="run-a"):
        with lease.held(Holder("run-b", wait=0.5)):
            pass
    assert time.monotonic() - started >= 0.5
    with lease.held(Holder("run-c", gone=lambda holder: gone.append(holder) or holder == "run-a")) as token:
        assert lease.current().holder == "run-c" and lease.current().token == token and gone == ["run-a"]
    with lease.held():  # by default, this process, not waiting
        assert lease.current().holder == f"pid {os.getpid()}"


def test_an_expired_lease_can_be_taken(tmp_path):
    Lease(str(tmp_path), ttl=0.0).acquire("crashed-run")
    assert Lease(str(tmp_path)).acquire("next-run")
