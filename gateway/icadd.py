"""ICADD (docs/gateway.md): moving the gateway's per-source state between workers while it runs.

The gateway's workers each run a :class:`Distributor`, ICADD's distributor operator,
in front of the keyed region of that worker: the sources.  Keys are source ids; data
messages (:class:`Data`) are "source K has work" notifications and the source's bytes,
in order per key; a key's state is an opaque value (the live gateway puts a source's
cursor, partly filled buffer and settings there).  Placement is ``F(K, W)``: the owner
of the key's vnode ``pmod(xxhash64(K), S)`` in a layout of :mod:`circuits.layouts`
(:class:`Placement`), so ``W -> W + 1`` moves about ``1 / (W + 1)`` of the sources.

A distributor does no I/O.  Its inputs are method calls: :meth:`Distributor.offer` (the
local upstream), :meth:`Distributor.receive` (an :class:`Envelope` from another worker),
:meth:`Distributor.processed` (a downstream operator has processed a copy of an ICADD
message), :meth:`Distributor.begin` (the trigger of a migration) and
:meth:`Distributor.collect` (move one key of ``whitelist``).  Each returns the list of
``(destination, message)`` it wants sent: ``DOWN`` for its local downstream, a worker id
for another worker (the message is then an :class:`Envelope` carrying the sender's
version).  Whoever calls it delivers them: the simulator (``tests/gateway/icadd_sim.py``)
or the live gateway.  It assumes, like ICADD, FIFO channels: between two workers (per ordered
pair) and along each downstream path.

What the caller must also do: start one migration at a time (the next ``begin`` only once
every worker is back in ``STEADY``); create a joining worker with the current layout and
version; stop a leaving worker only once it is ``STEADY`` and nothing is on its way to or
from it; hand every worker of ``W | W'`` the same new layout.

The rules, with ICADD's numbering (see :meth:`Distributor._decide`):

* Before and after a migration, one layout: ``F(K) == Local`` -> downstream, else -> ``F(K)``.
* Interrogate (``begin``): rule 1.1 ``F == Local && F' != Local`` -> add K to ``whitelist``,
  downstream; rule 1.2 ``F == Local && F' == Local`` -> downstream; rule 2 ``F != Local``
  -> ``F(K)``.  :class:`Interrogate` goes downstream; operators call ``add_keys``.
* Collect (every copy of Interrogate processed): version + 1, ``whitelist`` pruned of the
  keys with ``F' == Local``; rule 1.1 ``F' != Local && K in whitelist`` -> downstream;
  rule 1.2 ``F' != Local && K in hold`` -> buffer; rule 2 ``F' != Local`` otherwise ->
  ``F'(K)``; rule 3 ``F' == Local && K not in whitelist`` -> downstream when ``F(K) ==
  Sender`` (ping-pong 1), else -> ``F(K)``.
* Moving a key (``collect``): K from ``whitelist`` to ``hold``; :class:`Collect` (K)
  downstream, operators call ``add_state``; then :class:`Acquire` (K) to ``F'(K)``, the
  buffered messages of K after it on the same channel, :class:`Drop` (K) downstream.
* Multi-pathing: ``add_keys`` idempotent, the last ``add_state`` wins, the first ``take``
  wins, and (not in ICADD, by the same argument) the first copy of Drop drops.
* Done: ``whitelist`` and ``hold`` empty -> :class:`Done` to every worker of ``W | W'``;
  ``finished == W`` -> ``F' != Local`` -> ``F'(K)``, ``F' == Local`` -> downstream; then
  the sets are dropped and ``F`` forgotten.  Done (and Flush, Drained) carry the version
  of their migration: one of a migration already over at the receiver is ignored, one
  that arrives before the trigger counts.
* The version rule, always: a data message whose version is higher than the receiver's is
  passed downstream (ping-pong 2).
* Regions: ICADD messages coming from upstream (a previous region) are discarded.

Two additions ICADD's text needs for its own guarantees (state at one place, causal
order per key); each can be switched off in :class:`Rules` so that the simulator shows
what breaks without it:

* ``rule2_via_old_owner``: rule 2 sends to ``F'(K)`` only when ``F(K) == Local`` (this
  worker held K and has handed it over, or K is new); otherwise to ``F(K)``, the old
  owner, which holds, buffers or forwards it.  Literally "via F'", a third worker's
  message reaches a new owner that is still in Interrogate, whose version rule passes it
  downstream while the old owner still has the state: the key's state is split.
* ``switch_barrier``: when ``finished == W`` a worker sends :class:`Flush` to every
  worker; an old worker that has a Flush from every other worker sends :class:`Drained`
  to every worker (by FIFO, everything that reached it along an old route has been
  forwarded).  A message whose route changes at the switch (sent by a switched worker ``S``
  with ``F(K) != S``, or produced here after the switch with ``F(K) != Local``) waits until
  every other old worker is Drained; the old owner's own route to ``F'(K)`` does not
  change, so its messages never wait.  Drained waits for Flushes only, never for waiting
  messages, so the barrier cannot deadlock.  The migration ends at a worker once it has
  every other old worker's Drained and has sent its own.  Without the barrier a message
  sent directly after the switch overtakes one still travelling through the old owner
  (the old routes: third worker -> ``F(K)`` -> ``F'(K)``, and ``F'(K)`` -> ``F(K)`` ->
  ``F'(K)`` by rule 3), or reaches a new worker that has not begun before the key's
  :class:`Acquire` (the version rule passes it).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Final

from circuits.vnodes import Layout, vnode_of_key

# -- placement: F(K, W) ------------------------------------------------------------------------


@dataclass(frozen=True)
class Placement:
    """``F(K, W)``: a source runs on the owner of its vnode in ``layout``."""

    layout: Layout

    @property
    def workers(self) -> frozenset[int]:
        """``W``."""
        return frozenset(range(self.layout.workers))

    def worker(self, key: str) -> int:
        return self.layout.owners[vnode_of_key(key, self.layout.vnodes)]


# -- messages ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Data:
    """A data message of key ``key``: "source K has work" or some of its bytes."""

    key: str
    payload: Any


@dataclass(eq=False)
class IcaddMessage:
    """An ICADD message sent downstream, copied onto each of ``copies`` paths (multi-pathing).
    The count is ICADD's reference count: the distributor acts when it drops to 0."""

    copies: int = 1

    def processed(self) -> bool:
        """One copy processed; whether it was the last."""
        self.copies -= 1
        return self.copies == 0


