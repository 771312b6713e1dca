"""The KLogs word count (docs/klogs.md) as a view.

Two logs of ``(word, count)`` pairs, one counting upper-case words and one lower-case,
are merged, re-keyed by the lower-cased word, and each word keeps a running total.
In KLogs that is ``merge |> partition toLowercase |> loop (+)``; as a view it is a
union, a projection and a sum per group, and the engine keeps the running total.
"""

from __future__ import annotations

from pyspark.sql import functions as F

from .. import agg
from ..circuit import Circuit

WORDS_SCHEMA = "word string, count bigint"


def word_count(name: str = "word_count") -> Circuit:
    circuit = Circuit(name)
    upper = circuit.input("upper", WORDS_SCHEMA)
    lower = circuit.input("lower", WORDS_SCHEMA)
    merged = upper.union(lower)
    by_word = merged.select(word=F.lower("word"), count="count")
    by_word.group_by("word").agg(total=agg.sum("count")).output("totals")
    return circuit
