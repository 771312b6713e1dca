"""KLogs sinks with idempotency tokens (KLogs, docs/klogs.md): each side effect happens once.

A keyed-log pipeline's sink stage hands each message of a step to its function after
the step's output is committed and before the checkpoint.  Every message carries the
seed's idempotency token ``(stage, key, offset)`` (``offset``: the message's position,
see :mod:`circuits.operators.keyed`).  The tokens of completed side effects are kept in
a Delta table, ``<root>/_tokens``; a replayed step (after a crash before its checkpoint)
hands the same messages with the same tokens, and the completed ones are skipped.  A
plain function's side effect and its token are two acts: a crash between them repeats
those messages; a :class:`DeltaSink` writes its rows and their tokens in one commit.

Epochs: a run acts with the epoch of its lease (the fencing token).  A sink refuses an
epoch older than the newest it has seen, so a run that lost its lease cannot act after
a newer run did.

Pruning: a step's tokens are needed only until its checkpoint is committed (a replay
starts after the latest checkpoint).  :meth:`TokenStore.prune`, run by the pipeline's
vacuum (maintenance), deletes the tokens of checkpointed steps; when that would delete
every record of the newest epoch, it first keeps one: a row of stage ``_epoch``, so that
a sink still refuses an older epoch.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import write_deltalake
from deltalake.exceptions import CommitFailedError

from circuits.klogs import KLogsCircuit
from circuits.operators.keyed import KEY, ORD, VALUE
from circuits.zset import WEIGHT

from .errors import StaleWriterError, StorageError
from .logs import STEP, output_uri
from .tables import dataset, ensure_table, open_table

TOKENS = "_tokens"
_TOKEN_FIELDS = [
    ("stage", pa.string()),
    ("key", pa.string()),
    ("offset", pa.string()),
    ("step", pa.int64()),
    ("epoch", pa.int64()),
]
TOKEN_SCHEMA = pa.schema(_TOKEN_FIELDS)
_INTENT = ""  # the key of a sink's record of where its target stood before a step's first attempt
_EPOCH = "_epoch"  # the stage of the record of the newest epoch kept when its tokens are pruned


class StaleEpochError(StaleWriterError):
    """A sink was asked to act for an epoch older than the newest it has acted for."""


@dataclass(frozen=True)
class Message:
    """One message handed to a sink: its token's key and offset, and its decoded key and value."""

    key_text: str
    offset: str
    key: Any
    value: Any


class Publisher(Protocol):
    """A sink object (see :class:`DeltaSink`): publishes a step's messages once, with the
    pipeline's token store at hand."""

    def publish(self, stage: str, step: int, epoch: int, messages: list[Message], tokens: TokenStore) -> None: ...


def offset_of(ord_: Iterable[int]) -> str:
    """A message position (``[timestamp, source, partition, offset, index...]``) as a
    token's offset: ``"source.partition.offset[.index...]"`` (the timestamp orders
    messages but does not identify one; the indices of copies, outputs and merged logs
    do: see :mod:`circuits.operators.keyed`)."""
    return ".".join(str(int(o)) for o in list(ord_)[1:])


def _rows(uri: str, filters: pc.Expression | None = None) -> pa.Table | None:
    table = open_table(uri)
    return None if table is None else dataset(table).to_table(filter=filters)


def _relevant(stage: str, step: int, epoch: int) -> pc.Expression:
    """The rows a sink reads before acting: its tokens of the step, and any of a newer epoch."""
    return ((pc.field("stage") == stage) & (pc.field("step") == step)) | (pc.field("epoch") > epoch)


def _done(rows: pa.Table | None, stage: str, step: int) -> set[tuple[str, str]]:
    if rows is None:
        return set()
    mine = rows.filter((pc.field("stage") == stage) & (pc.field("step") == step))
    return set(zip(mine.column("key").to_pylist(), mine.column("offset").to_pylist()))


def _check_epoch(rows: pa.Table | None, uri: str, epoch: int) -> None:
    newest = None if rows is None or rows.num_rows == 0 else pc.max(rows.column("epoch")).as_py()
    if newest is not None and epoch < newest:
        raise StaleEpochError(
            f"sink {uri}: epoch {epoch} is older than epoch {newest}, which acted already: this run lost its lease "
            "(another run holds a newer one) and may not act"
        )


def _append(uri: str, schema: pa.Schema, rows: list[dict]) -> None:
    try:
        write_deltalake(ensure_table(uri, schema), pa.Table.from_pylist(rows, schema=schema), mode="append")
    except (CommitFailedError, OSError) as e:
        raise StorageError(f"recording {len(rows)} sink rows in {uri} failed: {e}") from e


