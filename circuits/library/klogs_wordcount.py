"""The KLogs paper's word count, as the paper writes it (docs/klogs.md).

Two keyed logs of ``word -> count`` messages, one for upper-case words and one for
lower-case, merged, re-keyed by the lower-cased word, and folded per word into a running
total that each message emits; the sink prints each total as a JSON line.
"""

from __future__ import annotations

import json

from ..klogs import KLog, KLogsCircuit, deploy, merge

UPPER = "word-counts-uppercase"
LOWER = "word-counts-lowercase"
SEED_MESSAGES = (UPPER, "F", 1), (UPPER, "M", 3), (LOWER, "f", 4), (UPPER, "M", 4)
"""The KLogs paper's producer calls, in order: (log, key, value)."""


def print_count_json(word: str, total: int) -> None:
    print(json.dumps({"type": "OUT", "name": word, "count totals": total}, separators=(",", ":")), flush=True)


def add_count(total: int, _word: str, count: int) -> tuple[int, list[int]]:
    total += count
    return total, [total]


def lower_case(word: str, _count: int) -> list[str]:
    return [word.lower()]


def word_count_klogs(name: str = "klogs_word_count") -> KLogsCircuit:
    upper, lower = KLog.named(UPPER), KLog.named(LOWER)

    def pipeline() -> None:
        merge([upper, lower]).partition(lower_case).loop(0, add_count).sink(print_count_json)

    return deploy(pipeline, name)
