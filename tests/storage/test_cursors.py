"""The gateway's cursor table on Delta: what was committed last is what a restart loads."""

from storage.cursors import Cursors, CursorStore


def test_the_last_commit_is_what_loads_and_none_loads_empty(tmp_path):
    store = CursorStore(str(tmp_path / "cursors"))
    assert store.load() == Cursors({}, {})
    store.commit({("t", "/a.log"): 10, ("t", "/b.log"): 0}, {("t", 0): 5, ("t", 1): 7})
    last = Cursors({("t", "/a.log"): 25}, {("t", 0): 9})
    assert store.commit(last.positions, last.read_back) == 2  # created, then one version per commit
    assert CursorStore(str(tmp_path / "cursors")).load() == last