class TokenStore:
    """The tokens of completed side effects, on Delta: ``(stage, key, offset, step, epoch)``."""

    def __init__(self, root: str) -> None:
        self.uri = os.path.join(root, TOKENS)

    def begin(self, stage: str, step: int, epoch: int) -> set[tuple[str, str]]:
        """The ``(key, offset)`` tokens of ``stage`` completed in ``step``; refuses a stale ``epoch``."""
        rows = _rows(self.uri, _relevant(stage, step, epoch))
        _check_epoch(rows, self.uri, epoch)
        return _done(rows, stage, step)

    def record(self, stage: str, step: int, epoch: int, messages: list[Message]) -> None:
        if messages:
            rows = [
                {"stage": stage, "key": m.key_text, "offset": m.offset, "step": step, "epoch": epoch} for m in messages
            ]
            _append(self.uri, TOKEN_SCHEMA, rows)

    def intent(self, stage: str, step: int, epoch: int, mark: Callable[[], str]) -> str | None:
        """What a sink recorded (``mark()``, say where its target ended) before it first
        acted for ``stage`` in ``step``: None, after recording ``mark()``, when this is the
        first attempt; the earlier record when a crashed attempt may have acted."""
        rows = _rows(self.uri, (pc.field("stage") == stage) & (pc.field("step") == step) & (pc.field("key") == _INTENT))
        if rows is not None and rows.num_rows:
            return rows.column("offset")[0].as_py()
        _append(
            self.uri, TOKEN_SCHEMA, [{"stage": stage, "key": _INTENT, "offset": mark(), "step": step, "epoch": epoch}]
        )
        return None

    def prune(self, before: int) -> int:
        """Deletes the tokens of steps before ``before`` (the checkpointed ones: steps
        ``< before`` are never replayed) in one commit, keeping a record of the newest epoch
        (written first, when no token of a later step has it); returns how many rows went."""
        table = open_table(self.uri)
        if table is None:
            return 0
        rows = dataset(table).to_table(columns=["stage", "step", "epoch"])
        old = pc.less(rows.column("step"), before)
        if not pc.any(old).as_py():
            return 0
        newest = pc.max(rows.column("epoch")).as_py()
        kept = rows.filter(pc.invert(old))
        if not pc.any(pc.equal(kept.column("epoch"), newest)).as_py():
            _append(
                self.uri, TOKEN_SCHEMA, [{"stage": _EPOCH, "key": "", "offset": "", "step": before, "epoch": newest}]
            )
        try:
            metrics = open_table(self.uri).delete(f"step < {int(before)}")
        except (CommitFailedError, OSError) as e:
            raise StorageError(f"pruning the tokens of steps before {before} in {self.uri} failed: {e}") from e
        return int(metrics.get("num_deleted_rows", 0))


SINK_DEAD_LETTERS = "_sink_dead_letters"
DEAD_LETTER_SCHEMA = pa.schema([*_TOKEN_FIELDS, ("value", pa.string()), ("reason", pa.string())])


class CallSink:
    """A sink function ``fn(k, v)``, called once per message (tokens in a :class:`TokenStore`).
    A message on which ``fn`` raises is a dead letter in ``<root>/_sink_dead_letters`` with
    the exception's text (and its token is completed: it is not tried again)."""

    def __init__(self, fn: Callable[[Any, Any], None]) -> None:
        self.fn = fn

    def publish(self, stage: str, step: int, epoch: int, messages: list[Message], tokens: TokenStore) -> None:
        done = tokens.begin(stage, step, epoch)
        todo = [m for m in messages if (m.key_text, m.offset) not in done]
        dead = []
        for m in todo:
            try:
                self.fn(m.key, m.value)
            except Exception as e:
                row = {"stage": stage, "key": m.key_text, "offset": m.offset, "step": step, "epoch": epoch}
                dead.append({**row, "value": json.dumps(m.value), "reason": f"{type(e).__name__}: {e}"})
        if dead:
            _append(os.path.join(os.path.dirname(tokens.uri), SINK_DEAD_LETTERS), DEAD_LETTER_SCHEMA, dead)
        tokens.record(stage, step, epoch, todo)


class DeltaSink:
    """Appends each message to the Delta table at ``uri`` as a row ``(stage, key, offset,
    step, epoch, value)`` (key and value as JSON text).  The table is its own token store:
    a step's missing rows are written in one commit, so each message lands once."""

    SCHEMA = pa.schema([*_TOKEN_FIELDS, ("value", pa.string())])

    def __init__(self, uri: str) -> None:
        self.uri = uri

    def publish(self, stage: str, step: int, epoch: int, messages: list[Message], tokens: TokenStore) -> None:
        rows = _rows(self.uri, _relevant(stage, step, epoch))
        _check_epoch(rows, self.uri, epoch)
        done = _done(rows, stage, step)
        todo = [
            {
                "stage": stage,
                "key": m.key_text,
                "offset": m.offset,
                "step": step,
                "epoch": epoch,
                "value": json.dumps(m.value),
            }
            for m in messages
            if (m.key_text, m.offset) not in done
        ]
        if todo:
            _append(self.uri, self.SCHEMA, todo)


class Sinks:
    """The sink stages of a keyed-log pipeline (none for another circuit)."""

    def __init__(self, root: str, circuit: object) -> None:
        self.root = root
        self.tokens = TokenStore(root)
        sinks = circuit.sinks if isinstance(circuit, KLogsCircuit) else {}
        self.stages: dict[str, Publisher] = {
            stage: fn if hasattr(fn, "publish") else CallSink(fn) for stage, fn in sinks.items()
        }

    def publish(self, step: int, epoch: int) -> None:
        """Hands each sink stage the messages the committed output log holds for ``step``, in order."""
        for stage, sink in self.stages.items():
            sink.publish(stage, step, epoch, step_messages(output_uri(self.root, stage), step), self.tokens)


def step_messages(uri: str, step: int) -> list[Message]:
    """The messages of ``step`` in a sink stage's output log, in ``ord`` order (timestamp,
    then source log, partition, offset: see :mod:`circuits.klogs`), one per copy."""
    rows = _rows(uri, pc.field(STEP) == step)
    found = []
    for row in [] if rows is None else rows.to_pylist():
        message = Message(row[KEY], offset_of(row[ORD]), json.loads(row[KEY]), json.loads(row[VALUE]))
        found += [(tuple(row[ORD]), message)] * row[WEIGHT]
    return [m for _, m in sorted(found, key=lambda f: f[0])]
