"""The I/O buffer pool: reserve, FIFO order, fairness, refusals and thread safety."""

import asyncio
import threading

import pytest

from gateway.errors import GatewayConfigError, GatewayError
from gateway.pool import Buffer, BufferPool


class TracingPool(BufferPool):
    """Records every grant in order: ``(source, buffers it held before)``."""

    def __init__(self, *args):
        super().__init__(*args)
        self.grants: list[tuple[str, int]] = []

    def _take(self, account):
        self.grants.append((account.source_id, account.held))
        return super()._take(account)


def pool_of(buffers: int, *sources: str, size: int = 16) -> BufferPool:
    pool = BufferPool(buffers, size)
    for source in sources:
        pool.register(source)
    return pool


async def pending(pool: BufferPool, source: str) -> asyncio.Task:
    """An acquire that is waiting (checked: it did not complete at once)."""
    task = asyncio.create_task(pool.acquire(source))
    await asyncio.sleep(0)
    assert not task.done(), f"{source} was served at once"
    return task


def test_buffer_views_and_reset():
    async def main():
        pool = pool_of(2, "a", size=8)
        buffer = await pool.acquire("a")
        assert buffer.source == "a" and buffer.length == 0 and not buffer.full
        buffer.view()[:3] = b"abc"
        buffer.length = 3
        assert bytes(buffer.filled()) == b"abc" and len(buffer.view()) == 5
        buffer.view()[:] = b"defgh"
        buffer.length = 8
        assert buffer.full and bytes(buffer.filled()) == b"abcdefgh"
        pool.release(buffer)
        assert buffer.source is None and buffer.length == 0
        assert pool.stats()["free"] == 2

    asyncio.run(main())


def test_registration_refused_past_the_limit_names_the_setting():
    pool = pool_of(3, "a", "b")
    with pytest.raises(GatewayConfigError, match=r"gateway\.buffers is 3.*3 sources.*at least 4"):
        pool.register("c")
    with pytest.raises(GatewayError, match="already registered"):
        pool.register("a")
    with pytest.raises(GatewayConfigError, match=r"gateway\.buffers"):
        BufferPool(1, 16)
    with pytest.raises(GatewayConfigError, match=r"gateway\.buffer_size"):
        BufferPool(4, 0)
    pool.unregister("b")
    pool.register("c")  # room again


def test_reserve_a_holder_takes_only_spare_buffers():
    """Four buffers, three sources: ``a`` may take the one spare buffer, not the reserves."""

    async def main():
        pool = pool_of(4, "a", "b", "c")
        first, second = await pool.acquire("a"), await pool.acquire("a")
        assert pool.stats()["reserved"] == 2
        third = await pending(pool, "a")  # only b's and c's reserves are left
        b, c = await pool.acquire("b"), await pool.acquire("c")  # served from them at once
        assert {b.source, c.source} == {"b", "c"} and not third.done()
        pool.release(first)
        assert (await third).source == "a"
        for buffer in (second, third.result(), b, c):
            pool.release(buffer)
        assert pool.stats()["in_use"] == 0

    asyncio.run(main())


def test_requests_are_served_in_fifo_order():
    async def main():
        pool = pool_of(4, "a", "b", "c")
        held = [await pool.acquire(s) for s in ("a", "b", "c", "a")]  # every buffer out
        order: list[str] = []
        tasks = []
        for source in ("b", "c", "a"):
            task = await pending(pool, source)
            task.add_done_callback(lambda t: order.append(t.result().source))
            tasks.append(task)
        for buffer in held[:3]:
            pool.release(buffer)
            await asyncio.sleep(0)
        await asyncio.gather(*tasks)
        assert order == ["b", "c", "a"]

    asyncio.run(main())


def test_a_source_holding_none_does_not_wait_behind_a_holder():
    async def main():
        pool = pool_of(5, "a", "b", "c", "d")
        [await pool.acquire(s) for s in ("a", "a", "b", "c")]  # a took the spare buffer
        blocked = await pending(pool, "b")  # b holds one: needs a spare buffer, none left
        d = await pool.acquire("d")  # d holds none: its reserve, past b
        assert d.source == "d" and not blocked.done()
        blocked.cancel()

    asyncio.run(main())


def test_one_outstanding_request_per_source():
    async def main():
        pool = pool_of(3, "a", "b")
        held = [await pool.acquire("a"), await pool.acquire("a")]
        waiting = await pending(pool, "a")
        with pytest.raises(GatewayError, match="one outstanding request"):
            await pool.acquire("a")
        with pytest.raises(GatewayError, match="still waits"):
            pool.unregister("a")
        waiting.cancel()
        await asyncio.sleep(0)
        assert pool.stats()["waiting"] == 0
        pool.release(held[0])  # a cancelled wait takes nothing
        assert pool.stats()["free"] == 2

    asyncio.run(main())