@dataclass(eq=False)
class Interrogate(IcaddMessage):
    keys: set[str] = field(default_factory=set)

    def add_keys(self, keys: Iterable[str]) -> None:
        """Idempotent: a second copy adds only the keys obtained in between (multi-pathing)."""
        self.keys.update(keys)


@dataclass(eq=False)
class Collect(IcaddMessage):
    key: str = ""
    states: dict[str, Any] = field(default_factory=dict)

    def add_state(self, operator: str, state: Any) -> None:
        """The last call wins: a later copy carries a more recent state (multi-pathing)."""
        self.states[operator] = state


@dataclass(eq=False)
class Acquire(IcaddMessage):
    key: str = ""
    states: dict[str, Any] = field(default_factory=dict)
    taken: set[str] = field(default_factory=set)

    def take(self, operator: str) -> Any | None:
        """The first call returns the operator's state, later ones ``None``: between two
        copies, data of the key may already have changed the state (multi-pathing)."""
        if operator in self.taken:
            return None
        self.taken.add(operator)
        return self.states.get(operator)


@dataclass(eq=False)
class Drop(IcaddMessage):
    key: str = ""
    dropped: set[str] = field(default_factory=set)

    def drop(self, operator: str) -> bool:
        """Whether the operator drops its state for K now: on the first copy only.  Not in the
        seed, the same argument as for ``take``: a later copy may come after the key has come
        back in a later migration (an Acquire queued behind this Drop on another path) and
        must not drop the state that came back."""
        if operator in self.dropped:
            return False
        self.dropped.add(operator)
        return True


@dataclass(frozen=True)
class Done:
    """``Done(WorkerId)``: the worker has no more state to give."""

    worker: int


@dataclass(frozen=True)
class Flush:
    """Addition ``switch_barrier``: the worker has switched to ``F'``; behind this on the
    channel come only messages routed by ``F'``."""

    worker: int


@dataclass(frozen=True)
class Drained:
    """Addition ``switch_barrier``: an old worker has forwarded every message that reached
    it along an old route (it has a :class:`Flush` from every other worker)."""

    worker: int


