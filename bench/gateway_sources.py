"""Source gateway (the asynchronous-sources design's P1): the async gateway against a thread-per-source
baseline at 10, 100, 1,000 and 5,000 sources, in the same run.

Both sides run the same machinery: a ``BufferPool``, an ``AsyncSourceExecutor`` with one
I/O thread and a ``Delivery`` producing to a local Apache Kafka node (``LocalBroker``),
wired as ``Gateway`` wires them (an idle
producer queue flushes the partly filled buffers).  The async side runs
``GeneratorSource``s on the event loop; the baseline runs ``SyncGeneratorSource``s, which
the executor puts on a thread each (``ThreadedSource``, the asynchronous-sources design's fallback).  Every
configuration runs in a fresh process against a fresh broker, so the threads and the
resident memory read from ``/proc/self/status`` are that configuration's alone; the sides
alternate per N (async first at even positions, threads first at odd ones).

Two load shapes:

* ``rate``: ``--rate`` lines per second in all, split evenly among the N sources.  A
  line's latency runs from the time it was due (the device's write: ``start + n / rate``
  of its source, so time it waited because the gateway did not read counts) to the
  broker's acknowledgement of the message holding it.
* ``unlimited``: generators as fast as buffers come.  A line's latency runs from the end
  of the ``fill`` that wrote it to the acknowledgement.

Each configuration adds its N sources, waits until every one has filled once, warms up
``--warmup`` seconds and then counts ``--seconds`` seconds: lines and bytes acknowledged
in the window, the latency of those lines (p50, p99), threads and RSS (median of samples
in the window, and the peak: ``VmHWM``), requests that waited for a buffer, and the CPU of
the gateway process and of the broker in the window.  The measurement costs the same on
both sides: each fill appends (lines written, time) to a list of its source; each
acknowledgement appends (time, source, byte range) in ``Delivery._delivered``; the
latencies are computed after the window from the fixed line size.

``--delivery none`` replaces the broker by an in-process consumer that acknowledges each
message at once on a thread of its own (Delivery's framing and acknowledgement code still
run): labelled "no broker", it shows the gateway's own cost.

    python bench/gateway_sources.py --sources 10 100 1000 5000 --seconds 8 --warmup 2 --shapes rate unlimited \
        --delivery broker none      # the defaults: 32 configurations, about 8 minutes
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np

from gateway.delivery import Delivery
from gateway.executor import AsyncSourceExecutor
from gateway.gateway import flush_on_idle
from gateway.pool import BufferPool
from gateway.sources import GeneratorSource, SyncGeneratorSource
from sensors.broker import LocalBroker, ensure_topics

TOPIC = "gateway-bench"


# -- the child: one configuration ------------------------------------------------------------


class TimedGenerator(GeneratorSource):
    """A generator that records, after each fill, how many lines it has written whole and when."""

    def __init__(self, source_id: str, line_size: int, rate: float | None):
        super().__init__(source_id, line_size=line_size, rate=rate)
        self.fills: list[tuple[int, float]] = []

    async def fill(self, buffer: memoryview) -> int:
        n = await super().fill(buffer)
        lines = self._lines
        self.fills.append((lines.number - (1 if lines._rest else 0), time.monotonic()))
        return n


class TimedSyncGenerator(SyncGeneratorSource):
    """The same, with a blocking fill (a thread per source)."""

    def __init__(self, source_id: str, line_size: int, rate: float | None):
        super().__init__(source_id, line_size=line_size, rate=rate)
        self.fills: list[tuple[int, float]] = []

    def fill(self, buffer: memoryview) -> int:
        n = super().fill(buffer)
        lines = self._lines
        self.fills.append((lines.number - (1 if lines._rest else 0), time.monotonic()))
        return n


class Recorded:
    """Records every acknowledgement: (time, source, start, end)."""

    acks: list

    def _delivered(self, source, start, end, error, message, buffer) -> None:
        if error is None:
            self.acks.append((time.monotonic(), source, start, end))
        super()._delivered(source, start, end, error, message, buffer)


class BrokerDelivery(Recorded, Delivery):
    def __init__(self, *args, **kwargs):
        self.acks = []
        super().__init__(*args, **kwargs)


class _Acked:
    """What ``Delivery._delivered`` reads of an acknowledged message."""

    __slots__ = ("_offset",)

    def __init__(self, offset: int):
        self._offset = offset

    def topic(self) -> str:
        return TOPIC

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset


class InProcessDelivery(Recorded, Delivery):
    """ "No broker": Delivery with its producer replaced by an in-process consumer thread that
    acknowledges every message at once (framing, bookkeeping and release are Delivery's)."""

    def __init__(self, release, on_failure):  # Delivery's state, without a producer
        self.acks = []
        self._release = release
        self._on_failure = on_failure
        self._sources = {}
        self._lock = threading.Lock()
        self._high = {}
        self._running = True
        self._idle_listeners = []
        self._sent_since_idle = False
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._produced = 0  # on the I/O thread
        self._consumed = 0  # on the consumer thread
        self._poller = threading.Thread(target=self._poll, name="gateway-acks", daemon=True)
        self._poller.start()

    @property
    def idle(self) -> bool:
        return self._produced == self._consumed

    def _produce(self, source, state, value, start, partial, buffer) -> None:
        end = start + len(value)
        state.sent = end
        self._sent_since_idle = True
        state.bytes_sent += len(value)
        state.messages += 1
        self._produced += 1
        self._queue.put((source, start, end, value, buffer))

    def _poll(self) -> None:
        offset = 0
        while self._running:
            try:
                source, start, end, _value, buffer = self._queue.get(timeout=0.05)
            except queue.Empty:
                pass
            else:
                self._delivered(source, start, end, None, _Acked(offset), buffer)
                offset += 1
                self._consumed += 1
            if self._sent_since_idle and self.idle:
                self._sent_since_idle = False
                for listener in self._idle_listeners:
                    listener()

    def wait(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while not self.idle and time.monotonic() < deadline:
            time.sleep(0.01)
        return self._produced - self._consumed

    def close(self, timeout: float = 10.0) -> None:
        self.wait(timeout)
        self._running = False
        self._poller.join()


def _status() -> dict[str, int]:
    """VmRSS, VmHWM (kB) and Threads of this process."""
    found = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM", "Threads"):
                found[key] = int(value.split()[0])
    return found


def _cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of process ``pid`` (this one when None)."""
    if pid is None:
        t = os.times()
        return t.user + t.system
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return float("nan")


def _waits(pool: BufferPool) -> tuple[int, float]:
    sources = pool.stats()["sources"].values()
    return sum(s["waits"] for s in sources), sum(s["wait_seconds"] for s in sources)


def _latencies(acks: list, sources: list, line_size: int, rate: float | None) -> np.ndarray:
    """Seconds from each acknowledged line's write (its due time at a fixed rate, else the end
    of the fill that wrote it) to the acknowledgement of its message."""
    if not acks:
        return np.zeros(0)
    index = {s.id: i for i, s in enumerate(sources)}
    t_ack = np.array([a[0] for a in acks])
    src = np.array([index[a[1]] for a in acks])
    first = np.array([a[2] // line_size for a in acks])
    count = np.array([a[3] // line_size for a in acks]) - first
    keep = count > 0
    t_ack, src, first, count = t_ack[keep], src[keep], first[keep], count[keep]
    message = np.repeat(np.arange(len(count)), count)
    starts = np.cumsum(count) - count
    line = first[message] + (np.arange(int(count.sum())) - starts[message])
    line_src = src[message]
    if rate is not None:
        start = np.array([s._lines._start for s in sources])
        written = start[line_src] + line / rate
    else:
        # Line n of a source was written whole by its first fill that had written n + 1 lines.
        big = 1 << 40
        keys, times = [], []
        for i, s in enumerate(sources):
            fills = list(s.fills)
            keys.extend(i * big + n for n, _ in fills)
            times.extend(t for _, t in fills)
        keys, times = np.array(keys), np.array(times)
        at = np.searchsorted(keys, line_src * big + line + 1, side="left")
        written = times[np.minimum(at, len(times) - 1)]
    return t_ack[message] - written


def child(config: dict) -> dict:
    n, side, shape = config["sources"], config["side"], config["shape"]
    line_size, seconds, warmup = config["line_size"], config["seconds"], config["warmup"]
    rate = config["rate"] / n if shape == "rate" else None
    buffers = max(2048, 2 * n)
    pool = BufferPool(buffers, config["buffer_size"])
    if config["delivery"] == "broker":
        delivery = BrokerDelivery(config["bootstrap"], {}, pool.release, lambda *_: None)
    else:
        delivery = InProcessDelivery(pool.release, lambda *_: None)
    executor = AsyncSourceExecutor(
        pool, delivery.deliver, 1, on_add=lambda s: delivery.add(s.id, TOPIC, 0, False), idle=lambda: delivery.idle
    )
    flush_on_idle(delivery, executor)
    kind = TimedGenerator if side == "async" else TimedSyncGenerator
    sources = [kind(f"s{i:05d}", line_size, rate) for i in range(n)]
    began = time.monotonic()
    executor.start()
    for source in sources:
        executor.add(source)
    while not all(s.fills for s in sources) and time.monotonic() - began < 60:
        time.sleep(0.05)
    started = time.monotonic() - began
    time.sleep(warmup)

    broker_pid = config.get("broker_pid")
    cpu0, broker0 = _cpu_seconds(None), _cpu_seconds(broker_pid)
    waits0 = _waits(pool)
    t0 = time.monotonic()
    samples = []
    while (now := time.monotonic()) < t0 + seconds:
        samples.append(_status())
        time.sleep(min(0.25, max(0.0, t0 + seconds - now)))
    t1 = time.monotonic()
    cpu1, broker1 = _cpu_seconds(None), _cpu_seconds(broker_pid)
    waits1 = _waits(pool)
    last = _status()
    span = t1 - t0

    acks = [a for a in list(delivery.acks) if t0 <= a[0] < t1]
    lines = sum(a[3] // line_size - a[2] // line_size for a in acks)
    nbytes = sum(a[3] - a[2] for a in acks)
    latency = _latencies(acks, sources, line_size, rate)
    result = {
        **{k: config[k] for k in ("sources", "side", "shape", "delivery")},
        "offered": config["rate"] if shape == "rate" else None,
        "start_seconds": round(started, 2),
        "lines_per_s": lines / span,
        "mb_per_s": nbytes / span / 1e6,
        "messages_per_s": len(acks) / span,
        "p50_ms": float(np.percentile(latency, 50)) * 1e3 if len(latency) else None,
        "p99_ms": float(np.percentile(latency, 99)) * 1e3 if len(latency) else None,
        "threads": statistics.median(s["Threads"] for s in samples),
        "threads_peak": max(s["Threads"] for s in samples),
        "rss_mb": statistics.median(s["VmRSS"] for s in samples) / 1024,
        "rss_peak_mb": last["VmHWM"] / 1024,
        "waits": waits1[0] - waits0[0],
        "wait_seconds": waits1[1] - waits0[1],
        "cpu": (cpu1 - cpu0) / span,
        "broker_cpu": (broker1 - broker0) / span if broker_pid else None,
        "buffers": buffers,
    }
    return result


# -- the parent: every configuration, each in a fresh process -----------------------------------


def run_one(config: dict) -> dict:
    def spawn(extra: dict) -> dict:
        command = [sys.executable, os.path.abspath(__file__), "--child", json.dumps({**config, **extra})]
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=config["warmup"] + config["seconds"] + 120
        )
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        if done.returncode != 0 or not lines:
            raise RuntimeError(f"configuration {config} failed ({done.returncode}):\n{done.stderr[-3000:]}")
        return json.loads(lines[-1])

    if config["delivery"] == "none":
        return spawn({})
    with LocalBroker() as broker:
        ensure_topics(broker.bootstrap, {TOPIC: config["partitions"]})
        return spawn({"bootstrap": broker.bootstrap, "broker_pid": broker._process.pid})


def _f(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def report(shape: str, delivery: str, results: dict, counts: list[int], rate: float) -> None:
    label = "broker (Kafka)" if delivery == "broker" else "no broker (in-process acknowledgement)"
    offered = f"{rate:,.0f} lines/s offered in all" if shape == "rate" else "unlimited generators"
    print(f"\n### {shape}: {offered}; {label}\n")
    print(
        "| N | side | acked lines/s | MB/s | messages/s | p50 ms | p99 ms | threads | RSS MB (peak) | "
        "buffer waits (s) | gateway CPU | CPU us/line | broker CPU | start s |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for n in counts:
        for side in ("async", "threads"):
            r = results.get((shape, delivery, n, side))
            if r is None:
                continue
            print(
                f"| {n:,} | {side} | {r['lines_per_s']:,.0f} | {r['mb_per_s']:.2f} | {r['messages_per_s']:,.0f} | "
                f"{_f(r['p50_ms'], ',.1f')} | {_f(r['p99_ms'], ',.1f')} | {r['threads']:,.0f} | "
                f"{r['rss_mb']:,.0f} ({r['rss_peak_mb']:,.0f}) | {r['waits']:,} ({r['wait_seconds']:,.1f}) | "
                f"{r['cpu']:.0%} | {_f(r['cpu'] / r['lines_per_s'] * 1e6 if r['lines_per_s'] else None, '.2f')} | "
                f"{_f(r['broker_cpu'], '.0%')} | {r['start_seconds']:.1f} |"
            )
    print(
        "\n| N | async/threads lines/s | async/threads p99 | async at N / async at 10 | threads at N / threads at 10 |"
    )
    print("| --- | --- | --- | --- | --- |")
    base = {side: results.get((shape, delivery, counts[0], side)) for side in ("async", "threads")}
    verdict = []
    for n in counts:
        a, t = results.get((shape, delivery, n, "async")), results.get((shape, delivery, n, "threads"))
        if a is None or t is None:
            continue
        ratio = a["lines_per_s"] / t["lines_per_s"] if t["lines_per_s"] else float("inf")
        p99 = a["p99_ms"] / t["p99_ms"] if a["p99_ms"] and t["p99_ms"] else None
        hold = a["lines_per_s"] / base["async"]["lines_per_s"] if base["async"]["lines_per_s"] else float("nan")
        thold = t["lines_per_s"] / base["threads"]["lines_per_s"] if base["threads"]["lines_per_s"] else float("nan")
        print(f"| {n:,} | {ratio:.2f} | {_f(p99, '.2f')} | {hold:.2f} | {thold:.2f} |")
        if n >= 1000:
            verdict.append((n, hold >= 0.9, ratio > 1.0))
    if verdict:
        met = all(h and b for _, h, b in verdict)
        detail = "; ".join(
            f"N={n:,}: within 10% of N={counts[0]}: {'yes' if h else 'no'}, beats threads: {'yes' if b else 'no'}"
            for n, h, b in verdict
        )
        print(
            f"\nGoal (N >= 1,000: async within 10% of its {counts[0]}-source throughput and above "
            f"thread-per-source): {'met' if met else 'NOT met'} ({detail})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sources", type=int, nargs="+", default=[10, 100, 1000, 5000])
    parser.add_argument("--seconds", type=float, default=8.0, help="the measured window of each configuration")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds after every source has filled once")
    parser.add_argument("--shapes", nargs="+", default=["rate", "unlimited"], choices=["rate", "unlimited"])
    parser.add_argument("--delivery", nargs="+", default=["broker", "none"], choices=["broker", "none"])
    parser.add_argument("--rate", type=float, default=20_000, help="lines per second in all, for the rate shape")
    parser.add_argument("--line-size", type=int, default=64)
    parser.add_argument("--buffer-size", type=int, default=16384)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))), flush=True)
        os._exit(0)  # the sources' threads and the producer are not waited for

    print(
        f"load average at start: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}", flush=True
    )
    results = {}
    position = 0
    for shape in args.shapes:
        for delivery in args.delivery:
            for n in args.sources:
                sides = ("async", "threads") if position % 2 == 0 else ("threads", "async")
                position += 1
                for side in sides:
                    config = {
                        "sources": n,
                        "side": side,
                        "shape": shape,
                        "delivery": delivery,
                        "seconds": args.seconds,
                        "warmup": args.warmup,
                        "rate": args.rate,
                        "line_size": args.line_size,
                        "buffer_size": args.buffer_size,
                        "partitions": args.partitions,
                    }
                    r = run_one(config)
                    results[(shape, delivery, n, side)] = r
                    print(
                        f"# {shape} {delivery} N={n} {side}: {r['lines_per_s']:,.0f} lines/s, "
                        f"p99 {_f(r['p99_ms'], ',.1f')} ms, {r['threads']:.0f} threads, {r['rss_mb']:.0f} MB, "
                        f"load {os.getloadavg()[0]:.2f}",
                        file=sys.stderr,
                        flush=True,
                    )
            report(shape, delivery, results, args.sources, args.rate)
    print(f"\nload average at end: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")


if __name__ == "__main__":
    main()
