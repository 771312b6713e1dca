"""Joins whose condition repeats an equality in every branch of an ``OR`` are keyed by it:
``(a.k = b.k AND p) OR (a.k = b.k AND q)`` is ``a.k = b.k AND (p OR q)``, as Spark's
optimizer rewrites it, not a join keyed by a constant (the whole relations read on every
change).  Each view equals Spark batch SQL of its text at every step."""

from __future__ import annotations

import re

from circuits.operators import Join, KeyedJoin
from circuits.operators.linear import Select

from . import harness

VIEWS = """
CREATE MATERIALIZED VIEW either AS
  SELECT a.k, a.v, b.x FROM a JOIN b ON (a.k = b.k AND a.s = 'a') OR (a.k = b.k AND b.x > 2);
CREATE MATERIALIZED VIEW implied AS
  SELECT a.v, b.d FROM a, b WHERE (a.k = b.k AND a.v = b.x) OR (b.k = a.k AND a.v = b.x AND a.s = 'b') OR (a.k = b.k AND b.x = a.v AND b.d > 0);
CREATE MATERIALIZED VIEW outer_either AS
  SELECT a.k, a.s, b.x FROM a LEFT JOIN b ON (a.k = b.k AND b.x = 1) OR (a.k = b.k AND (b.x = 2 OR a.s = 'b'));
"""

circuit = harness.sql_views(VIEWS)
test_or_joins_equal_spark_batch_sql = harness.equal_to_spark_batch_sql(VIEWS)


def key_texts(circuit) -> list[list[str]]:
    """For each join of ``circuit``, the texts its inputs compute its keys by."""
    joins = [n for n in circuit.nodes if isinstance(n.operator, (Join, KeyedJoin))]
    found = []
    for join in joins:
        for side in join.inputs:
            select = circuit.nodes[side].operator
            assert isinstance(select, Select)
            columns = select.params()["columns"]
            found.append([c for c in columns if any(k in c for k in join.operator.on)])
    return found


def test_equalities_in_every_branch_are_the_join_keys(circuit):
    keys = key_texts(circuit)
    assert [len(side) for side in keys] == [1, 1, 2, 2, 1, 1], keys
    assert all(re.search(r"CAST\(c\d+ AS", text) for side in keys for text in side), f"a constant key: {keys}"
