"""Keyed-log operators (KLogs, docs/klogs.md): ``partition`` re-keys messages, ``loop`` folds
each key's messages in order with that key's state.

A keyed log is an append-only Z-set of messages ``(key, value, ord)``: ``key`` and
``value`` are JSON texts, ``ord`` is the message's position, ``[timestamp, source log,
partition, offset]`` for a message read from a log (the timestamp made monotonic per
partition: see :mod:`circuits.klogs`), with one more element per operator it went
through that can make several messages of one: its index among the copies a
``partition`` made, among the messages a ``loop`` emitted, or among the logs a ``merge``
joined.  So no two messages of a stream share an ``ord``, and ``ord`` without its
timestamp identifies a message in every run (a sink's idempotency token).  Messages of
one key are handled in ``ord`` order (array order: element by element); so are messages
of several source keys that land on one key: by (timestamp, source log, partition,
offset), then by those indices.

Both operators emit a *tagged* stream: a message has a null ``reason``; a message that
could not be handled (a retraction, or the user's function raised on it) keeps its
``value`` and ``ord`` and carries the ``reason`` and the ``stage``: a dead letter.  The
user's functions run on the Spark executors, on the rows of one worker at a time.  A key,
value or state that is not JSON-serialisable raises :class:`KLogsError` there; the step
runner raises it again in the driver (see :attr:`~circuits.operators.base.Operator.executor_errors`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

import pandas as pd
from pyspark import cloudpickle
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ..context import NodeContext
from ..errors import DbspError
from ..sharding import PART, ROUTED, VNODE
from ..zset import WEIGHT, add, weight
from .base import Operator

KEY, VALUE, ORD, STATE, STAGE, REASON, KIND = "key", "value", "ord", "state", "stage", "reason", "kind"
MESSAGE_SCHEMA = T.StructType(
    [
        T.StructField(KEY, T.StringType()),
        T.StructField(VALUE, T.StringType()),
        T.StructField(ORD, T.ArrayType(T.LongType())),
        T.StructField(WEIGHT, T.LongType()),
    ]
)
TAGGED_SCHEMA = T.StructType(
    [
        *MESSAGE_SCHEMA.fields[:3],
        T.StructField(STAGE, T.StringType()),
        T.StructField(REASON, T.StringType()),
        T.StructField(WEIGHT, T.LongType()),
    ]
)
# What a loop's fold returns per worker: tagged messages, and the state rows it changes.
_FOLDED_SCHEMA = T.StructType(
    [
        T.StructField(KIND, T.StringType()),
        T.StructField(VNODE, T.IntegerType()),
        *TAGGED_SCHEMA.fields[:5],
        T.StructField(STATE, T.StringType()),
        T.StructField(WEIGHT, T.LongType()),
    ]
)
_OUT, _DEAD, _STATE = "out", "dead", "state"
RETRACTION = "retraction: a keyed log is append-only (weight {w})"


class KLogsError(DbspError):
    """A keyed-log pipeline cannot go on: a key, value or state is not JSON-serialisable."""


def function_id(fn: Callable) -> str:
    """The identity of a user's function in a circuit's fingerprint: its name and a hash of
    what it computes with (changing any of it changes the circuit): its code, the code of
    the functions defined inside it, the values it closes over and the globals it names,
    and so on through the user's functions among those.  Plain data (None, bool, number,
    text, bytes, and lists, tuples, sets and dicts of them) counts by value; a function of
    the engine or of an installed package by its name; a module by its name; any other
    value by its type only: state held in an imported module or in an object is not seen."""
    name = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"
    return f"{name}:{hashlib.sha256(_seen(fn, {}).encode()).hexdigest()[:12]}"


_PLAIN = (type(None), bool, int, float, str, bytes)


def _seen(value: Any, known: dict[int, str]) -> str:
    """A text of ``value`` that is the same in every process (no memory addresses);
    ``known``: the texts of the functions met so far."""
    if isinstance(value, _PLAIN):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return f"{type(value).__name__}({','.join(_seen(v, known) for v in value)})"
    if isinstance(value, (set, frozenset)):
        return f"set({','.join(sorted(_seen(v, known) for v in value))})"
    if isinstance(value, dict):
        return f"dict({','.join(sorted(f'{_seen(k, known)}:{_seen(v, known)}' for k, v in value.items()))})"
    if isinstance(value, types.ModuleType):
        return f"module {value.__name__}"
    if isinstance(value, types.FunctionType):
        return _function(value, known)
    if isinstance(value, types.MethodType):
        return f"method {_function(value.__func__, known)} of {_seen(type(value.__self__), known)}"
    if isinstance(value, functools.partial):
        return f"partial {_seen([value.func, value.args, value.keywords], known)}"
    return f"<{type(value).__module__}.{type(value).__qualname__}>"


def _function(fn: types.FunctionType, known: dict[int, str]) -> str:
    """A user's function by its code, closure and named globals; another by its name, as
    is a function met again while its own text is being made (a recursive one).  Each
    function's text is made once: a call graph's shared parts are not walked again."""
    if id(fn) not in known:
        known[id(fn)] = f"function {fn.__module__}.{fn.__qualname__}"
        if not _library(fn):
            cells = [c.cell_contents if _filled(c) else "<empty cell>" for c in fn.__closure__ or ()]
            names = sorted(n for n in _names(fn.__code__) if n in fn.__globals__)
            closed = {"cells": cells, "globals": {n: fn.__globals__[n] for n in names}}
            known[id(fn)] = f"{known[id(fn)]} {_code(fn.__code__)} {_seen(closed, known)}"
    return known[id(fn)]


def _code(code: types.CodeType) -> str:
    """A code object's instructions, constants (nested code objects by their own text,
    since a code object's repr holds its address) and names."""
    consts = [_code(c) if isinstance(c, types.CodeType) else c for c in code.co_consts]
    return repr((code.co_code, _seen(consts, {}), code.co_names))


