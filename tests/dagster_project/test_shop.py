"""An online shop's own pipeline (tests/dagster_project/shop.py: two JSON topics with
TIMESTAMP, DATE and DECIMAL columns, eight views) through Kafka and Dagster, at 1 and 2
workers: at every step each view's output log, and its current table as ``dbsp show`` and
the UI's preview read it, equal Spark batch SQL of the same text over the records decoded.
Bad records of each kind are dead letters with their reasons; a step whose customers were
all dead letters fails the checks of the views that read them."""

import json
from collections import Counter
from datetime import UTC

import pytest
from dagster import instance_for_test

from circuits.sql import batch_views
from dagster_project.status import dead_letters_note
from storage.views import read_view

from .harness import integral, sql_harness
from .shop import BAD, SCHEMAS, VIEWS, Shop


def naive_utc(value):
    """A Delta table's UTC timestamp (tz-aware from pyarrow) as Spark's client gives it."""
    return value.astimezone(UTC).replace(tzinfo=None) if getattr(value, "tzinfo", None) else value


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_the_shops_views_equal_spark_batch_sql_at_every_step(spark_resource, spark, broker, tmp_path, workers):
    shop = Shop()
    with instance_for_test() as instance:
        name = f"shop{workers}"
        sources = {t: f"{name}.{t}" for t in SCHEMAS}
        h = sql_harness(
            tmp_path,
            broker.bootstrap,
            instance,
            spark_resource,
            VIEWS,
            name=name,
            schemas=SCHEMAS,
            sources=sources,
            workers=workers,
        )
        # New customers and orders, then orders updated too; the bad records in the second step.
        for t, sizes in enumerate([(12, 25, 0), (3, 20, 6), (2, 15, 8)]):
            records = shop.step(*sizes)
            records["orders"] += BAD["orders"] if t == 1 else []
            for topic, rows in records.items():
                h.send(topic, [json.dumps(r).encode() for r in rows])
            run = h.run(int(h.tick().run_requests[0].partition_key))
            assert run.success
            pipeline = h.pipeline(spark)
            tables = {topic: spark.createDataFrame(rows, SCHEMAS[topic]) for topic, rows in shop.tables().items()}
            expected = batch_views(spark, VIEWS, tables)
            for view, frame in expected.items():
                want = Counter(tuple(r) for r in frame.collect())
                assert integral(pipeline.outputs.read(view, 0, 10**9)) == want, (t, view)
                shown = read_view(h.root, view).table.to_pylist()
                assert Counter(tuple(naive_utc(v) for v in r.values()) for r in shown) == want, (t, view)
            assert all(integral(pipeline.outputs.read(v, 0, 10**9)) for v in ("daily_revenue", "hourly", "tiers"))
            metadata = {
                e.asset_key.path[-1]: e.materialization.metadata for e in run.get_asset_materialization_events()
            }
            assert all("view_preview" in m and "view_error" not in m for m in metadata.values())
            assert all(c.passed for c in run.get_asset_check_evaluations()), t
        reasons = {r.value: r.reason for r in pipeline.inputs.dead_letters().collect()}
        assert len(reasons) == len(BAD["orders"]), reasons
        assert any(
            "expected decimal(10,2), got 12.345 (more than 2 digits after the point)" in r for r in reasons.values()
        )
        assert any("expected timestamp, got 'yesterday'" in r for r in reasons.values())

        # A step whose customers are all dead letters: the views reading customers fail their check.
        h.send("customers", [json.dumps(r).encode() for r in BAD["customers"]])
        run = h.run(int(h.tick().run_requests[0].partition_key))
        assert run.success
        checks = {c.asset_key.path[-1]: c for c in run.get_asset_check_evaluations()}
        failed = sorted(view for view, c in checks.items() if not c.passed)
        assert failed == ["busy_countries", "daily_revenue", "no_orders", "spending", "tiers", "top_customers"]
        assert checks["spending"].metadata["dead_letters/customers"].value == 1
        assert "expected date, got '2024-02-30'" in checks["spending"].metadata["dead_letter_reasons/customers"].value
        assert checks["hourly"].passed and checks["latest_order"].passed  # they read no customers
        # Over every step, the customers' share is low: dbsp status names none.
        note = dead_letters_note(h.root, h.spec.sources, h.spec.max_dead_letter_share)
        assert note[0].startswith(f"dead letters (input records that could not be decoded): {len(BAD['orders']) + 1}")
        assert len(note) == 1
        loud = dead_letters_note(h.root, h.spec.sources, 0.0)[1:]
        assert [line.split(":")[0:2] for line in loud] == [
            ["too many dead letters", f" input 'customers' (topic 'shop{workers}.customers')"],
            ["too many dead letters", f" input 'orders' (topic 'shop{workers}.orders')"],
        ]
