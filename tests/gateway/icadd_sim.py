"""A deterministic simulator of ICADD migrations (docs/gateway.md) between gateway workers.

No threads, no I/O: a chain of migrations ``W -> W' -> W'' ...`` (``Scenario.sizes``),
one at a time as the live trigger starts them: the next begins once every worker is back
to one layout.  One :class:`~gateway.icadd.Distributor` per worker, each with a downstream
region of ``paths`` FIFO paths into one stateful operator (a source: its state for key K
is the tuple of K's messages it has processed, so a lost, repeated or reordered message,
or a state split in two, shows at the next message).  A seeded scheduler
(``random.Random(seed)``) picks the next event among those enabled, with weights drawn
per run for every event source, so some workers, channels and paths lag far behind
others:

* ``produce``: the next data message of a key at its producer (a worker of every layout);
  data keeps flowing before, during and after the migrations;
* ``begin``: the trigger of the next migration reaches a worker (once ``trigger`` more
  messages have been produced and the previous migration is over; each worker in its own
  time).  A worker that joins is created then, with the current layout and version; one
  that leaves is removed once nothing is on its way to or from it;
* ``collect``: a worker in Collect moves a key of its ``whitelist`` (several may be in
  ``hold`` at once);
* ``deliver``: the first envelope of a channel between two workers;
* ``process``: the first item of a downstream path reaches the operator.

Channels, as ICADD assumes: each ordered pair of workers is one FIFO channel, each
downstream path is FIFO; nothing orders two different channels or paths.  Data goes down
path 0; ICADD messages are copied onto every path (multi-pathing).

After every event :meth:`Simulation.check` asserts: every key that has state has it at
exactly one worker (an operator's state counts until the key's Acquire has been sent) or
in exactly one Acquire in flight (until its first ``take``); a worker switches to ``F'``
only with ``finished == W``.  At every processed message: the worker has the key's state,
and the message is the next of its key in production order (none lost, none repeated).
At every delivery: no message crosses the same channel twice in a migration (no
ping-pong).  At the end: every run terminates (no event left, within ``max_steps``) with
every message processed, none waiting, every worker on the last layout.  A failed check
raises :class:`Violation` naming the invariant.
"""

from __future__ import annotations

import random
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from circuits.layouts import initial, rescale
from circuits.vnodes import DEFAULT_VNODES, Layout
from gateway.icadd import (
    DOWN,
    Acquire,
    Collect,
    Data,
    Distributor,
    Drop,
    Envelope,
    IcaddMessage,
    Interrogate,
    Out,
    Phase,
    Placement,
    Rules,
)

OPERATOR = "source"
WEIGHTS = (0.02, 0.2, 1.0, 5.0)
"""The speeds an event source can get in a run: a factor 250 between the slowest and the
fastest makes lagging workers (the ping-pong cases) common."""


class Violation(AssertionError):
    """An invariant failed; ``kind`` is ``state``, ``order``, ``pingpong`` or ``termination``."""

    def __init__(self, kind: str, message: str):
        super().__init__(f"{kind}: {message}")
        self.kind = kind


@dataclass(frozen=True)
class Scenario:
    """Migrations through layouts of ``sizes`` workers (``W``, ``W'``, ...) while
    ``messages[i]`` messages of ``keys[i]`` are produced at worker ``producers[i]`` (one of
    every layout: below ``min(sizes)``)."""

    sizes: tuple[int, ...]
    keys: tuple[str, ...]
    messages: tuple[int, ...]
    producers: tuple[int, ...]
    paths: int = 1
    trigger: int = 0
    seed: int = 0
    vnodes: int = DEFAULT_VNODES

    def layouts(self) -> list[Layout]:
        """One layout per size, each from the one before by the project's least-movement
        rescale."""
        layouts = [initial(self.vnodes, self.sizes[0])]
        for size in self.sizes[1:]:
            layouts.append(rescale(layouts[-1], size))
        return layouts


