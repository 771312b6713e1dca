"""The embedded local demo: Nexmark views maintained step by step on local Spark."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

from circuits import InMemoryStateStore, StepRunner
from circuits.library import NexmarkGenerator, nexmark_circuit, nexmark_inputs
from circuits.spark import local_session

RECOMPUTE_Q4 = """
SELECT category, avg(final) AS avg_final FROM (
  SELECT a.id, a.category, max(b.price) AS final FROM auctions a JOIN bids b ON a.id = b.auction
  WHERE b.date_time BETWEEN a.date_time AND a.expires GROUP BY a.id, a.category)
GROUP BY category
"""


@dataclass
class DemoResult:
    events: int
    q4: Counter
    q4_matches: bool
    step_seconds: list[float] = field(default_factory=list)


def run_demo(
    steps: int, events_per_step: int, workers: int, seed: int, cores: int, log: Callable[[str], None]
) -> DemoResult:
    """Runs the four Nexmark views for ``steps`` steps of generated events and checks the
    maintained q4 against Spark batch SQL over all the events."""
    spark = local_session(cores=cores, app_name="dbsp-demo")
    circuit = nexmark_circuit()
    runner = StepRunner(circuit, spark, InMemoryStateStore(), workers=workers)
    generator = NexmarkGenerator(seed=seed)
    integral: dict[str, Counter] = {name: Counter() for name in circuit.outputs}
    events, seconds = [], []
    for step in range(steps):
        batch = list(generator.events(step * events_per_step, events_per_step))
        events.extend(batch)
        started = time.perf_counter()
        outputs = runner.step(nexmark_inputs(spark, batch)).collect_outputs()
        seconds.append(time.perf_counter() - started)
        for name, rows in outputs.items():
            for *row, w in rows:
                integral[name][tuple(row)] += w
        changes = ", ".join(f"{name} {len(rows)}" for name, rows in outputs.items())
        log(f"step {step}: {len(batch)} events in, changes out: {changes} ({seconds[-1]:.1f} s)")
    for name, rows in nexmark_inputs(spark, events).items():
        rows.drop("_weight").createOrReplaceTempView(name)
    recomputed = Counter(tuple(r) for r in spark.sql(RECOMPUTE_Q4).collect())
    maintained = +integral["q4"]
    return DemoResult(len(events), maintained, _rounded(maintained) == _rounded(recomputed), seconds)


def _rounded(z: Counter) -> Counter:
    return Counter({tuple(round(v, 6) if isinstance(v, float) else v for v in row): w for row, w in z.items()})
