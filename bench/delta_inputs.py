"""A step over a Delta table's new version against Spark batch SQL of the same views over
the table; and two chained pipelines (the second reads the first's view) against the
second's views recomputed alone.

The source: a Delta table ``orders`` of ``--rows`` rows (id, customer, status, amount)
with the change data feed on, written by Spark's own Delta writer on the Spark Connect
server that runs the steps.  Pipeline ``shop`` (views :data:`SHOP`) reads it as
``delta:<path>``; pipeline ``tiers`` (view :data:`TIERS`) reads ``view:shop.by_customer``.
Step 0 of each takes the whole table (its first version), unrecorded.  Then per round, a
MERGE into the table updates ``--fraction`` of its rows (half of those changed rows'
amounts, the other half's statuses) and inserts as many new ones, one version; then:

- ours: ``shop``'s step over that version (the sensor's cut, the change feed's read, the
  input log, the step, the output log and the current views' update; `cut_next` and
  ``Pipeline.run_steps`` as a step run calls them), then ``tiers``'s step over ``shop``'s
  new step;
- peer: Spark batch SQL of ``shop``'s views over the table, each written as a Delta table
  (overwritten, as a recompute publishes it), and of ``tiers``'s view alone recomputed from
  the table (``shop.by_customer``'s query as its subquery), written the same way;
- peer: one ``spark-pipelines run`` (Spark Declarative Pipelines, from the project's
  PySpark) of the same views file over the table (a temporary view ``orders`` over
  ``delta.`path```, Delta's JARs and settings given to its Spark), as a user's scheduled
  run refreshes it: SDP recomputes every materialized view each run.  Its wall time (its
  own Spark started, as a user's run does) and its run alone (``Starting run`` to ``Run is
  COMPLETED`` in its log); ``--no-sdp`` leaves it out.

A ``max`` over groups of millions of rows under updates re-reads the touched groups'
values every step (``circuits.operators.nonlinear.Aggregate``); ``--no-extremes`` takes
``by_status``'s ``sum`` instead, to show the rest of the step without it.

Both sides run on one Spark Connect server (``--url``, or one started for the run), the
peer in a session with Spark's defaults. Medians over ``--rounds`` rounds after
``--warmup``, and the ratios: shop's step / shop's recompute, both steps / tiers's
recompute, shop's step / SDP's run. At the end each view of ours equals its recompute and SDP's table.

    python bench/delta_inputs.py --rows 10000000 --fraction 0.001 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common import on_spark, peer_session, timed
from pyspark.sql import SparkSession
from sdp import run_sdp, sdp_project

from circuits.jvm import SPARK, jars
from circuits.spark import DELTA_CONF
from dagster_project.config import parse_project
from dagster_project.factory import open_pipeline
from dagster_project.resources import KafkaResource, SparkResource, StoreResource
from sensors.division import DivisionPolicy, cut_next
from storage.logs import DivisionLog
from storage.views import view_uri

SHOP = """
CREATE MATERIALIZED VIEW by_customer AS
  SELECT customer, count(*) AS orders, sum(amount) AS spent FROM orders GROUP BY customer;
CREATE MATERIALIZED VIEW by_status AS
  SELECT status, count(*) AS orders, max(amount) AS largest FROM orders GROUP BY status;
CREATE MATERIALIZED VIEW large AS
  SELECT customer % 100 AS region, count(*) AS orders FROM orders WHERE amount > 900 GROUP BY customer % 100;
"""
TIERS = """
CREATE MATERIALIZED VIEW tiers AS
  SELECT orders, count(*) AS customers, sum(spent) AS spent FROM by_customer GROUP BY orders;