@dataclass
class Result:
    counts: Counter[str]
    """Rule applications summed over the workers (``rule3.sender``: ping-pong 1;
    ``version.pingpong``: ping-pong 2) and the scheduler's events."""
    moved: list[str]
    """The keys handed over, one entry per key and migration."""
    steps: int


@dataclass(eq=False)
class _Worker:
    distributor: Distributor
    paths: list[deque[Any]]
    state: dict[str, tuple[int, ...]] = field(default_factory=dict)
    given: set[str] = field(default_factory=set)
    """Keys whose Acquire this worker has sent and not yet dropped: their state has left."""
    begun: bool = False


class Simulation:
    """One run of ``scenario`` with distributors applying ``rules`` (see the module)."""

    def __init__(
        self, scenario: Scenario, rules: Rules = Rules(), *, check_pingpong: bool = True, max_steps: int = 20_000
    ):
        if len(scenario.sizes) < 2 or max(scenario.producers, default=0) >= min(scenario.sizes):
            raise ValueError("a scenario needs two sizes or more and producers present in every layout")
        self.scenario, self.rules = scenario, rules
        self.check_pingpong, self.max_steps = check_pingpong, max_steps
        self.layouts = scenario.layouts()
        self.stage = 0
        """The next or current migration: ``layouts[stage] -> layouts[stage + 1]``."""
        self.migrating = False
        self.workers: dict[int, _Worker] = {}
        self.leaving: set[int] = set()
        """Workers of the last migration's ``W`` only, until nothing is on its way to or from them."""
        self.channels: dict[tuple[int, int], deque[Envelope]] = {}
        for w in range(scenario.sizes[0]):
            self._join(w)
        self.rng = random.Random(scenario.seed)
        self.weights: dict[tuple, float] = {}
        self.produced = Counter[str]()
        self.processed: set[tuple[str, int]] = set()
        self.crossed: dict[tuple[str, int, int], set[tuple[int, int]]] = {}
        self.acquires: list[Acquire] = []
        """Acquires sent and not yet taken."""
        self.counts = Counter[str]()
        self.moved: list[str] = []

    # -- running --------------------------------------------------------------------------------

    def run(self) -> Result:
        steps = 0
        while events := self.enabled():
            if steps == self.max_steps:
                raise Violation("termination", f"still running after {steps} events: {self.describe()}")
            self.fire(self.rng.choices(events, [self._weight(e) for e in events])[0])
            self.check()
            steps += 1
        self.check_end()
        counts = self.counts.copy()
        for worker in self.workers.values():
            counts.update(worker.distributor.counts)
        return Result(counts, self.moved, steps)

    def enabled(self) -> list[tuple]:
        self._advance()
        events: list[tuple] = []
        sc = self.scenario
        events += [("produce", key) for key, total in zip(sc.keys, sc.messages) if self.produced[key] < total]
        for w, worker in self.workers.items():
            if self.migrating and not worker.begun:
                events.append(("begin", w, self.stage))
            d = worker.distributor
            if d.phase is Phase.COLLECT and d.whitelist:
                events.append(("collect", w))
            events += [("process", w, i) for i, path in enumerate(worker.paths) if path]
        events += [("deliver", a, b) for (a, b), channel in self.channels.items() if channel]
        return events

    def _advance(self) -> None:
        """Ends the migration under way once every worker is on its new layout; removes the
        workers that left once they are quiet; starts the next migration when due."""
        if self.migrating and all(
            w.distributor.phase is Phase.STEADY and w.distributor.version == self.stage + 1
            for w in self.workers.values()
        ):
            self.migrating = False
            self.stage += 1
            self.leaving = set(self.workers) - set(range(self.scenario.sizes[self.stage]))
        for w in sorted(self.leaving):
            if self._quiet(w):
                self._leave(w)
        total = sum(self.scenario.messages)
        due = sum(self.produced.values()) >= min(self.scenario.trigger * (self.stage + 1), total)
        if not self.migrating and not self.leaving and self.stage + 1 < len(self.layouts) and due:
            self.migrating = True
            for w in range(self.scenario.sizes[self.stage + 1]):
                if w not in self.workers:
                    self._join(w)
            for worker in self.workers.values():
                worker.begun = False

    def _join(self, w: int) -> None:
        paths = [deque() for _ in range(self.scenario.paths)]
        distributor = Distributor(
            w, self.layouts[self.stage], version=self.stage, paths=self.scenario.paths, rules=self.rules
        )
        self.workers[w] = _Worker(distributor, paths)
        for other in self.workers:
            if other != w:
                self.channels[(w, other)] = deque()
                self.channels[(other, w)] = deque()

    def _quiet(self, w: int) -> bool:
        """Nothing left at ``w``, or on its way from it, or on its way to it but stale control messages."""
        worker = self.workers[w]
        if any(worker.paths) or any(q for (a, _), q in self.channels.items() if a == w):
            return False
        return not any(isinstance(e.body, (Data, Acquire)) for (_, b), q in self.channels.items() if b == w for e in q)

    def _leave(self, w: int) -> None:
        worker = self.workers.pop(w)
        if worker.state or worker.distributor.layout != self.layouts[self.stage]:
            raise Violation("state", f"worker {w} leaves holding {sorted(worker.state)}")
        self.leaving.discard(w)
        for pair in [pair for pair in self.channels if w in pair]:
            del self.channels[pair]

    def _weight(self, event: tuple) -> float:
        if event not in self.weights:
            self.weights[event] = self.rng.choice(WEIGHTS)
        return self.weights[event]

    def fire(self, event: tuple) -> None:
        self.counts["event." + event[0]] += 1
        kind = event[0]
        if kind == "produce":
            self._produce(event[1])
        elif kind == "begin":
            worker = self.workers[event[1]]
            worker.begun = True
            self.emit(event[1], worker.distributor.begin(self.layouts[self.stage + 1]))
        elif kind == "collect":
            d = self.workers[event[1]].distributor
            self.emit(event[1], d.collect(self.rng.choice(sorted(d.whitelist))))
        elif kind == "deliver":
            self._deliver(event[1], event[2])
        else:
            self._process(event[1], event[2])

    def _produce(self, key: str) -> None:
        producer = self.scenario.producers[self.scenario.keys.index(key)]
        seq = self.produced[key]
        self.produced[key] += 1
        self.emit(producer, self.workers[producer].distributor.offer(Data(key, seq)))

    def _deliver(self, src: int, dst: int) -> None:
        envelope = self.channels[(src, dst)].popleft()
        if isinstance(envelope.body, Data) and self.check_pingpong:
            ident = (envelope.body.key, envelope.body.payload, self.stage)
            crossed = self.crossed.setdefault(ident, set())
            if (src, dst) in crossed:
                raise Violation("pingpong", f"message {ident[:2]} crosses {src}->{dst} a second time")
            crossed.add((src, dst))
        self.emit(dst, self.workers[dst].distributor.receive(envelope))

    def emit(self, w: int, out: Out) -> None:
        """Delivers a distributor's outputs to its channels and paths."""
        worker = self.workers[w]
        for dest, message in out:
            if dest is DOWN:
                targets = worker.paths if isinstance(message, IcaddMessage) else worker.paths[:1]
                for path in targets:
                    path.append(message)
                continue
            assert isinstance(dest, int) and isinstance(message, Envelope)
            if (w, dest) not in self.channels:
                raise Violation("state", f"worker {w} sends {message.body} to worker {dest}, which has left")
            if isinstance(message.body, Acquire):
                worker.given.add(message.body.key)
                self.acquires.append(message.body)
                self.moved.append(message.body.key)
            self.channels[(w, dest)].append(message)

    # -- the operator ---------------------------------------------------------------------------

    def _process(self, w: int, i: int) -> None:
        """The region's operator (a source) handles the first item of path ``i``."""
        worker = self.workers[w]
        item = worker.paths[i].popleft()
        if isinstance(item, Data):
            self._apply(w, item)
            return
        if isinstance(item, Interrogate):
            item.add_keys(worker.state)
        elif isinstance(item, Collect):
            if item.key in worker.state:
                item.add_state(OPERATOR, worker.state[item.key])
        elif isinstance(item, Acquire):
            self._take(w, item)
        elif isinstance(item, Drop) and item.drop(OPERATOR):
            worker.state.pop(item.key, None)
            worker.given.discard(item.key)
        self.emit(w, worker.distributor.processed(item))

    def _apply(self, w: int, data: Data) -> None:
        state = self.workers[w].state
        if data.key not in state and any(key == data.key for key, _ in self.processed):
            raise Violation(
                "state",
                f"worker {w} processes message {data.payload} of {data.key!r} without its "
                f"state, which is {self._whereabouts(data.key)}",
            )
        seen = state.get(data.key, ())
        if data.payload != len(seen):
            raise Violation("order", f"worker {w} processes message {data.payload} of {data.key!r} after {list(seen)}")
        self.processed.add((data.key, data.payload))
        state[data.key] = seen + (data.payload,)

    def _take(self, w: int, acquire: Acquire) -> None:
        state = acquire.take(OPERATOR)
        if acquire in self.acquires:
            self.acquires.remove(acquire)
        if state is None:
            return
        if acquire.key in self.workers[w].state:
            raise Violation("state", f"worker {w} acquires {acquire.key!r} while it has state for it")
        self.workers[w].state[acquire.key] = state

    # -- invariants -----------------------------------------------------------------------------

    def _whereabouts(self, key: str) -> str:
        at = [w for w, worker in self.workers.items() if key in worker.state and key not in worker.given]
        return f"at workers {at}, in {sum(1 for a in self.acquires if a.key == key)} Acquires in flight"

    def check(self) -> None:
        """Each key with state has it at exactly one worker or in exactly one Acquire; a
        worker routes by ``F'`` alone only once its ``finished`` set is ``W``."""
        old = Placement(self.layouts[self.stage]).workers
        for w, worker in self.workers.items():
            d = worker.distributor
            if d.phase is Phase.SWITCH and not d.finished >= old:
                raise Violation("termination", f"worker {w} switched with finished = {sorted(d.finished)}")
        for key in {key for key, _ in self.processed}:
            at = [w for w, worker in self.workers.items() if key in worker.state and key not in worker.given]
            if len(at) + sum(1 for a in self.acquires if a.key == key) != 1:
                raise Violation("state", f"{key!r} has state {self._whereabouts(key)}")

    def check_end(self) -> None:
        total = sum(self.scenario.messages)
        if len(self.processed) != total:
            raise Violation("order", f"{total - len(self.processed)} messages were never processed: {self.describe()}")
        last = self.layouts[-1]
        if self.stage != len(self.layouts) - 1 or set(self.workers) != set(range(last.workers)):
            raise Violation("termination", f"stopped before the last migration ended: {self.describe()}")
        for w, worker in self.workers.items():
            d = worker.distributor
            if d.phase is not Phase.STEADY or d.layout != last or d.version != self.stage:
                raise Violation(
                    "termination",
                    f"worker {w} stopped in {d.phase.value} on {d.layout.workers} "
                    f"workers, version {d.version}: {self.describe()}",
                )
        placement = Placement(last)
        for key, _ in self.processed:
            owners = [w for w, worker in self.workers.items() if key in worker.state]
            if owners != [placement.worker(key)]:
                raise Violation("state", f"{key!r} ends at {owners}, not at F'(K) = {placement.worker(key)}")

    def describe(self) -> str:
        phases = {w: worker.distributor.phase.value for w, worker in self.workers.items()}
        busy = {c: len(q) for c, q in self.channels.items() if q}
        return f"migration {self.stage + 1} of {len(self.layouts) - 1}, phases {phases}, channels {busy}"


def simulate(scenario: Scenario, rules: Rules = Rules(), **options: Any) -> Result:
    """Runs ``scenario`` once; raises :class:`Violation` when an invariant fails."""
    return Simulation(scenario, rules, **options).run()
