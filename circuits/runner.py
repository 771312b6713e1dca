"""Runs a circuit one step at a time against a state store.

A step is planned lazily; the store then computes every output and every staged state
delta with one fused Spark job (see :func:`circuits.state.pack`).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from .circuit import Checked, Circuit
from .context import StepContext
from .errors import CircuitChangedError, SchemaMismatchError, raised_on_executor
from .sharding import VNODE, worker_of
from .spark import COMPILED, INTERPRETED, aggregate_each, set_all
from .state import DEST, FILE, StateStore, pack, part_column
from .vnodes import Layout
from .zset import WEIGHT, empty, nothing

LAYOUT_KEY = "layout"
FINGERPRINT_KEY = "circuit_fingerprint"
APPEND_ONLY_KEY = "append_only_inputs"
OUTPUT_SCHEMAS_KEY = "output_schemas"
NODE_SCHEMAS_KEY = "node_schemas"
OUTPUT = "output:"
SMALL_STEP_ROWS = 100_000
"""A step of at most this many input rows runs in one Spark partition, as one stage:
below it, exchanging rows between workers costs more than the parallelism saves."""
LARGE_STEP_ROWS = 1_000_000
"""A step of more input rows looks each large trace up whole, joined with the step's keys
by a shuffle (as a small trace is): collecting its keys to skip trace files would bring
them all to the driver (a 10M-event step's: 1.3 GB, above Spark's ``maxResultSize``),
broadcasting them would hold them all in each executor, and so many keys admit most files
anyway."""
INTERPRETED_STEP_ROWS = 20_000
"""A step of at most this many input rows interprets its rows; a larger one compiles
(whole-stage code generation).  On ``bids_by_category`` at 1M rows of state, after a few
steps had compiled its code, compiled against interpreted: about even at 10,000 rows, 4%
faster at 30,000 and 20-25% at 100,000 (``bench/RESULTS.md``, session 12)."""
STATE = "state:"


@dataclass
class StepResult:
    outputs: dict[str, DataFrame]
    """Each output handle's consolidated delta, as stored."""
    state: dict[str, DataFrame]
    """Each state table's delta of this step, as stored."""

    def collect_outputs(self) -> dict[str, list[tuple]]:
        """Every output's rows (user columns, then the weight) with a single Spark job."""
        names = list(self.outputs)
        rows: dict[str, list[tuple]] = {name: [] for name in names}
        if names:
            for row in pack(self.outputs).collect():
                i = row[DEST]
                rows[names[i]].append(tuple(row[part_column(i)]))
        return rows