"""
SCHEMA = "id BIGINT, customer BIGINT, status STRING, amount DECIMAL(10,2)"


def orders(spark: SparkSession, first: int, count: int, customers: int, salt: int = 0):
    """Orders ``first..first+count``: a customer of ``customers``, one of 5 statuses, an amount below 1000."""
    return spark.range(first, first + count).selectExpr(
        "id",
        f"pmod(xxhash64(id, {salt}), {customers}) AS customer",
        f"concat('s', pmod(xxhash64(id, {salt} + 1), 5)) AS status",
        f"CAST(pmod(xxhash64(id, {salt} + 2), 100000) / 100 AS DECIMAL(10,2)) AS amount",
    )


def merge(spark: SparkSession, table: str, rows: int, fraction: float, next_id: int, salt: int) -> int:
    """One MERGE: ``fraction`` of ``rows`` existing orders changed (half their amount, half
    their status) and as many new ones inserted; returns the next new id."""
    changed = max(int(rows * fraction), 2)
    picked = spark.range(changed).selectExpr(f"pmod(xxhash64(id, {salt}), {rows}) AS id").distinct()
    updates = picked.join(orders(spark, 0, rows, max(rows // 10, 1)), "id").selectExpr(
        "id",
        "customer",
        "CASE WHEN id % 2 = 0 THEN concat('s', pmod(xxhash64(id, status), 5)) ELSE status END AS status",
        "CASE WHEN id % 2 = 1 THEN CAST(pmod(xxhash64(id, amount), 100000) / 100 AS DECIMAL(10,2)) ELSE amount END AS amount",
    )
    fresh = orders(spark, next_id, changed, max(rows // 10, 1), salt)
    updates.unionByName(fresh).createOrReplaceTempView("bench_changes")
    spark.sql(
        f"MERGE INTO delta.`{table}` t USING bench_changes s ON t.id = s.id "
        "WHEN MATCHED THEN UPDATE SET t.status = s.status, t.amount = s.amount WHEN NOT MATCHED THEN INSERT *"
    )
    return next_id + changed


def recompute(peer: SparkSession, table: str, views: dict[str, str], out: str) -> None:
    """Each view's query over the table, overwriting a Delta table of its own."""
    peer.read.format("delta").load(table).createOrReplaceTempView("orders")
    for name, query in views.items():
        peer.sql(query).write.format("delta").mode("overwrite").save(os.path.join(out, name))


def queries(text: str) -> dict[str, str]:
    from circuits.sql import parse_views

    return {v.name: v.query.sql(dialect="spark") for v in parse_views(text)}