@dataclass(frozen=True)
class Envelope:
    """What travels between workers: the sender, its version (always attached) and a
    :class:`Data`, :class:`Acquire`, :class:`Done`, :class:`Flush` or :class:`Drained`."""

    sender: int
    version: int
    body: Data | Acquire | Done | Flush | Drained


class _Down:
    def __repr__(self) -> str:
        return "DOWN"


DOWN: Final = _Down()
"""The destination "local downstream"."""

Destination = int | _Down
Out = list[tuple[Destination, Any]]


@dataclass(frozen=True)
class Rules:
    """Which rules a distributor applies: all by default.  The simulator switches them off
    one at a time to show what each one guards (mutation checks)."""

    version_rule: bool = True
    """Pass downstream a data message whose version is higher than ours (ping-pong 2)."""
    rule3_sender_check: bool = True
    """Rule 3: ``F(K) == Sender`` -> downstream (ping-pong 1)."""
    rule2_via_old_owner: bool = True
    """Addition: rule 2 sends to ``F'`` only for keys this worker owned under ``F``."""
    switch_barrier: bool = True
    """Addition: the Flush / Drained barrier at the switch to ``F'``."""


class Phase(str, Enum):
    STEADY = "steady"
    """One layout; no migration under way here."""
    INTERROGATE = "interrogate"
    COLLECT = "collect"
    SWITCH = "switch"
    """``finished == W``: routing by ``F'`` only; the switch barrier is still closing."""


# -- the distributor ---------------------------------------------------------------------------