class StepRunner:
    """Runs ``circuit`` step after step on ``store`` with ``layout``, else the layout stored
    with the state, else ``workers`` balanced."""

    def __init__(
        self,
        circuit: Circuit,
        spark: SparkSession,
        store: StateStore,
        *,
        workers: int = 1,
        layout: Layout | None = None,
        small_step_rows: int | None = None,
    ) -> None:
        self.circuit = circuit
        self._executor_errors = tuple(dict.fromkeys(k for n in circuit.nodes for k in n.operator.executor_errors))
        self.small_step_rows = SMALL_STEP_ROWS if small_step_rows is None else small_step_rows
        self.spark = spark
        self.store = store
        # The layout is part of the state: recovery and later steps use the stored one, so
        # ``workers`` only shapes a new pipeline (change it with a layout change).
        stored_layout = store.get_meta(LAYOUT_KEY)
        self.layout = layout or (
            Layout.from_json(stored_layout) if stored_layout else Layout.balanced(circuit.vnodes, workers)
        )
        fingerprint = circuit.fingerprint()
        stored = store.get_meta(FINGERPRINT_KEY)
        if stored is not None and stored != fingerprint:
            raise CircuitChangedError(
                f"circuit {circuit.name!r} has fingerprint {fingerprint}, but its state was written by a circuit "
                f"with fingerprint {stored}. Changing a running circuit is not supported: restore the original "
                "circuit definition, or start the changed circuit on a new, empty state location."
            )
        if stored is None:
            # A new state: find unresolvable expressions before any data is read.  State
            # written by this same circuit (same fingerprint) has passed the check already.
            checked = circuit.check(spark)
            store.set_meta(FINGERPRINT_KEY, fingerprint)
            store.set_meta(OUTPUT_SCHEMAS_KEY, json.dumps({name: s.jsonValue() for name, s in checked.outputs.items()}))
            store.set_meta(NODE_SCHEMAS_KEY, checked.to_json())
            store.set_meta(APPEND_ONLY_KEY, json.dumps(sorted(circuit.inputs)))
        elif store.get_meta(NODE_SCHEMAS_KEY) is None:  # a state from before they were recorded
            store.set_meta(NODE_SCHEMAS_KEY, circuit.check(spark).to_json())
        # Steps plan with these instead of asking Spark for the schemas of frames.
        self.schemas = Checked.nodes_from_json(store.get_meta(NODE_SCHEMAS_KEY))
        store.set_meta(LAYOUT_KEY, self.layout.to_json())
        # Inputs that have never retracted a row (state written before this was recorded: none).
        self.append_only = frozenset(json.loads(store.get_meta(APPEND_ONLY_KEY) or "[]"))
        # When set, a step whose every input is empty is known to change nothing: its outputs
        # are empty with these schemas, and it needs no planning.
        schemas = json.loads(store.get_meta(OUTPUT_SCHEMAS_KEY) or "null")
        self._empty_outputs = (
            {name: T.StructType.fromJson(s) for name, s in schemas.items()}
            if schemas is not None and all(n.operator.zero_preserving for n in circuit.nodes)
            else None
        )

    def step(
        self,
        inputs: Mapping[str, DataFrame],
        retracting: Collection[str] | None = None,
        rows: int | None = None,
        *,
        conformed: bool = False,
    ) -> StepResult:
        """Runs one step on the input deltas and applies its state.  Absent inputs are
        empty, and known to be so: pass only the inputs that may hold rows, and operators
        fed only by empty inputs plan nothing.

        ``retracting`` names the inputs whose delta may hold a negative weight, when the
        caller knows (a durable input log does, from its file statistics); otherwise one
        small Spark job finds out.  Operators over inputs that never retract take cheaper
        paths (see :attr:`circuits.context.NodeContext.append_only`).

        ``rows``, when the caller knows it, is the number of input rows of the step: a step
        of at most :attr:`small_step_rows` is planned in one Spark partition (see
        :attr:`circuits.context.StepContext.single`).  ``conformed`` says that the deltas
        have their inputs' declared schemas (a durable input log wrote them so): they are
        not checked again, which would ask Spark for each one's schema."""
        unknown = sorted(set(inputs) - set(self.circuit.inputs))
        if unknown:
            raise SchemaMismatchError(
                f"circuit {self.circuit.name!r} has no input(s) {unknown}; its inputs are {sorted(self.circuit.inputs)}"
            )
        full = self._full(inputs)
        empty_inputs = frozenset(self.circuit.inputs) - set(inputs)
        if self._empty_outputs is not None and len(empty_inputs) == len(full):
            stored = self.store.materialize(
                {f"{OUTPUT}{n}": nothing(self.spark, s) for n, s in self._empty_outputs.items()}
            )
            return StepResult({name: stored[f"{OUTPUT}{name}"] for name in self._empty_outputs}, {})
        single = rows is not None and rows <= self.small_step_rows
        # Spark's own shuffles (there should be none left after the exchanges) use one
        # partition per worker.
        interpreted = rows is not None and rows <= INTERPRETED_STEP_ROWS
        # Set every step (one round trip): settings are the server session's, which every
        # process on the embedded server and every pipeline of a step worker shares, so
        # another's step may have changed them since this runner's last.
        set_all(
            self.spark,
            {"spark.sql.shuffle.partitions": str(self.layout.workers), **(INTERPRETED if interpreted else COMPILED)},
        )
        if retracting is None:
            retracting = _retracting({name: full[name] for name in self.append_only})
        append_only = self.append_only - set(retracting)
        ctx = StepContext(
            self.spark,
            self.store,
            self.layout,
            full,
            append_only,
            empty_inputs,
            single,
            conformed,
            large=rows is not None and rows > LARGE_STEP_ROWS,
            schemas=self.schemas,
        )
        try:
            # Planning runs jobs too (a lookup collects its keys): a failed one frees the step's frames.
            outputs = self.circuit.plan(ctx)
            parts = {f"{OUTPUT}{name}": df for name, df in outputs.items()}
            # A state file holds one worker's vnodes, however many workers the step ran on.
            owner = worker_of(self.layout, F.col(VNODE))
            parts.update({f"{STATE}{table}": df.withColumn(FILE, owner) for table, df in ctx.staged.items()})
            stored = self.store.materialize(parts, rows)
        except Exception as e:
            ours = raised_on_executor(e, *self._executor_errors)
            if ours is None:
                raise
            raise ours from e
        finally:
            ctx.release()
        state = {table: stored[f"{STATE}{table}"] for table in ctx.staged}
        self.store.apply(state)
        self.append_only = append_only
        self.store.set_meta(APPEND_ONLY_KEY, json.dumps(sorted(append_only)))
        return StepResult({name: stored[f"{OUTPUT}{name}"] for name in outputs}, state)

    def planned(self, inputs: Mapping[str, DataFrame]) -> tuple[StepContext, dict[int, DataFrame]]:
        """A step on ``inputs`` (conformed) planned but not run, with every node's delta by
        node id, to run node by node (see :func:`circuits.records.failing_source`); release
        the context when done.  Nothing is staged or stored."""
        empty_inputs = frozenset(self.circuit.inputs) - set(inputs)
        ctx = StepContext(
            self.spark, self.store, self.layout, self._full(inputs), frozenset(), empty_inputs, conformed=True
        )
        nodes: dict[int, DataFrame] = {}
        try:
            self.circuit.plan(ctx, nodes=nodes)
        except BaseException:
            ctx.release()
            raise
        return ctx, nodes

    def _full(self, inputs: Mapping[str, DataFrame]) -> dict[str, DataFrame]:
        """Every input's delta: ``inputs``', an empty one for an absent input."""
        return {
            name: inputs[name] if name in inputs else empty(self.spark, schema)
            for name, schema in self.circuit.inputs.items()
        }


def _retracting(inputs: Mapping[str, DataFrame]) -> set[str]:
    """The inputs with a negative weight (one Spark job for all of them)."""
    minima = aggregate_each([df.select(WEIGHT) for df in inputs.values()], F.min(WEIGHT))
    return {name for name, found in zip(inputs, minima, strict=True) if found is not None and found[0] < 0}
