"""A user's own pipeline from the command line, without Dagster's daemon: ``dbsp check``
finds what a step would meet, ``dbsp produce`` feeds the topics, ``dbsp step`` runs what
they hold; and every failure of a command is one line, never a traceback."""

import subprocess
import sys

import pytest
import yaml

from .test_cli import PROJECT, minimal_env

ORDERS = "order_id BIGINT, customer_id BIGINT, qty INT, price DOUBLE"
CUSTOMERS = "customer_id BIGINT, name STRING, country STRING"
SHOP_SQL = """\
CREATE MATERIALIZED VIEW by_country AS
SELECT c.country, sum(o.qty) AS qty, count(*) AS orders
FROM orders o JOIN customers c ON o.customer_id = c.customer_id
GROUP BY c.country;
CREATE MATERIALIZED VIEW spend AS
SELECT customer_id, sum(qty * price) AS spent FROM orders GROUP BY customer_id;
"""
# The new user's errors, each on a line of its own.
BAD_SQL = (
    SHOP_SQL
    + """\
CREATE MATERIALIZED VIEW distinct_qty AS
SELECT customer_id,
       sum(DISTINCT qty) AS q
FROM orders GROUP BY customer_id;
CREATE MATERIALIZED VIEW named AS
SELECT o.order_id,
       o.name
FROM orders o JOIN customers c ON o.customer_id = c.customer_id;
"""
)


def shop(name: str, sql: str = "shop.sql", orders: str = ORDERS, customers: str = CUSTOMERS, **settings) -> dict:
    return {
        "name": name,
        "sql": sql,
        "sources": {"orders": f"{name}.orders", "customers": f"{name}.customers"},
        "schemas": {"orders": orders, "customers": customers},
        "max_wait_seconds": 0,
        **settings,
    }


def write_config(tmp_path, pipelines: list[dict], spark_resource: dict, broker=None) -> str:
    kafka = {"bootstrap_servers": broker.bootstrap} if broker is not None else {"embedded_port": 1}
    settings = {
        "pipelines": pipelines,
        "resources": {"store": {"root": str(tmp_path / "store")}, "kafka": kafka, "spark": spark_resource},
    }
    path = tmp_path / "dbsp.yaml"
    path.write_text(yaml.safe_dump(settings, sort_keys=False))
    return str(path)


def dbsp(tmp_path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """This tree's ``dbsp`` in a minimal environment, in ``tmp_path``."""
    env = minimal_env(tmp_path, PYTHONPATH=str(PROJECT))
    return subprocess.run(
        [sys.executable, "-m", "dagster_project.cli", *args],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def line_of(path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


@pytest.mark.slow
def test_check_finds_each_error_of_a_new_users_pipeline_before_any_step(tmp_path, spark_resource):
    (tmp_path / "shop.sql").write_text(BAD_SQL)
    (tmp_path / "good.sql").write_text(SHOP_SQL)
    config = write_config(
        tmp_path,
        [
            shop("shop"),
            shop("typo", sql="good.sql", orders=ORDERS.replace("qty INT", "qty INTEGR")),
            shop("comma", sql="good.sql", customers=CUSTOMERS.replace("name STRING,", "name STRING")),
        ],
        spark_resource,
    )
    done = dbsp(tmp_path, "--config", config, "check")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    said = done.stderr.splitlines()
    assert said[0] == "dbsp check: 4 error(s):", said
    sql, yaml_file = tmp_path / "shop.sql", tmp_path / "dbsp.yaml"

    def error(where: str) -> str:
        found = [e for e in said[1:] if e.startswith(where)]
        assert len(found) == 1, (where, said)
        return found[0]

    assert "SUM(DISTINCT qty)" in error(f"{sql}:{line_of(sql, 'sum(DISTINCT qty)')}, view 'distinct_qty': ")
    assert "`o`.`name` cannot be resolved" in error(f"{sql}:{line_of(sql, 'VIEW named')}, view 'named': ")
    # The schemas are blamed, at their own lines, not the views that read them.
    assert "INTEGR" in error(f"{config}:{line_of(yaml_file, 'qty INTEGR')}: pipelines.1.schemas.orders: ")
    comma = error(f"{config}:{line_of(yaml_file, 'name STRING country')}: pipelines.2.schemas.customers: ")
    assert "'name STRING country STRING' is two columns: a comma is missing" in comma
    assert not (tmp_path / "store").exists()

    (tmp_path / "shop.sql").write_text(SHOP_SQL)
    config = write_config(tmp_path, [shop("shop")], spark_resource)
    done = dbsp(tmp_path, "--config", config, "check")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "dbsp check: 1 pipeline(s), 2 SQL view(s): no errors"
