"""A user's own pipeline from the command line, without Dagster's daemon: ``dbsp check``
finds what a step would meet, ``dbsp produce`` feeds the topics, ``dbsp step`` runs what
they hold; and every failure of a command is one line, never a traceback."""

import json
import re
import subprocess
import sys
import uuid

import pytest
import yaml
from dagster import AssetKey, DagsterInstance

from dagster_project.cli import main
from dagster_project.config import parse_project
from sensors.kafka import KafkaClient
from storage.views import read_view

from .harness import wait_for
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
CREATE MATERIALIZED VIEW pairs AS
SELECT customer_id, qty FROM orders
WHERE (customer_id, qty) IN (SELECT customer_id, qty FROM orders);
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


def write_config(tmp_path, pipelines: list[dict], spark_resource: dict, broker) -> str:
    """The pipelines on the test session's Spark and broker (given by its address)."""
    kafka = {"bootstrap_servers": broker.bootstrap}
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
def test_check_finds_each_error_of_a_new_users_pipeline_before_any_step(tmp_path, spark_resource, broker):
    (tmp_path / "shop.sql").write_text(BAD_SQL)
    (tmp_path / "good.sql").write_text(SHOP_SQL)
    syntax = tmp_path / "syntax.sql"
    syntax.write_text(
        SHOP_SQL.replace("GROUP BY c.country", "GROUP c.country").replace("SELECT customer_id", "SELEC customer_id")
    )
    config = write_config(
        tmp_path,
        [
            shop("shop"),
            shop("typo", sql="good.sql", orders=ORDERS.replace("qty INT", "qty INTEGR")),
            shop("comma", sql="good.sql", customers=CUSTOMERS.replace("name STRING,", "name STRING")),
            shop("syntax", sql="syntax.sql"),
        ],
        spark_resource,
        broker,
    )
    done = dbsp(tmp_path, "--config", config, "check")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    said = done.stderr.splitlines()
    assert said[0] == "dbsp check: 6 error(s):", "\n".join(said)
    sql, yaml_file = tmp_path / "shop.sql", tmp_path / "dbsp.yaml"

    def error(where: str) -> str:
        found = [e for e in said[1:] if e.startswith(where)]
        assert len(found) == 1, (where, said)
        return found[0]

    assert "IN (subquery) of several columns" in error(f"{sql}:{line_of(sql, '(customer_id, qty) IN')}, view 'pairs': ")
    assert "`o`.`name` cannot be resolved" in error(f"{sql}:{line_of(sql, 'o.name')}, view 'named': ")
    # The schemas are blamed, at their own lines, not the views that read them.
    assert "INTEGR" in error(f"{config}:{line_of(yaml_file, 'qty INTEGR')}: pipelines.1.schemas.orders: ")
    comma = error(f"{config}:{line_of(yaml_file, 'name STRING country')}: pipelines.2.schemas.customers: ")
    assert "'name STRING country STRING' is two columns: a comma is missing" in comma
    # Every statement that does not parse, not only the first, at the line of the token met.
    for token in ("GROUP c.country", "SELEC customer_id"):
        assert "syntax error" in error(f"{syntax}:{line_of(syntax, token)}: ")
    assert not (tmp_path / "store").exists()

    (tmp_path / "shop.sql").write_text(SHOP_SQL)
    config = write_config(tmp_path, [shop("shop")], spark_resource, broker)
    done = dbsp(tmp_path, "--config", config, "check")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "dbsp check: 1 pipeline(s), 2 SQL view(s): no errors"


