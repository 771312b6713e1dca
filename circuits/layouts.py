"""Changing a layout: which worker owns which vnode after scaling in or out.

Two strategies (docs/design.md, "Layouts and vnodes"):

* **fixed**: the ``S`` vnodes are the unit.  Workers keep every vnode they can; only the
  surplus of the workers above their new share moves, to the workers below it.  Going
  from ``W`` to ``W + 1`` workers moves about ``S / (W + 1)`` vnodes, the least possible
  (``hash % W`` would move ``W / (W + 1)`` of the data).
* **dynamic**: with a maximum inaccuracy ``k``, the unit is one of ``shards =
  (W / k).next_power_of_two()`` shards (at most ``S``); vnode ``v`` is in shard ``v % shards``.
  When the shard count doubles, each shard splits in two halves that keep their owner;
  when it halves, two shards merge under the owner of more of it.  Then the same
  least-movement rebalance runs on shards.

Both keep every worker within one unit (vnode or shard) of an even share.
"""

from __future__ import annotations

import math
from collections import Counter

from .errors import CircuitDefinitionError
from .vnodes import Layout

STRATEGIES = ("fixed", "dynamic")


def rebalance(owners: list[int], workers: int) -> list[int]:
    """``owners`` (one per unit) reassigned to ``workers`` workers, balanced within one unit,
    moving the fewest units: each worker keeps up to its share; only the rest moves."""
    if workers < 1:
        raise CircuitDefinitionError(f"workers must be at least 1, got {workers}")
    held = Counter(o for o in owners if o < workers)
    base, extra = divmod(len(owners), workers)
    # The workers that hold the most get the one-larger shares: fewer units move.
    ranked = sorted(range(workers), key=lambda w: (-held[w], w))
    share = {w: base + (i < extra) for i, w in enumerate(ranked)}
    kept: Counter = Counter()
    result, freed = list(owners), []
    for unit, owner in enumerate(owners):
        if owner < workers and kept[owner] < share[owner]:
            kept[owner] += 1
        else:
            freed.append(unit)
    takers = [w for w in range(workers) for _ in range(share[w] - kept[w])]
    for unit, worker in zip(freed, takers, strict=True):
        result[unit] = worker
    return result


def shard_count(vnodes: int, workers: int, k: float) -> int:
    """``(W / k).next_power_of_two()``, capped at the number of vnodes."""
    if not 0 < k < 1:
        raise CircuitDefinitionError(f"the dynamic strategy's k must be between 0 and 1 (exclusive), got {k}")
    if vnodes & (vnodes - 1):
        raise CircuitDefinitionError(
            f"the dynamic strategy needs a power-of-two number of vnodes, the circuit has {vnodes}: "
            "use Circuit(vnodes=256) (or another power of two), or the fixed strategy"
        )
    return min(vnodes, 1 << max(0, math.ceil(math.log2(workers / k))))


def initial(vnodes: int, workers: int, strategy: str = "fixed", k: float = 0.1) -> Layout:
    """The first layout of a pipeline."""
    if strategy == "fixed":
        return Layout.balanced(vnodes, workers)
    _check(strategy)
    shards = shard_count(vnodes, workers, k)
    owners = [s * workers // shards for s in range(shards)]
    return _expand(owners, vnodes, workers, k)


def rescale(layout: Layout, workers: int, strategy: str | None = None, k: float | None = None) -> Layout:
    """The layout for ``workers`` workers that moves the fewest vnodes from ``layout``.
    The strategy (and ``k``) default to the layout's own."""
    strategy = strategy or ("dynamic" if layout.shards else "fixed")
    _check(strategy)
    if strategy == "fixed":
        return Layout(tuple(rebalance(list(layout.owners), workers)), workers)
    k = k or layout.k or 0.1
    shards = shard_count(layout.vnodes, workers, k)
    return _expand(rebalance(_regroup(layout, shards), workers), layout.vnodes, workers, k)


def moved(before: Layout, after: Layout) -> list[int]:
    """The vnodes whose owner changes."""
    return [v for v, (a, b) in enumerate(zip(before.owners, after.owners, strict=True)) if a != b]


def _regroup(layout: Layout, shards: int) -> list[int]:
    """The owner of each of ``shards`` shards: the owner of most of its vnodes (a split
    keeps the owner; a merge keeps the majority's)."""
    members: list[Counter] = [Counter() for _ in range(shards)]
    for v, owner in enumerate(layout.owners):
        members[v % shards][owner] += 1
    return [min(c, key=lambda w: (-c[w], w)) for c in members]


def _expand(shard_owners: list[int], vnodes: int, workers: int, k: float) -> Layout:
    shards = len(shard_owners)
    return Layout(tuple(shard_owners[v % shards] for v in range(vnodes)), workers, shards, k)


def _check(strategy: str) -> None:
    if strategy not in STRATEGIES:
        raise CircuitDefinitionError(f"unknown layout strategy {strategy!r}; choose one of {STRATEGIES}")