def _names(code: types.CodeType) -> set[str]:
    """The names a code object and the code nested in it look up (globals among them)."""
    nested = (_names(c) for c in code.co_consts if isinstance(c, types.CodeType))
    return set(code.co_names).union(*nested)


def _filled(cell: types.CellType) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises on read
    except ValueError:
        return False
    return True


def ship(fn: Callable) -> Callable:
    """``fn``, made to reach the executors by value: its module (the user's, which the
    Spark workers may not be able to import) is pickled with it.  Functions of installed
    packages and of the engine are still pickled by reference."""
    module = sys.modules.get(getattr(fn, "__module__", "") or "")
    if getattr(module, "__file__", None) is not None and not _library(fn):
        cloudpickle.register_pickle_by_value(module)
    return fn


def _library(fn: Callable) -> bool:
    """Whether ``fn`` is the engine's or an installed package's (not the user's)."""
    module = sys.modules.get(getattr(fn, "__module__", "") or "")
    path = getattr(module, "__file__", None)
    return module is not None and (module.__name__.startswith("circuits.") or (path is not None and _installed(path)))


def _installed(path: str) -> bool:
    return any(os.path.abspath(path).startswith(os.path.abspath(p) + os.sep) for p in {sys.prefix, sys.base_prefix})


def to_json(what: str, stage: str, key: str, value: Any) -> str:
    """``value`` as JSON text, or :class:`KLogsError` naming the stage, the key and the type."""
    try:
        return json.dumps(value, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as e:
        raise KLogsError(
            f"stage {stage}: the {what} of key {key} is a {type(value).__name__}, not JSON-serialisable ({e}); "
            "keys, values and states must be JSON values (None, bool, int, float, str, list, dict)"
        ) from None


def _reason(error: Exception) -> str:
    return f"{type(error).__name__}: {error}"


def _dead(key: str, value: str, ord_: list, stage: str, reason: str) -> tuple:
    return key, value, ord_, stage, reason, 1


def _copies(w: int) -> range:
    return range(w if w > 0 else 0)


class Partition(Operator):
    """``partition(fn)``: each message ``(k, v)`` becomes one message ``(k2, v)`` per key
    ``k2`` in ``fn(k, v)`` (none: dropped), whose ``ord`` is the input's plus the index of
    ``k2`` in that list (so copies that land on one key stay apart).  A retraction, or a
    message on which ``fn`` raises, becomes a dead letter.  Linear and stateless:
    incremental, it is applied to the step's messages."""

    name = "klog_partition"
    keeps_append_only = True
    executor_errors = (KLogsError,)

    def __init__(self, stage: str, fn: Callable[[Any, Any], list]) -> None:
        self.stage = stage
        self.fn = ship(fn)

    def params(self) -> dict[str, Any]:
        return {"stage": self.stage, "fn": function_id(self.fn)}

    def evaluate(self, ctx: NodeContext, delta: DataFrame) -> DataFrame:
        stage, fn = self.stage, self.fn

        def rows(pdf: pd.DataFrame) -> Iterator[tuple]:
            for key, value, ord_, w in zip(pdf[KEY], pdf[VALUE], pdf[ORD], pdf[WEIGHT], strict=True):
                ord_ = list(ord_)
                if w < 0:
                    yield _dead(key, value, ord_, stage, RETRACTION.format(w=w))
                    continue
                try:
                    keys = list(fn(json.loads(key), json.loads(value)))
                except Exception as e:
                    yield _dead(key, value, ord_, stage, _reason(e))
                    continue
                for copy, new_key in enumerate(keys):
                    text = to_json("new key", stage, key, new_key)
                    for _ in _copies(w):
                        yield text, value, [*ord_, copy], None, None, 1

        def each(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
            for pdf in batches:
                yield pd.DataFrame(list(rows(pdf)), columns=TAGGED_SCHEMA.names)

        return delta.select(*MESSAGE_SCHEMA.names).mapInPandas(each, TAGGED_SCHEMA)


class Loop(Operator):
    """``loop(init, fn)``: per key, the state starts as ``init``; each message ``v`` of key
    ``k``, in ``ord`` order, gives ``(state, [v2, ...]) = fn(state, k, v)``, and each ``v2``
    is a message of key ``k`` whose ``ord`` is the input's plus its index.  A retraction, or
    a message on which ``fn`` raises, becomes a dead letter and leaves the state as it was.
    States are JSON values; one that is not stops the step with :class:`KLogsError`.

    Incremental: the output of a step is the messages emitted for the step's messages,
    since a fold over a key's whole log is the fold over its earlier messages (the stored
    state) continued with the new ones.  State: one row per key, ``(vnode, key, state)``
    (the state's JSON text), read only for the keys the step touches; a step stages, per
    key whose state changed, the old row with weight -1 and the new one with weight 1.
    """

    name = "klog_loop"
    stateful = True
    keeps_append_only = True
    executor_errors = (KLogsError,)

    def __init__(self, stage: str, init: Any, fn: Callable[[Any, Any, Any], tuple[Any, list]]) -> None:
        self.stage = stage
        self.init = to_json("initial state", stage, "(any)", init)
        self.fn = ship(fn)

    def params(self) -> dict[str, Any]:
        return {"stage": self.stage, "init": self.init, "fn": function_id(self.fn)}

    def evaluate(self, ctx: NodeContext, delta: DataFrame) -> DataFrame:
        messages = ctx.keyed(delta, [KEY])
        template = messages.select(*ROUTED, KEY, F.lit(None).cast("string").alias(STATE), weight()).where(F.lit(False))
        before = ctx.lookup("state", messages, [KEY], template, null_safe=False)
        nulls = {c: F.lit(None).cast(t) for c, t in ((VALUE, "string"), (ORD, "array<bigint>"), (STATE, "string"))}
        both = add(
            messages.select(*ROUTED, KEY, VALUE, ORD, nulls[STATE].alias(STATE), weight()),
            before.select(*ROUTED, KEY, nulls[VALUE].alias(VALUE), nulls[ORD].alias(ORD), STATE, weight()),
        )
        folded = ctx.share(both.groupBy(PART).applyInPandas(_folder(self.stage, self.init, self.fn), _FOLDED_SCHEMA))
        ctx.stage("state", folded.where(F.col(KIND) == _STATE).select(VNODE, KEY, STATE, weight()))
        return folded.where(F.col(KIND) != _STATE).select(*TAGGED_SCHEMA.names)


def _folder(stage: str, init: str, fn: Callable) -> Callable[[pd.DataFrame], pd.DataFrame]:
    """The fold of one worker's touched keys (run on an executor): their stored states
    (rows with a state) and the step's messages (rows with an ord)."""

    def fold_key(vnode: int, key: str, stored: str | None, messages: list[tuple], out: list) -> None:
        text = stored if stored is not None else init
        key_value = json.loads(key)
        for ord_, value, w in sorted(messages):
            if w < 0:
                out.append((_DEAD, vnode, key, value, list(ord_), stage, RETRACTION.format(w=w), None, 1))
                continue
            for _ in _copies(w):
                try:
                    state, emitted = fn(json.loads(text), key_value, json.loads(value))
                    emitted = list(emitted)
                except Exception as e:
                    out.append((_DEAD, vnode, key, value, list(ord_), stage, _reason(e), None, 1))
                    continue
                text = to_json("state", stage, key, state)
                for i, v2 in enumerate(emitted):
                    out.append((_OUT, vnode, key, to_json("message", stage, key, v2), [*ord_, i], None, None, None, 1))
        if text != (stored if stored is not None else init):
            if stored is not None:
                out.append((_STATE, vnode, key, None, None, None, None, stored, -1))
            out.append((_STATE, vnode, key, None, None, None, None, text, 1))

    def fold(pdf: pd.DataFrame) -> pd.DataFrame:
        out: list[tuple] = []
        keys: dict[str, tuple[int, list, list]] = {}
        for vnode, key, value, ord_, state, w in zip(
            pdf[VNODE], pdf[KEY], pdf[VALUE], pdf[ORD], pdf[STATE], pdf[WEIGHT], strict=True
        ):
            _, states, messages = keys.setdefault(key, (int(vnode), [], []))
            if ord_ is None:
                states.append(state)
            else:
                messages.append((tuple(int(o) for o in ord_), value, int(w)))
        for key, (vnode, states, messages) in keys.items():
            if messages:
                fold_key(vnode, key, states[0] if states else None, messages, out)
        return pd.DataFrame(out, columns=_FOLDED_SCHEMA.names)

    return fold