def jsonl(path, records: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


@pytest.mark.slow
def test_produce_and_step_run_a_users_pipeline_that_dagster_then_shows_as_materialized(
    tmp_path, spark_resource, broker
):
    (tmp_path / "shop.sql").write_text(SHOP_SQL)
    name = f"shop{uuid.uuid4().hex[:6]}"
    config = write_config(tmp_path, [shop(name, max_records_per_step=4)], spark_resource, broker)
    client = KafkaClient(broker.bootstrap)
    client.create_topics({f"{name}.orders": 2, f"{name}.customers": 2})
    customers = [{"customer_id": 1, "name": "ann", "country": "fr"}, {"customer_id": 2, "name": "bo", "country": "de"}]
    orders = [
        {"order_id": 10, "customer_id": 1, "qty": 2, "price": 1.5},
        {"order_id": 11, "customer_id": 2, "qty": 1, "price": 4.0},
        {"order_id": 12, "customer_id": 1, "qty": 5, "price": 2.0},
    ]
    for topic, records in ((f"{name}.customers", customers), (f"{name}.orders", orders)):
        done = dbsp(tmp_path, "--config", config, "produce", topic, jsonl(tmp_path / "r.jsonl", records))
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith(f"dbsp produce: {len(records)} records to {topic} on "), done.stdout

    offsets = lambda: sum(high for _, high in client.offsets([f"{name}.orders", f"{name}.customers"]).values())
    wait_for(lambda: offsets() == 5, 30, "the broker's end offsets to count every record")
    done = dbsp(tmp_path, "--config", config, "step", "--pipeline", name)
    assert done.returncode == 0, done.stdout + done.stderr
    steps = [line for line in done.stdout.splitlines() if line.startswith("step ")]
    # Five records, at most four a step: two steps, each with the demo's line.
    assert re.match(r"step 0: events 0\.\.4, rows 4 in / \d+ out, [\d.]+ s \(.*compute", steps[0]), done.stdout
    assert steps[1].startswith("step 1: events 4..5, rows 1 in / "), done.stdout
    assert "dead letters (input records that could not be decoded): 0" in done.stdout

    # A deletion, then nothing new: one step, then none.
    retract = jsonl(tmp_path / "d.jsonl", [{**orders[2], "_weight": -1}])
    assert dbsp(tmp_path, "--config", config, "produce", f"{name}.orders", retract).returncode == 0
    wait_for(lambda: offsets() == 6, 30, "the broker's end offsets to count the deletion")
    done = dbsp(tmp_path, "--config", config, "step", "--pipeline", name)
    assert [line[:7] for line in done.stdout.splitlines() if line.startswith("step ")] == ["step 2:"], done.stdout
    done = dbsp(tmp_path, "--config", config, "step", "--pipeline", name)
    assert done.returncode == 0 and done.stdout.startswith("dbsp step: no step to run"), done.stdout

    root = str(tmp_path / "store" / name)
    view = read_view(root, "by_country").table.to_pylist()
    assert sorted((r["country"], r["qty"], r["orders"]) for r in view) == [("de", 1, 1), ("fr", 2, 1)]
    with DagsterInstance.from_config(str(tmp_path / "dbsp" / "dagster")) as instance:
        for sink in ("by_country", "spend"):
            materialized = instance.get_materialized_partitions(AssetKey([name, sink]))
            assert materialized == {f"{s:010d}" for s in range(3)}, (sink, materialized)


@pytest.mark.slow
def test_a_demo_without_producer_says_what_to_do_and_a_failure_is_one_line(
    tmp_path, monkeypatch, capsys, spark_resource, broker
):
    monkeypatch.setenv("DBSP_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home" / "dagster"))
    (tmp_path / "shop.sql").write_text(SHOP_SQL)
    config = write_config(tmp_path, [shop("shop")], spark_resource, broker)
    assert main(["--config", config, "demo", "--pipeline", "shop"]) == 2
    said = capsys.readouterr().err
    assert said.startswith("dbsp demo: pipeline 'shop' has no producer: ") and "dbsp produce" in said, said
    # An error that is not the project's own (a circuit function failing) is a line too.
    (tmp_path / "broken_circuit.py").write_text("def circuit():\n    raise RuntimeError('the circuit is broken')\n")
    settings = yaml.safe_load(open(config))
    settings["pipelines"] = [
        {"name": "b", "circuit": "broken_circuit:circuit", "sources": {"x": "b.x"}, "sinks": ["y"]}
    ]
    KafkaClient(broker.bootstrap).create_topics({"b.x": 1})
    (tmp_path / "dbsp.yaml").write_text(yaml.safe_dump(settings))
    assert main(["--config", config, "step", "--pipeline", "b"]) == 2
    said = capsys.readouterr().err
    assert said.startswith("dbsp step: RuntimeError: the circuit is broken (traceback in "), said
    assert "Traceback" not in said and said.count("\n") == 1
    log = said.rsplit("traceback in ", 1)[1].rstrip(")\n")
    assert "Traceback" in open(log).read()


def test_a_producer_module_beside_the_configuration_file_imports(tmp_path):
    (tmp_path / "beside_producer.py").write_text("def records(start, count, seed):\n    return {}\n")
    settings = {
        "pipelines": [{**shop("shop"), "sql": str(tmp_path / "shop.sql"), "producer": "beside_producer:records"}]
    }
    (tmp_path / "shop.sql").write_text(SHOP_SQL)
    path = list(sys.path)
    project = parse_project(settings, "dbsp.yaml", base=str(tmp_path))
    assert project.pipelines[0].producer == "beside_producer:records"
    assert sys.path == path
