"""A step's Spark settings cost one round trip to the server, not one each, and are set every step."""

from pyspark.sql import functions as F

from circuits import Circuit, InMemoryStateStore, StepRunner, from_rows
from circuits.spark import COMPILED, INTERPRETED, round_trips, set_all


def test_several_settings_are_one_round_trip_and_all_set(spark):
    settings = {"spark.sql.shuffle.partitions": "3", **INTERPRETED}
    with round_trips(spark) as calls:
        set_all(spark, settings)
    assert calls["Config"] == 1
    assert {key: spark.conf.get(key) for key in settings} == settings


def _one_row_step(spark, name: str):
    """A runner of a one-filter circuit, and a step of one row for it of known size and
    retractions (as a durable step's are): the settings are its only Config calls."""
    c = Circuit(name)
    c.input("a", "k int, v int").filter(F.col("v") > 1).output("o")
    runner = StepRunner(c, spark, InMemoryStateStore(), workers=2)
    delta = from_rows(spark, [(1, 2, 1)], c.inputs["a"])
    return lambda: runner.step({"a": delta}, retracting=[], rows=1)


def test_a_steps_settings_are_one_round_trip(spark):
    step = _one_row_step(spark, "settings")
    with round_trips(spark) as calls:
        step()
    assert calls["Config"] == 1


def test_every_step_sets_its_settings_again(spark):
    """The server session's settings are shared by every process and every pipeline on it:
    another's step between two of this runner's may have changed them."""
    step = _one_row_step(spark, "resettings")
    step()
    set_all(spark, {"spark.sql.shuffle.partitions": "5", **COMPILED})  # another pipeline's large step
    with round_trips(spark) as calls:
        step()
    assert calls["Config"] == 1
    settings = {"spark.sql.shuffle.partitions": "2", **INTERPRETED}
    assert {key: spark.conf.get(key) for key in settings} == settings
