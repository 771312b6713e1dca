"""What the demo shows of each step and at its end: a failed step's own error, each
step's own events, the dead letters; no q4 check after a failed step."""

from collections import Counter

from dagster import job, op

from dagster_project.commands import _demo_summary
from dagster_project.demo import DemoResult, StepReport, events_of, step_report
from storage.errors import InputTimeoutError
from storage.logs import DivisionLog, Range


@op
def times_out():
    try:
        raise ConnectionError("the server closed the stream")
    except ConnectionError as e:
        raise InputTimeoutError("step 3's input was not persisted within 60 s\nsecond line\nthird\nfourth") from e


@op
def breaks():
    raise RuntimeError("boom")


def failed_report(the_op) -> StepReport:
    @job(name=f"failing_{the_op.name}")
    def failing():
        the_op()

    return step_report(3, (0, 10), failing.execute_in_process(raise_on_error=False), 1.0)


def test_a_failed_step_line_names_the_projects_error_not_dagsters_wrapper():
    line = failed_report(times_out).line()
    assert line == "step 3 FAILED after 1.0 s: step 3's input was not persisted within 60 s\n  second line\n  third", (
        line
    )


def test_a_failed_step_line_names_another_error_with_its_type():
    assert failed_report(breaks).line() == "step 3 FAILED after 1.0 s: RuntimeError: boom"


def test_each_step_has_its_own_events_after_a_recovery(tmp_path):
    log = DivisionLog(str(tmp_path))
    log.record(0, [Range("t.bids", 0, 0, 60), Range("t.persons", 0, 0, 40)])
    log.record(1, [Range("t.bids", 0, 60, 100)])  # divided, not run: a later tick runs 1 and 2 together
    log.record(2, [Range("t.bids", 0, 100, 130), Range("t.persons", 0, 40, 50)])
    assert [events_of(str(tmp_path), s) for s in range(3)] == [(0, 100), (100, 140), (140, 180)]


def test_a_failed_demo_stops_without_checking_q4_and_says_where_the_trace_is():
    steps = [
        StepReport(0, (0, 10), True, 1.0, checks=2, checks_passed=2),
        StepReport(1, (10, 20), False, 1.0, error="x"),
    ]
    lines = _demo_summary(DemoResult(steps, Counter(), None, ["dead letters (...): 0"]), "", "/logs/demo.log")
    assert "dbsp demo stopped after step 1 failed; its full trace is in the log below" in lines
    assert not any("q4" in line for line in lines), lines
    assert "dead letters (...): 0" in lines and lines[-1].endswith("/logs/demo.log")


def test_a_view_unequal_to_spark_batch_sql_says_no_and_fails_the_demo():
    steps = [StepReport(0, (0, 10), True, 1.0, checks=2, checks_passed=2)]
    result = DemoResult(steps, Counter(), {"revenue": True, "busy": False}, ["dead letters (...): 0"])
    lines = _demo_summary(result, "", "/logs/demo.log")
    assert "revenue equals Spark batch SQL: yes" in lines and "busy equals Spark batch SQL: no" in lines
    assert not result.succeeded


def test_an_input_of_dead_letters_alone_fails_the_demo_and_its_views_do_not_say_all_is_well():
    steps = [StepReport(0, (0, 10), True, 1.0, checks=2, checks_passed=0)]
    loud = "too many dead letters: input 'bids' (topic 't.bids'): 10 of 10 records were dead letters (100%), ..."
    result = DemoResult(steps, Counter(), {"revenue": True}, ["dead letters (...): 10", loud])
    lines = _demo_summary(result, "", "/logs/demo.log")
    assert "revenue equals Spark batch SQL: yes" not in lines
    assert "revenue equals Spark batch SQL over the records decoded (too many dead letters, below): yes" in lines
    assert loud in lines and "asset checks: 0 of 2 passed" in lines
    assert not result.succeeded
