"""The demo's feeds: a configured ``producer`` function's events sent to a pipeline's
topics (``dbsp demo`` and the ``<pipeline>_produce`` Dagster job), or the Nexmark demo's
changes merged into Delta tables by Spark (``dbsp demo --source delta``)."""

import json

from circuits.library.nexmark import DELETE
from circuits.sql.parse import ddl_columns
from sensors.ingest import KafkaSource
from storage import location


def produce_events(source: KafkaSource, records_of, events: int, seed: int) -> int:
    """Sends the next ``events`` events of a demo producer to the source's topics and
    returns the index of the first.  The sequence continues from the number of records
    already in the topics, so producing twice never repeats an event."""
    client = source.client()
    start = sum(high for _, high in client.offsets(list(source.topics.values())).values())
    for handle, records in records_of(start, events, seed).items():
        client.produce(source.topics[handle], (json.dumps(r).encode() for r in records))
    return start


def create_change_fed(spark, table: str, ddl: str) -> None:
    """A Delta table of columns ``ddl`` at ``table`` with the change data feed on, unless one is there."""
    location.reach_spark(spark, table)
    spark.sql(
        f"CREATE TABLE IF NOT EXISTS delta.`{location.spark_path(table)}` ({ddl}) USING delta "
        "TBLPROPERTIES (delta.enableChangeDataFeed = true)"
    )


def merge_changes(spark, table: str, ddl: str, key: str, changes: list[tuple[str, tuple]]) -> None:
    """One ``MERGE INTO`` the table (one version): each ``("upsert", row)`` updates the row
    with its ``key`` or inserts it, each ``("delete", row)`` deletes the row with its key.
    Merging the same changes again changes no row's values."""
    columns = ddl_columns(ddl)
    batch = spark.createDataFrame([(*row, change) for change, row in changes], f"{ddl}, _change string")
    batch.createOrReplaceTempView("_dbsp_demo_changes")
    spark.sql(
        f"MERGE INTO delta.`{location.spark_path(table)}` t USING _dbsp_demo_changes s ON t.{key} = s.{key} "
        f"WHEN MATCHED AND s._change = '{DELETE}' THEN DELETE "
        f"WHEN MATCHED THEN UPDATE SET {', '.join(f'{c} = s.{c}' for c in columns)} "
        f"WHEN NOT MATCHED AND s._change <> '{DELETE}' THEN INSERT ({', '.join(columns)}) "
        f"VALUES ({', '.join(f's.{c}' for c in columns)})"
    )