def test_a_foreign_or_free_buffer_is_refused():
    async def main():
        pool, other = pool_of(2, "a"), pool_of(2, "a")
        with pytest.raises(GatewayError, match="not checked out"):
            pool.release(await other.acquire("a"))
        buffer = await pool.acquire("a")
        pool.release(buffer)
        with pytest.raises(GatewayError, match="not checked out"):
            pool.release(buffer)
        with pytest.raises(GatewayError, match="not checked out"):
            pool.release(Buffer(16, pool))
        with pytest.raises(GatewayError, match="not registered"):
            await pool.acquire("nobody")

    asyncio.run(main())


def test_no_deadlock_when_consumers_keep_every_spare_buffer():
    """A fast source takes every spare buffer and its consumer never returns one; each slow
    source still gets its reserved buffer at once."""

    async def main():
        slow = [f"slow{i}" for i in range(99)]
        pool = pool_of(120, "fast", *slow)
        kept = [await pool.acquire("fast") for _ in range(120 - 99)]
        stuck = await pending(pool, "fast")
        for source in slow:
            assert (await pool.acquire(source)).source == source
        assert pool.stats()["free"] == 0 and len(kept) == 21 and not stuck.done()
        stuck.cancel()

    asyncio.run(main())


def test_a_source_100x_faster_never_makes_a_slow_one_wait_more_than_a_round():
    """One fast source asks for buffers 100 times as often as each of 99 slow ones, with
    consumers that keep every buffer a while, so the pool runs short.  A *round*: between a
    slow source's request and its grant no source is served twice from spare buffers (a
    grant to a source holding none comes from its own reserve and takes nothing from the
    others)."""

    async def main():
        slow = [f"slow{i}" for i in range(99)]
        pool = TracingPool(130, 16)
        for source in ["fast", *slow]:
            pool.register(source)
        loop = asyncio.get_running_loop()
        windows: list[tuple[str, int, int]] = []  # (source, grants before its request, before its grant)

        async def run(source: str, pause: float, hold: float, until: float):
            while loop.time() < until:
                asked = len(pool.grants)
                buffer = await pool.acquire(source)
                granted = next(i for i in range(len(pool.grants) - 1, -1, -1) if pool.grants[i][0] == source)
                windows.append((source, asked, granted))
                loop.call_later(hold, pool.release, buffer)  # the consumer keeps it a while
                await asyncio.sleep(pause)

        until = loop.time() + 1.5
        await asyncio.gather(run("fast", 0.0002, 0.05, until), *(run(s, 0.02, 0.05, until) for s in slow))
        waited = 0
        for source, asked, granted in windows:
            if source == "fast":
                continue
            spare = [s for s, held in pool.grants[asked:granted] if held > 0]
            assert len(spare) == len(set(spare)), f"{source} waited while {spare} were served twice"
            waited += granted > asked
        assert waited > 100, "the pool was never short: the test tests nothing"
        served = {s: sum(1 for w in windows if w[0] == s) for s in ["fast", *slow]}
        assert min(served[s] for s in slow) >= 10
        assert served["fast"] >= max(served[s] for s in slow), "the fast one is starved instead"

    asyncio.run(main())


def test_two_loops_share_the_pool():
    """Sources on two threads' loops; a third thread releases every buffer."""
    pool = pool_of(8, *(f"s{i}" for i in range(6)))
    returned: list[Buffer] = []
    lock = threading.Condition()
    rounds = 2000

    def consumer():
        released = 0
        while released < 6 * rounds:
            with lock:
                lock.wait_for(lambda: returned)
                batch, returned[:] = list(returned), []
            for buffer in batch:
                pool.release(buffer)
            released += len(batch)

    async def source(name: str):
        for _ in range(rounds):
            buffer = await pool.acquire(name)
            with lock:
                returned.append(buffer)
                lock.notify()

    async def three(names):
        await asyncio.gather(*(source(n) for n in names))

    threads = [threading.Thread(target=consumer)]
    threads += [
        threading.Thread(target=asyncio.run, args=(three(names),)) for names in (["s0", "s1", "s2"], ["s3", "s4", "s5"])
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=20)
        assert not thread.is_alive()
    stats = pool.stats()
    assert stats["free"] == 8 and stats["waiting"] == 0
    assert all(s["acquired"] == rounds and s["held"] == 0 for s in stats["sources"].values())
