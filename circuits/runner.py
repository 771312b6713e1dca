"""Runs a circuit one step at a time against a state store.

A step is planned lazily and executed as one fused Spark job: every output and every
staged state delta is packed into one DataFrame (one struct column per destination),
so shuffles that several destinations share run once.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import reduce
from typing import Mapping

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from .circuit import Circuit
from .context import StepContext
from .errors import CircuitChangedError, SchemaMismatchError
from .sharding import Layout
from .state import StateStore
from .zset import empty

FINGERPRINT_KEY = "circuit_fingerprint"
_DEST = "_dest"


def pack(parts: Mapping[str, DataFrame]) -> DataFrame:
    """All ``parts`` as one DataFrame: a destination number and one struct column per part."""
    branches = [
        df.select(F.lit(i).alias(_DEST), F.struct(*df.columns).alias(f"_d{i}")) for i, df in enumerate(parts.values())
    ]
    return reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), branches)


def unpack(packed: DataFrame, names: list[str]) -> dict[str, DataFrame]:
    """The inverse of :func:`pack`, over a materialized ``packed``."""
    return {name: packed.where(F.col(_DEST) == i).select(f"_d{i}.*") for i, name in enumerate(names)}


@dataclass
class StepResult:
    packed: DataFrame
    """The materialized step: every output and state delta, packed."""
    outputs: dict[str, DataFrame]
    """Each output handle's consolidated delta, over ``packed``."""
    state: dict[str, DataFrame]
    """Each state table's delta of this step, over ``packed``."""

    def collect_outputs(self) -> dict[str, list[tuple]]:
        """Every output's rows (user columns, then the weight) with a single Spark job."""
        names = list(self.outputs)
        rows: dict[str, list[tuple]] = {name: [] for name in names}
        for row in self.packed.where(F.col(_DEST) < len(names)).collect():
            i = row[_DEST]
            rows[names[i]].append(tuple(row[f"_d{i}"]))
        return rows


class StepRunner:
    """Runs ``circuit`` step after step on ``store`` with ``layout`` (or ``workers`` balanced)."""

    def __init__(
        self,
        circuit: Circuit,
        spark: SparkSession,
        store: StateStore,
        *,
        workers: int = 1,
        layout: Layout | None = None,
    ) -> None:
        self.circuit = circuit
        self.spark = spark
        self.store = store
        self.layout = layout or Layout.balanced(circuit.vnodes, workers)
        fingerprint = circuit.fingerprint()
        stored = store.get_meta(FINGERPRINT_KEY)
        if stored is not None and stored != fingerprint:
            raise CircuitChangedError(
                f"circuit {circuit.name!r} has fingerprint {fingerprint}, but its state was written by a circuit "
                f"with fingerprint {stored}. Changing a running circuit is not supported: restore the original "
                "circuit definition, or start the changed circuit on a new, empty state location."
            )
        self.output_schemas = circuit.check(spark)
        if stored is None:
            store.set_meta(FINGERPRINT_KEY, fingerprint)

    def step(self, inputs: Mapping[str, DataFrame]) -> StepResult:
        """Runs one step on the input deltas (absent inputs are empty) and applies its state."""
        unknown = sorted(set(inputs) - set(self.circuit.inputs))
        if unknown:
            raise SchemaMismatchError(
                f"circuit {self.circuit.name!r} has no input(s) {unknown}; its inputs are {sorted(self.circuit.inputs)}"
            )
        full = {
            name: inputs[name] if name in inputs else empty(self.spark, schema)
            for name, schema in self.circuit.inputs.items()
        }
        # Spark's own shuffles (there should be none left after the exchanges) use one partition per worker.
        self.spark.conf.set("spark.sql.shuffle.partitions", str(self.layout.workers))
        ctx = StepContext(self.spark, self.store, self.layout, full)
        outputs = self.circuit.plan(ctx)
        names = [*outputs, *ctx.staged]  # outputs first: collect_outputs relies on it
        packed = self.store.materialize(pack({**outputs, **ctx.staged}))
        stored = unpack(packed, names)
        state = {table: stored[table] for table in ctx.staged}
        self.store.apply(state)
        return StepResult(packed, {name: stored[name] for name in outputs}, state)
