"""Bad input and bad circuits get errors that name what is wrong and where."""

from __future__ import annotations

import pytest
from pyspark.sql import functions as F

from circuits import (
    Circuit,
    CircuitChangedError,
    CircuitDefinitionError,
    ExpressionError,
    InMemoryStateStore,
    SchemaMismatchError,
    StepRunner,
    agg,
    from_rows,
)
from circuits.errors import lost_with_an_executor


def counting_circuit() -> Circuit:
    c = Circuit("counts")
    c.input("words", "word string, n bigint").group_by("word").agg(total=agg.sum("n")).output("totals")
    return c


@pytest.mark.slow
def test_delta_with_a_wrongly_typed_column_names_input_and_column(spark):
    runner = StepRunner(counting_circuit(), spark, InMemoryStateStore())
    bad = from_rows(spark, [("a", "1", 1)], "word string, n string")
    with pytest.raises(SchemaMismatchError, match=r"input 'words': column 'n' has type string, declared bigint"):
        runner.step({"words": bad})


def test_delta_missing_a_column_names_it(spark):
    runner = StepRunner(counting_circuit(), spark, InMemoryStateStore())
    with pytest.raises(SchemaMismatchError, match=r"input 'words': column 'n' \(bigint\) is declared but missing"):
        runner.step({"words": from_rows(spark, [("a", 1)], "word string")})


def test_delta_with_an_extra_column_names_it(spark):
    runner = StepRunner(counting_circuit(), spark, InMemoryStateStore())
    with pytest.raises(SchemaMismatchError, match=r"'extra'"):
        runner.step({"words": from_rows(spark, [("a", 1, 2, 1)], "word string, n bigint, extra int")})


def test_non_integer_weight_is_refused(spark):
    runner = StepRunner(counting_circuit(), spark, InMemoryStateStore())
    delta = spark.createDataFrame([("a", 1, 0.5)], "word string, n bigint, _weight double")
    with pytest.raises(SchemaMismatchError, match=r"weights must be integers"):
        runner.step({"words": delta})


def test_unknown_input_is_refused(spark):
    runner = StepRunner(counting_circuit(), spark, InMemoryStateStore())
    with pytest.raises(SchemaMismatchError, match=r"no input\(s\) \['nope'\]"):
        runner.step({"nope": from_rows(spark, [], "word string, n bigint")})


def test_missing_column_in_an_expression_names_operator_and_declaration_site(spark):
    c = Circuit("typo")
    words = c.input("words", "word string, n bigint")
    words.filter(F.col("count") > 1).output("big")  # the line the error must point at
    with pytest.raises(ExpressionError) as error:
        StepRunner(c, spark, InMemoryStateStore())
    message = str(error.value)
    assert "operator 'filter'" in message
    assert "test_errors.py:" in message
    assert "count" in message


def test_changed_circuit_on_existing_state_is_refused(spark):
    store = InMemoryStateStore()
    StepRunner(counting_circuit(), spark, store)
    changed = Circuit("counts")
    changed.input("words", "word string, n bigint").group_by("word").agg(total=agg.max("n")).output("totals")
    with pytest.raises(CircuitChangedError, match=r"fingerprint .* restore the original circuit"):
        StepRunner(changed, spark, store)


def test_same_circuit_built_twice_has_the_same_fingerprint():
    assert counting_circuit().fingerprint() == counting_circuit().fingerprint()


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda c, s: s.join(s, "word", how="outer"), "how='outer' is not supported"),
        (lambda c, s: s.group_by(), "group_by\\(\\) needs at least one key"),
        (lambda c, s: s.group_by("word").agg(_total=agg.count()), "must not start with '_'"),
        (lambda c, s: s.group_by("word").agg(total=agg.sum(None)), "sum needs a column"),
        (lambda c, s: c.input("words", "a int"), "declared twice"),
        (lambda c, s: Circuit("other").input("x", "a int").union(s), "stream of circuit 'bad' used in 'other'"),
    ],
)
def test_bad_circuits_are_refused_when_built(build, message):
    c = Circuit("bad")
    s = c.input("words", "word string, n bigint")
    with pytest.raises(CircuitDefinitionError, match=message):
        build(c, s)


def test_rows_lost_with_an_executor_are_told_from_other_failures_anywhere_in_the_chain():
    def raised(outer: Exception, inner: Exception) -> Exception:
        try:
            try:
                raise inner
            except Exception as e:
                raise outer from e
        except Exception as e:
            return e

    lost = RuntimeError("[CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND] Checkpoint block rdd_50_0 not found! Either the executor")
    assert lost_with_an_executor(raised(ValueError("writing tables ['output:v'] failed"), lost))
    assert not lost_with_an_executor(raised(ValueError("writing tables failed"), RuntimeError("[DIVIDE_BY_ZERO]")))