def run(spark: SparkSession, work: str, args: argparse.Namespace) -> None:
    table = os.path.join(work, "orders")
    spark.sql(f"CREATE TABLE delta.`{table}` ({SCHEMA}) USING delta TBLPROPERTIES (delta.enableChangeDataFeed = true)")
    orders(spark, 0, args.rows, max(args.rows // 10, 1)).write.format("delta").mode("append").save(table)
    sums = SHOP.replace("max(amount)", "sum(amount)")
    for name, text in (("shop.sql", SHOP), ("shop_sums.sql", sums), ("tiers.sql", TIERS)):
        with open(os.path.join(work, name), "w") as f:
            f.write(text)
    quick = {"max_wait_seconds": 0, "max_records_per_step": 1_000_000, "workers": args.workers}
    settings = {
        "pipelines": [
            {"name": "shop", "sql": "shop.sql", "sources": {"orders": f"delta:{table}"}, "schemas": {"orders": SCHEMA}}
            | quick,
            {
                "name": "tiers",
                "sql": "tiers.sql",
                "sources": {"by_customer": "view:shop.by_customer"},
                "schemas": {"by_customer": "customer BIGINT, orders BIGINT, spent DECIMAL(20,2)"},
            }
            | quick,
        ]
    }
    if args.no_extremes:
        settings["pipelines"][0]["sql"] = "shop_sums.sql"
    project = parse_project(settings, "the bench's project", base=work)
    spark_resource, store = SparkResource(remote=args.url), StoreResource(root=os.path.join(work, "store"))
    kafka = KafkaResource(bootstrap_servers="localhost:1")  # no topics: never asked
    pipelines = {spec.name: (spec, open_pipeline(spec, spark_resource, store)) for spec in project.pipelines}

    cuts: list[float] = []
    phases: dict[str, dict[str, float]] = {}

    def step(name: str) -> None:
        """One step as a step run takes it; the seconds of its cut (the sensor's) in ``cuts``,
        of its phases in ``phases``."""
        spec, pipeline = pipelines[name]
        before = dict(pipeline.timings)
        source = kafka.source(spec, store, spark_resource, verify=True)
        started = time.perf_counter()
        cut = cut_next(DivisionLog(store.pipeline_root(name)), source, DivisionPolicy(1_000_000, 0))
        cuts.append(time.perf_counter() - started)
        assert cut.step is not None, cut.reason
        pipeline.run_steps(source.read, cut.step, cut.step)
        phases[name] = {k: v - before.get(k, 0.0) for k, v in pipeline.timings.items() if v > before.get(k, 0.0)}

    started = time.perf_counter()
    step("shop")
    step("tiers")
    print(f"step 0 (the table's {args.rows:,} rows): {time.perf_counter() - started:.1f} s", flush=True)
    peer = peer_session(spark, args.url)
    shop_views, tiers_views = queries(sums if args.no_extremes else SHOP), queries(TIERS)
    tiers_alone = {"tiers": tiers_views["tiers"].replace("by_customer", f"({shop_views['by_customer']}) AS c")}
    figures = {k: [] for k in ("shop", "tiers", "shop_batch", "tiers_batch", "sdp_wall", "sdp_run")}
    sdp_spec = sdp_project(
        os.path.join(work, "sdp"),
        os.path.join(work, "shop_sums.sql" if args.no_extremes else "shop.sql"),
        {"orders": f"delta.`{table}`"},
    )
    sdp_jars = jars(SPARK)
    next_id = args.rows
    for i in range(args.warmup + args.rounds):
        next_id = merge(spark, table, args.rows, args.fraction, next_id, salt=i + 1)
        shop = timed(lambda: step("shop"))
        tiers = timed(lambda: step("tiers"))
        shop_cut = cuts[-2]
        shop_batch = timed(lambda: recompute(peer, table, shop_views, os.path.join(work, "batch")))
        tiers_batch = timed(lambda: recompute(peer, table, tiers_alone, os.path.join(work, "batch")))
        sdp, sdp_line = {"wall": float("nan"), "run": float("nan")}, ""
        if not args.no_sdp:
            sdp = run_sdp(sys.executable, sdp_spec, os.path.join(work, f"sdp-{i}.log"), sdp_jars, DELTA_CONF)
            sdp_line = f"; SDP run {sdp['wall']:.2f} s (its run {sdp['run']:.2f} s)"
        print(
            f"round {i}{' (warm-up)' if i < args.warmup else ''}: shop step {shop:.2f} s (its cut {shop_cut:.2f} s), "
            f"tiers step {tiers:.2f} s; "
            f"recompute shop {shop_batch:.2f} s, tiers alone {tiers_batch:.2f} s"
            f"{sdp_line}\n"
            f"  shop's phases: {', '.join(f'{k} {v:.2f} s' for k, v in phases['shop'].items())}",
            flush=True,
        )
        if i >= args.warmup:
            for key, value in zip(figures, (shop, tiers, shop_batch, tiers_batch, sdp["wall"], sdp["run"])):
                figures[key].append(value)
    median = {k: statistics.median(v) for k, v in figures.items()}
    print(f"\nmedians of {args.rounds} rounds, {args.rows:,} rows, {args.fraction:g} of them changed per version:")
    print(
        f"  shop's step {median['shop']:.2f} s / its views recomputed {median['shop_batch']:.2f} s: "
        f"{median['shop'] / median['shop_batch']:.3f}x"
    )
    if not args.no_sdp:
        print(
            f"  shop's step {median['shop']:.2f} s / one spark-pipelines run {median['sdp_wall']:.2f} s: "
            f"{median['shop'] / median['sdp_wall']:.3f}x (its run alone {median['sdp_run']:.2f} s: "
            f"{median['shop'] / median['sdp_run']:.3f}x)"
        )
    both = median["shop"] + median["tiers"]
    print(
        f"  both chained steps {both:.2f} s / tiers recomputed alone {median['tiers_batch']:.2f} s: "
        f"{both / median['tiers_batch']:.3f}x"
    )
    for name, root in (*((v, "shop") for v in shop_views), ("tiers", "tiers")):
        ours = spark.read.format("delta").load(view_uri(store.pipeline_root(root), name))
        batch = spark.read.format("delta").load(os.path.join(work, "batch", name))
        assert ours.count() == batch.count() and ours.exceptAll(batch).isEmpty(), f"view {name} differs"
        if not args.no_sdp and root == "shop":
            theirs = spark.read.parquet(os.path.join(work, "sdp", "spark-warehouse", name)).select(*ours.columns)
            assert ours.count() == theirs.count() and ours.exceptAll(theirs).isEmpty(), f"SDP's {name} differs"
    print(f"  every view equals its recompute{'' if args.no_sdp else ' and SDP table'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--fraction", type=float, default=0.001)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--no-extremes", action="store_true", help="by_status sums the amounts instead of taking their max"
    )
    parser.add_argument("--no-sdp", action="store_true", help="leave out the spark-pipelines run per round")
    parser.add_argument("--url", help="a running Spark Connect server (default: one started for the run)")
    args = parser.parse_args()
    on_spark(run, args, "dbsp-delta-inputs-")


if __name__ == "__main__":
    main()
