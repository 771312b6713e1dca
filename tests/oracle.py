"""An oracle independent of the engine: DuckDB SQL over the integrated inputs.

Z-sets here are ``Counter``s from row tuples to integer weights.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

import duckdb
from pyspark.sql import types as T

from circuits.zset import parse_schema

_DUCK_TYPES = {"int": "INTEGER", "bigint": "BIGINT", "string": "VARCHAR", "double": "DOUBLE"}


def normalize(value):
    """``value`` as rows are compared: a float to 9 digits, an array as a tuple."""
    if isinstance(value, list):
        return tuple(map(normalize, value))
    return round(value, 9) if isinstance(value, float) else value


def zset(rows: Iterable[tuple]) -> Counter:
    """A consolidated Counter from rows whose last element is the weight."""
    out: Counter = Counter()
    for *data, w in rows:
        out[tuple(normalize(v) for v in data)] += w
    return Counter({k: w for k, w in out.items() if w != 0})


def add_into(total: Counter, delta: Counter) -> None:
    for row, w in delta.items():
        total[row] += w
        if total[row] == 0:
            del total[row]


def sql(query: str, tables: Mapping[str, tuple[str | T.StructType, Counter]]) -> Counter:
    """Runs ``query`` over ``tables`` (name -> (schema, Z-set with non-negative weights))."""
    con = duckdb.connect()
    try:
        for name, (schema, rows) in tables.items():
            fields = parse_schema(schema).fields
            con.execute(
                f"CREATE TABLE {name} ({', '.join(f'{f.name} {_DUCK_TYPES[f.dataType.simpleString()]}' for f in fields)})"
            )
            expanded = [row for row, w in rows.items() for _ in range(w)]
            assert all(w > 0 for w in rows.values()), f"table {name} has non-positive weights"
            if expanded:
                con.executemany(f"INSERT INTO {name} VALUES ({', '.join('?' * len(fields))})", expanded)
        return Counter(tuple(normalize(v) for v in row) for row in con.execute(query).fetchall())
    finally:
        con.close()