class Distributor:
    """ICADD's distributor of worker ``me`` (see the module for its rules).

    ``paths`` is how many copies of every ICADD message go downstream (the number of
    paths from the distributor to the region's operators); data goes down once.
    """

    def __init__(self, me: int, layout: Layout, *, version: int = 0, paths: int = 1, rules: Rules = Rules()):
        self.me = me
        self.old = Placement(layout)
        self.new: Placement | None = None
        self.version = version
        self.paths = paths
        self.rules = rules
        self.phase = Phase.STEADY
        self.whitelist: set[str] = set()
        self.hold: dict[str, list[Data]] = {}
        """The keys being collected and their buffered messages, in arrival order."""
        self.finished: set[int] = set()
        self.counts: Counter[str] = Counter()
        """How often each rule applied: ``rule1.1``, ``rule3.sender`` (ping-pong 1),
        ``version.pingpong`` (ping-pong 2) and so on."""
        self._moved: list[str] = []
        self._flushed: set[int] = set()
        """Workers whose Flush reached us: what they send now is routed by ``F'``."""
        self._drained: set[int] = set()
        self._sent_drained = False
        self._waiting: list[tuple[int, Data]] = []
        """Messages whose route changed at the switch, until the barrier closes."""

    # -- inputs ---------------------------------------------------------------------------------

    @property
    def layout(self) -> Layout:
        """The layout this worker routes by outside a migration."""
        return self.old.layout

    @property
    def migration(self) -> int:
        """The version the current or next migration leads to."""
        return self.version + (self.phase in (Phase.STEADY, Phase.INTERROGATE))

    @property
    def moved(self) -> list[str]:
        """The keys this worker handed over in the current or last migration."""
        return list(self._moved)

    def status(self) -> dict[str, Any]:
        """What ``dbsp gateway status`` shows of the distributor."""
        return {
            "worker": self.me,
            "phase": self.phase.value,
            "version": self.version,
            "workers": self.old.layout.workers,
            "to_workers": self.new.layout.workers if self.new else None,
            "whitelist": len(self.whitelist),
            "hold": len(self.hold),
            "finished": sorted(self.finished),
            "moved": len(self._moved),
            "waiting": len(self._waiting),
        }

    def offer(self, item: Data | IcaddMessage) -> Out:
        """A message from the local upstream.  An ICADD message there comes from a previous
        keyed region's distributor and is discarded: ICADD messages do not cross a
        distributor (appendix, "Keyed Regions")."""
        if isinstance(item, IcaddMessage):
            return []
        return self._data(self.me, item)

    def receive(self, envelope: Envelope) -> Out:
        """A message from another worker."""
        body = envelope.body
        if isinstance(body, Data):
            return self._data(envelope.sender, body, envelope.version)
        if isinstance(body, Acquire):
            # The receiving worker sends Acquire(K) downstream, where operators ``take``.
            body.copies = self.paths
            return [(DOWN, body)]
        if envelope.version != self.migration:
            # Done, Flush and Drained of a migration are sent at its new version.  One of a
            # migration already over here is stale (a Flush that arrives after the barrier
            # closed): ignored.  One for the migration this worker has not begun yet counts.
            return []
        if isinstance(body, Done):
            self.finished.add(body.worker)
            return self._progress()
        if isinstance(body, Flush):
            self._flushed.add(body.worker)
            return self._progress()
        self._drained.add(body.worker)
        return self._progress()

    def begin(self, layout: Layout) -> Out:
        """Interrogation phase: new empty ``whitelist`` and ``hold`` (``finished`` keeps any
        Done that arrived before the trigger reached this worker); Interrogate downstream."""
        if self.phase is not Phase.STEADY:
            raise ValueError(f"worker {self.me} is already migrating ({self.phase.value})")
        self.new = Placement(layout)
        self.phase = Phase.INTERROGATE
        self.whitelist, self.hold, self._moved = set(), {}, []
        return [(DOWN, Interrogate(copies=self.paths))]

    def processed(self, message: IcaddMessage) -> Out:
        """A downstream operator has processed one copy of ``message``; the distributor acts
        once every copy is processed."""
        if not message.processed():
            return []
        if isinstance(message, Interrogate):
            return self._enter_collect(message)
        if isinstance(message, Collect):
            return self._acquire(message)
        return []

    def collect(self, key: str | None = None) -> Out:
        """Moving state, step 1: a key (``key``, or the smallest) from ``whitelist`` to
        ``hold``; from now on its messages are buffered (rule 1.2), and Collect(K) goes
        downstream, where operators ``add_state``."""
        if self.phase is not Phase.COLLECT or not self.whitelist:
            return []
        key = key if key is not None else min(self.whitelist)
        self.whitelist.remove(key)
        self.hold[key] = []
        return [(DOWN, Collect(copies=self.paths, key=key))]

    # -- routing --------------------------------------------------------------------------------

    def _data(self, sender: int, data: Data, version: int | None = None) -> Out:
        if self._must_wait(sender, data):
            self.counts["barrier.wait"] += 1
            self._waiting.append((sender, data))
            return []
        action, target, rule = self._decide(data.key, sender)
        if version is not None and version > self.version and action != "down":
            # The version rule (ICADD: "a special rule, which applies always"): the sender
            # has left Interrogate and we have not, so it routes by F' and is right.
            if self.rules.version_rule:
                self.counts["version.pingpong" if target == sender else "version.other"] += 1
                return self._down(data)
        self.counts[rule] += 1
        if action == "down":
            return self._down(data)
        if action == "buffer":
            self.hold[data.key].append(data)
            return []
        if target == self.me:
            return self._down(data)
        return [(target, self._envelope(data))]

    def _decide(self, key: str, sender: int) -> tuple[str, int, str]:
        """What the current phase's rules do with a message of ``key`` from ``sender``:
        ``(action, worker, rule)`` with action ``down``, ``send`` (to ``worker``) or ``buffer``."""
        me, f = self.me, self.old.worker(key)
        if self.phase is Phase.STEADY:
            return ("down", me, "steady.local") if f == me else ("send", f, "steady.remote")
        assert self.new is not None
        f_new = self.new.worker(key)
        if self.phase is Phase.SWITCH:
            # finished == W: "F' != Local -> distribute via F'; F' == Local -> downstream".
            return ("down", me, "final.local") if f_new == me else ("send", f_new, "final.remote")
        if self.phase is Phase.INTERROGATE:
            if f != me:
                return "send", f, "interrogate.2"
            return ("down", me, "interrogate.1.1") if f_new != me else ("down", me, "interrogate.1.2")
        if f_new != me:
            if key in self.whitelist:
                return "down", me, "rule1.1"
            if key in self.hold:
                return "buffer", me, "rule1.2"
            if f == me or not self.rules.rule2_via_old_owner:
                return "send", f_new, "rule2"
            return "send", f, "rule2.old_owner"
        if f == me:
            return "down", me, "rule3.local"
        if f == sender and self.rules.rule3_sender_check:
            return "down", me, "rule3.sender"
        return "send", f, "rule3.remote"

    def _down(self, data: Data) -> Out:
        """Downstream.  In Interrogate every key that goes down and will leave under ``F'``
        enters ``whitelist`` (rule 1.1), also when the version rule sent it: ICADD's
        argument is that whitelist knows "all other keys which went downstream"."""
        if self.phase is Phase.INTERROGATE:
            assert self.new is not None
            if self.new.worker(data.key) != self.me:
                self.whitelist.add(data.key)
        return [(DOWN, data)]

    def _envelope(self, body: Data | Acquire | Done | Flush | Drained) -> Envelope:
        return Envelope(self.me, self.version, body)

    # -- phases ---------------------------------------------------------------------------------

    def _enter_collect(self, interrogate: Interrogate) -> Out:
        """Collection phase: version + 1; ``whitelist`` gets the operators' keys and loses
        those with ``F' == Local``, whose state stays; it takes no new key from now on."""
        assert self.new is not None
        self.version += 1
        self.phase = Phase.COLLECT
        self.whitelist |= interrogate.keys
        self.whitelist = {k for k in self.whitelist if self.new.worker(k) != self.me}
        return self._progress()

    def _acquire(self, collect: Collect) -> Out:
        """Every operator has added its state for K: Acquire(K) with the collection to
        ``F'(K)``, K out of ``hold``, its buffered messages after it (same FIFO channel: they
        arrive after the state), Drop(K) downstream."""
        assert self.new is not None
        key = collect.key
        owner = self.new.worker(key)
        out: Out = [(owner, self._envelope(Acquire(key=key, states=dict(collect.states))))]
        out += [(owner, self._envelope(data)) for data in self.hold.pop(key)]
        out.append((DOWN, Drop(copies=self.paths, key=key)))
        self._moved.append(key)
        return out + self._progress()

    def _progress(self) -> Out:
        """Done, the switch to ``F'`` and the barrier, whichever are now due."""
        out: Out = []
        if self.phase is Phase.COLLECT and not self.whitelist and not self.hold:
            if self.me in self.old.workers and self.me not in self.finished:
                self.finished.add(self.me)
                out += self._broadcast(Done(self.me))
            if self.finished >= self.old.workers:
                out += self._switch()
        if self.rules.switch_barrier and self._owes_drained():
            self._sent_drained = True
            out += self._broadcast(Drained(self.me))
        if self.phase is Phase.SWITCH and self._barrier_closed():
            out += self._finish()
        return out

    def _switch(self) -> Out:
        """``finished == W``: route by ``F'`` only; tell every worker (addition ``switch_barrier``)."""
        self.phase = Phase.SWITCH
        self.counts["switch"] += 1
        return self._broadcast(Flush(self.me)) if self.rules.switch_barrier else []

    def _owes_drained(self) -> bool:
        return (
            not self._sent_drained
            and self.new is not None
            and self.me in self.old.workers
            and self._flushed >= self._everyone() - {self.me}
        )

    def _barrier_closed(self) -> bool:
        if not self.rules.switch_barrier:
            return True
        return self._drained >= self.old.workers - {self.me}

    def _must_wait(self, sender: int, data: Data) -> bool:
        """Addition ``switch_barrier``: a message whose route changed at its sender's switch
        waits here until every old worker has forwarded what it got on the old routes."""
        if not self.rules.switch_barrier or (self.phase is Phase.SWITCH and self._barrier_closed()):
            return False
        switched = sender in self._flushed if sender != self.me else self.phase is Phase.SWITCH
        return switched and self.old.worker(data.key) != sender

    def _finish(self) -> Out:
        """The barrier is closed: release what waited (routed by ``F'``).  Once this worker
        also owes no Drained, the migration is over here: drop the sets, forget ``F``."""
        waiting, self._waiting = self._waiting, []
        out: Out = []
        for sender, data in waiting:
            out += self._data(sender, data)
        if not self.rules.switch_barrier or self.me not in self.old.workers or self._sent_drained:
            assert self.new is not None
            self.old, self.new, self.phase = self.new, None, Phase.STEADY
            self.whitelist, self.hold, self.finished = set(), {}, set()
            self._flushed, self._drained, self._sent_drained = set(), set(), False
        return out

    def _everyone(self) -> frozenset[int]:
        assert self.new is not None
        return self.old.workers | self.new.workers

    def _broadcast(self, body: Done | Flush | Drained) -> Out:
        return [(w, self._envelope(body)) for w in sorted(self._everyone() - {self.me})]
