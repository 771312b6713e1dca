"""The WHERE's tests of one source's rows alone are made before the joins, as Spark's
optimizer pushes them: a join's state keeps only the rows that may pass (a self-join whose
sides are filtered to different values keeps each side's rows, not their cross product
over every value).  Never below the side of an outer join that the join pads with NULLs,
whose padded rows the WHERE tests.  Each view equals Spark batch SQL of its text."""

from __future__ import annotations

from circuits.operators import Join, KeyedJoin
from circuits.operators.linear import Filter

from . import harness
from .harness import joins_of

VIEWS = """
CREATE MATERIALIZED VIEW sides AS
  SELECT x.k, x.v AS first, y.v AS second FROM a x, a y WHERE x.k = y.k AND x.s = 'a' AND y.s = 'b' AND x.v > 0;
CREATE MATERIALIZED VIEW padded AS
  SELECT a.k, a.s, b.x FROM a LEFT JOIN b ON a.k = b.k WHERE b.x IS NULL AND a.s = 'a';
CREATE MATERIALIZED VIEW padded_left AS
  SELECT a.v, b.d FROM a RIGHT JOIN b ON a.k = b.k WHERE a.v IS NULL OR b.x > 1;
"""

circuit = harness.sql_views(VIEWS)
test_filtered_joins_equal_spark_batch_sql = harness.equal_to_spark_batch_sql(VIEWS)


def filters_before(circuit, node_id: int) -> list[str]:
    """The conditions of the filters on the way from ``node_id`` up to the inputs."""
    node = circuit.nodes[node_id]
    own = [node.operator.params()["condition"]] if isinstance(node.operator, Filter) else []
    if isinstance(node.operator, (Join, KeyedJoin)):
        return own
    return own + [c for i in node.inputs for c in filters_before(circuit, i)]


def test_a_sources_own_tests_filter_it_before_the_join(circuit):
    (join,) = joins_of(circuit, "sides")
    sides = [filters_before(circuit, i) for i in join.inputs]
    assert any("'a'" in c and "> 0" in c for c in sides[0]), sides
    assert any("'b'" in c for c in sides[1]) and not any("'a'" in c for c in sides[1]), sides


def test_no_test_goes_below_the_side_an_outer_join_pads(circuit):
    (left,) = joins_of(circuit, "padded")
    sides = [filters_before(circuit, i) for i in left.inputs]
    assert any("'a'" in c for c in sides[0]) and not any("NULL" in c for c in sides[0]), sides
    assert sides[1] == [], sides
    (right,) = joins_of(circuit, "padded_left")
    assert [filters_before(circuit, i) for i in right.inputs] == [[], []]
