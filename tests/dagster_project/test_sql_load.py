"""A ``sql:`` pipeline's unknown column fails when the configuration loads without Spark
(as a Dagster code location loads it, under ``dagster dev``), not at its first run: the
error names the file, the column's line, the view and the column."""

import json

import pytest

from .harness import python_without_spark
from .test_sql_pipeline import VIEWS, sql_settings

# A process without Spark, as a code server is when it loads the definitions.
LOAD = """
import json, sys
from dagster_project.config import ConfigError, parse_project
from pyspark import SparkContext
try:
    parse_project(json.loads(sys.argv[1]), "dbsp.yaml", base=sys.argv[2])
    print("loaded")
except ConfigError as e:
    print(e)
assert SparkContext._active_spark_context is None
"""


def load_without_spark(tmp_path, text: str, **change) -> str:
    return python_without_spark(LOAD, json.dumps(sql_settings(tmp_path, text, **change)), str(tmp_path))


@pytest.mark.parametrize(
    "old, new, named",
    [
        ("sum(price)", "sum(prize)", "views.sql:6, view 'revenue': unknown column prize"),
        ("WHERE bids > 5", "WHERE revenue.bid > 5", "views.sql:10, view 'busy': unknown column revenue.bid"),
        ("GROUP BY p.state", "GROUP BY p.stat", "views.sql:13, view 'sellers': unknown column p.stat"),
    ],
)
def test_an_unknown_column_fails_the_load_without_spark(tmp_path, old, new, named):
    out = load_without_spark(tmp_path, VIEWS.replace(old, new))
    assert named in out, out
    assert not (tmp_path / "store").exists()


def test_known_columns_aliases_and_struct_fields_load_without_spark(tmp_path):
    """Nothing that Spark accepts is refused: aliases, column lists, a view's columns, a
    struct's field, with a ``schemas:`` entry of a parameterised type."""
    views = VIEWS + (
        "CREATE MATERIALIZED VIEW tagged AS SELECT t.n, named_struct('x', n).x AS x, t.total "
        "FROM (SELECT category AS n, revenue + 1 AS total FROM busy) AS t;\n"
    )
    schemas = {"bids": "auction BIGINT, price DECIMAL(12,2)", "auctions": "id BIGINT, category BIGINT, seller BIGINT"}
    assert load_without_spark(tmp_path, views, schemas=schemas).strip() == "loaded"
