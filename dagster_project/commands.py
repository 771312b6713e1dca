"""The commands of ``dbsp`` that run pipelines, read their state or manage the embedded
daemons (Dagster, Spark and Delta loaded here, not by the command line's parser)."""

import argparse
import contextlib
import dataclasses
import json
import os
import sys
import time
import traceback

import pyarrow as pa
from rich.console import Console
from rich.table import Table

from circuits import jvm
from circuits.daemon import listening
from circuits.errors import DbspError
from circuits.spark import stop_connect_server
from sensors.broker import stop_local_broker
from sensors.division import DivisionPolicy, cut_next
from sensors.status import report
from storage.lease import Holder
from storage.pipeline import status as pipeline_status
from storage.views import read_view

from . import devserver
from .check import check_configuration
from .config import CONFIG_ENV, ConfigError, home, load_project
from .console import Progress, log_path, output_to_log
from .demo import DemoResult, StepReport, events_of, run_demo
from .factory import open_pipeline, record_committed
from .kafka import EMBEDDED
from .klogs_demo import run_klogs_demo
from .resources import build_resources
from .status import dead_letters_note, status_text


def _pipeline(args: argparse.Namespace):
    project = load_project(args.config)
    names = [p.name for p in project.pipelines]
    name = args.pipeline or names[0]
    if name not in names:
        raise DbspError(f"--pipeline {name}: no such pipeline; configured: {names}")
    spec = next(p for p in project.pipelines if p.name == name)
    return project.model_copy(update={"pipelines": [spec]}), spec


def demo(args: argparse.Namespace) -> int:
    """Runs the Nexmark views end to end through Dagster and checks each against Spark batch SQL.

    The terminal gets progress and a line per step; Dagster's events and everything else
    the run writes go to a log file under ``$DBSP_HOME/logs`` (also to the terminal with
    ``--verbose``)."""
    project, spec = _pipeline(args)
    if spec.producer is None:
        raise ConfigError(
            f"pipeline {spec.name!r} has no producer: the demo makes its events with one "
            "(producer: 'module:function' in dbsp.yaml, the module beside it or importable; see docs/feeding.md); "
            f"to run your own records instead, send them with `dbsp produce TOPIC FILE.jsonl` and run the steps "
            f"with `dbsp step --pipeline {spec.name}`"
        )
    path = log_path(home("logs"), "demo")
    with output_to_log(path, echo=args.verbose, until_exit=True) as terminal:
        # Verbose: the events scroll by, so no live line to garble them.
        with Progress(
            terminal, live=False if args.verbose else None, mirror=None if args.verbose else sys.stdout
        ) as progress:
            into = " merged into Delta tables" if args.source == "delta" else ""
            progress.line(
                f"dbsp demo: {args.steps} steps of {args.events_per_step} Nexmark events{into}, run through Dagster"
            )
            try:
                result = run_demo(
                    project, args.steps, args.events_per_step, args.seed, args.reset, progress, args.sql, args.source
                )
            except (Exception, KeyboardInterrupt) as e:  # the traceback goes to the log, one line to the terminal
                traceback.print_exc()
                interrupted = isinstance(e, KeyboardInterrupt)
                progress.line("dbsp demo: interrupted" if interrupted else f"dbsp demo failed: {_reason(e)}")
                progress.line(f"full log: {path}")
                return 130 if interrupted else 1
            for line in _demo_summary(result, _daemons_note(project), path):
                progress.line(line)
    return 0 if result.succeeded else 1


def klogs_demo(args: argparse.Namespace) -> int:
    """The KLogs paper's word count through Dagster: its sink prints a JSON line per
    total on the terminal; Dagster's events and Spark's output go to the log."""
    path = log_path(home("logs"), "klogs-demo")
    with output_to_log(path, echo=args.verbose) as terminal, contextlib.redirect_stdout(terminal):
        succeeded = run_klogs_demo(load_project(args.config), args.one_step, devserver.open_instance())
    if not succeeded:
        print(f"dbsp klogs-demo: a step failed; full log: {path}", file=sys.stderr)
    return 0 if succeeded else 1


def _reason(e: Exception) -> str:
    # The project's own errors name the setting and the fix; others need their type.
    return str(e) if isinstance(e, DbspError) else f"{type(e).__name__}: {e}"


def _demo_summary(result: DemoResult, daemons: str, path: str) -> list[str]:
    passed, checks = result.checks
    over = " over the records decoded (too many dead letters, below)" if result.too_many_dead_letters else ""
    failed = result.failed_step
    q4 = (
        [
            "q4, average closing price per category (maintained incrementally, read from its Delta output log):",
            *(f"  category {category}: {avg_final:,.2f}" for category, avg_final in sorted(result.q4)),
        ]
        if result.q4
        else []
    )
    checked = [
        *q4,
        *(
            f"{view} equals Spark batch SQL{over}: {'yes' if same else 'no'}"
            for view, same in (result.matches or {}).items()
        ),
    ]
    stopped = (
        [f"dbsp demo stopped after step {failed.step} failed; its full trace is in the log below"] if failed else []
    )
    return [
        "",
        *(stopped or checked),
        f"asset checks: {passed} of {checks} passed",
        *result.dead_letters,
        *([daemons] if daemons else []),
        f"full log (Dagster's events, Spark's output): {path}",
    ]


def check(args: argparse.Namespace) -> int:
    """Checks the configuration and every view against Spark before any step is recorded."""
    errors, summary = check_configuration(args.config)
    if errors:
        raise ConfigError(f"{len(errors)} error(s):\n" + "\n".join(errors))
    print(f"dbsp check: {summary}: no errors")
    return 0


def status(args: argparse.Namespace) -> int:
    """Prints the committed step, checkpoint version, layout, lease and lag per partition."""
    project, spec = _pipeline(args)
    resources = build_resources(project)
    root = resources["store"].pipeline_root(spec.name)
    print(f"pipeline {spec.name}")
    print(status_text(report(root, _source(resources, spec))))
    print("\n".join(dead_letters_note(root, spec.sources, spec.max_dead_letter_share)))
    return 0


def recover(args: argparse.Namespace) -> int:
    """Runs every divided but uncommitted step (optionally breaking a dead run's lease);
    Dagster records the steps it ran as materialized."""
    project, spec = _pipeline(args)
    resources = build_resources(project)
    pipeline = open_pipeline(spec, resources["spark"], resources["store"])
    holder = _holder("recover")
    recovery = pipeline.recover(_source(resources, spec, verify=True).read, holder, args.break_lease)
    if args.break_lease:
        print(f"broke the lease: {recovery.broken}")
    record_committed(devserver.open_instance(), spec, pipeline, recovery.ran, holder.name)
    print(f"ran steps {list(recovery.ran)}; next step {recovery.next_step}")
    return 0


def _source(resources: dict, spec, verify: bool = False):
    return resources["kafka"].source(spec, resources["store"], resources["spark"], verify)


def quarantine(args: argparse.Namespace) -> int:
    """Leaves an input record out of a step not committed yet (see
    :meth:`storage.pipeline.Pipeline.quarantine`); ``dbsp recover`` then runs the step."""
    try:
        record = json.loads(args.record)
    except ValueError as e:
        raise DbspError(f"the record is not JSON ({e}); give it as a dead letter's value shows it") from e
    if not isinstance(record, dict):
        raise DbspError(f"the record is a JSON {type(record).__name__}; give an object of its columns and _weight")
    project, spec = _pipeline(args)
    resources = build_resources(project)
    pipeline = open_pipeline(spec, resources["spark"], resources["store"])
    pipeline.quarantine(args.step, args.input, record)
    print(f"step {args.step} leaves out the {args.input} record {args.record}; run `dbsp recover` to run it")
    return 0


def step(args: argparse.Namespace) -> int:
    """Divides what the pipeline's sources hold into steps, as the offset sensor does but
    without waiting, and runs each step not yet committed, as its Dagster run does (the same
    division and step code), printing the demo's line per step; Dagster records each step
    as materialized."""
    project, spec = _pipeline(args)
    resources = build_resources(project)
    source = _source(resources, spec, verify=True)
    pipeline = open_pipeline(spec, resources["spark"], resources["store"])
    policy = DivisionPolicy(spec.max_records_per_step, 0)
    while (cut := cut_next(pipeline.divisions, source, policy)).step is not None:
        pass
    position = pipeline_status(pipeline.root)
    if position.committed_step == position.divided_step:
        print(f"dbsp step: no step to run ({cut.reason})")
        return 0
    holder, instance = _holder("step", spec.lease_wait_seconds), devserver.open_instance()
    with pipeline.lease.held(holder):
        for s in range(position.committed_step, position.divided_step):
            pipeline.timings.clear()
            started = time.perf_counter()
            ran = pipeline.run_steps(source.read, s, s)
            report = StepReport(s, events_of(pipeline.root, s), True, time.perf_counter() - started)
            for metadata in record_committed(instance, spec, pipeline, ran, holder.name).values():
                report.add({k: getattr(v, "value", v) for k, v in metadata.items()})
            print(report.line())
    print("\n".join(dead_letters_note(pipeline.root, spec.sources, spec.max_dead_letter_share)))
    return 0


def produce(args: argparse.Namespace) -> int:
    """Sends each line of a file to a pipeline's topic as one record (for trying a pipeline
    out; a real producer writes the topic itself)."""
    project = load_project(args.config)
    spec = next((p for p in project.pipelines if args.topic in p.topics.values()), None)
    if spec is None:
        topics = sorted(t for p in project.pipelines for t in p.topics.values())
        raise ConfigError(f"{args.topic!r} is no pipeline's input topic; the topics are {topics}")
    try:
        with open(args.file, "rb") as f:
            values = [line.rstrip(b"\r\n") for line in f if line.strip()]
    except OSError as e:
        raise ConfigError(f"cannot read {args.file}: {e.strerror}") from None
    source = build_resources(project)["kafka"].topics(spec)
    sent = source.client().produce(args.topic, values)
    print(f"dbsp produce: {sent} records to {args.topic} on {source.bootstrap_servers} (pipeline {spec.name})")
    return 0


def _holder(command: str, wait: float = 0.0) -> Holder:
    """This command as its pipeline's lease holder (named so ``dbsp status`` tells who holds it)."""
    return Holder(f"dbsp {command} (pid {os.getpid()})", wait)


def show(args: argparse.Namespace) -> int:
    """Prints a sink's current view (as of the latest committed step, or ``--step``) as a
    table, read from its Delta table by delta-rs: no Spark, no broker."""
    project, spec = _pipeline(args)
    if args.sink not in spec.sink_names:
        raise DbspError(f"{args.sink!r} is not a sink of pipeline {spec.name!r}; its sinks are {spec.sink_names}")
    if args.sink not in spec.views:
        raise DbspError(
            f"sink {args.sink!r} of pipeline {spec.name!r} has `current: false`: only its change log is kept; "
            f"set current: true in its sinks entry to keep its view (the next step builds it from the log)"
        )
    if args.limit < 0:
        raise DbspError(f"--limit {args.limit}: give a number of rows, 0 or more")
    root = build_resources(project)["store"].pipeline_root(spec.name)
    snapshot = read_view(root, args.sink, args.step)  # every row: the first ones are known once sorted
    print_view(
        dataclasses.replace(snapshot, table=sorted_rows(snapshot.table).slice(0, args.limit)),
        f"{spec.name}/{args.sink}",
    )
    return 0


def sorted_rows(table: pa.Table) -> pa.Table:
    """The rows by their columns, left to right (a view's key columns lead: the group's
    keys of an aggregate), nulls last; nested columns take no part."""
    flat = [name for name, kind in zip(table.column_names, table.schema.types) if not pa.types.is_nested(kind)]
    return table.sort_by([(name, "ascending") for name in flat]) if flat else table


def print_view(snapshot, title: str) -> None:
    table = Table()
    for name in snapshot.table.column_names:
        table.add_column(name)
    for row in snapshot.table.to_pylist():
        table.add_row(*("" if v is None else str(v) for v in row.values()))
    console = Console()
    console.print(f"{title} as of step {snapshot.step} (Delta version {snapshot.version}):", soft_wrap=True)
    console.print(table)
    shown = snapshot.table.num_rows
    console.print(f"{shown} of {snapshot.rows} rows" if shown < snapshot.rows else f"{snapshot.rows} rows")


def rescale(args: argparse.Namespace) -> int:
    """Changes the layout: cold (checkpoint, move, checkpoint) or hot (copy first, then switch)."""
    project, spec = _pipeline(args)
    resources = build_resources(project)
    pipeline = open_pipeline(spec, resources["spark"], resources["store"])
    holder = _holder("rescale", spec.lease_wait_seconds)
    report = pipeline.rescale(args.workers, args.strategy, args.k, hot=args.hot, holder=holder)
    print(f"before: {report.before.describe()}\nafter:  {report.after.describe()}")
    print(
        f"vnodes moved: {report.vnodes_moved} of {report.before.vnodes} ({report.fraction_moved:.1%}); "
        f"state rewritten: {report.rows_rewritten} rows, {report.bytes_rewritten} bytes; "
        f"copy {report.copy_seconds:.1f} s while steps ran, pause {report.pause_seconds:.1f} s"
    )
    return 0


def stop(args: argparse.Namespace) -> int:
    """Stops the embedded Kafka broker and Spark Connect server that ``dbsp`` started."""
    resources = build_resources(load_project(args.config))
    spark_port, broker_port = resources["spark"].embedded_port, resources["kafka"].embedded_port
    for what, stopped in (
        (f"Spark Connect server on port {spark_port}", stop_connect_server(home("spark"), spark_port)),
        (
            f"Kafka broker on port {broker_port} (its records stay on disk)",
            stop_local_broker(broker_port, home("broker")),
        ),
    ):
        print(f"{'stopped' if stopped else 'not running:'} the embedded {what}")
    return 0


def jars(args: argparse.Namespace) -> int:
    """Resolves every JAR set and compiles the engine's own JAR now (as the first command that
    needs one would), or copies them to ``--copy-to``."""
    if args.copy_to:
        for folder in jvm.copy_to(args.copy_to):
            print(folder)
        return 0
    for jar_set in (jvm.SPARK, jvm.KAFKA):
        found = jvm.jars(jar_set)
        print(f"{jar_set.name}: {len(found)} JARs in {os.path.dirname(found[0])}")
    print(f"decoder: {jvm.decoder_jar()}")
    return 0


def dev(args: argparse.Namespace) -> int:
    """``dagster dev`` on this project's workspace with the project's Dagster home, and the
    resident step worker that runs its runs beside it, stopped whole by Ctrl-C (see
    :mod:`dagster_project.devserver`)."""
    target = ["-w", "workspace.yaml"] if os.path.exists("workspace.yaml") else ["-m", "dagster_project.definitions"]
    if args.config:  # the code servers dagster dev starts read it from the environment
        os.environ[CONFIG_ENV] = os.path.abspath(args.config)
    try:
        problem = (
            None if "--help" in args.dagster_args else devserver.port_problem(*devserver.address(args.dagster_args))
        )
    except ValueError:
        problem = None  # a malformed -p: dagster dev says what is wrong with it
    if problem:
        print(f"dbsp dev: {problem}; stop what listens there or choose another port: dbsp dev -p PORT", file=sys.stderr)
        return 2
    devserver.create_instance(os.environ["DAGSTER_HOME"])
    code = devserver.run(
        devserver.dagster_dev_command(target, args.dagster_args),
        say=lambda s: print(s, file=sys.stderr),
        beside=None if "--help" in args.dagster_args else devserver.step_worker_command(),
    )
    if code == devserver.INTERRUPTED:
        print(f"dbsp dev: stopped. {_daemons_note(load_project(args.config))}".strip(), file=sys.stderr)
    return code


def _daemons_note(project) -> str:
    """Which embedded daemons keep running after the command (they are shared on purpose)."""
    resources = build_resources(project)
    kafka, spark = resources["kafka"], resources["spark"]
    running = [
        f"{what} on port {port}"
        for what, port, embedded in (
            ("Kafka broker", kafka.embedded_port, kafka.bootstrap_servers == EMBEDDED),
            ("Spark Connect server", spark.embedded_port, spark.remote == EMBEDDED and not spark.master),
        )
        if embedded and listening(port)
    ]
    if not running:
        return ""
    verb, them = ("keeps", "it") if len(running) == 1 else ("keep", "them")
    return f"The embedded {' and '.join(running)} {verb} running for the next command; `dbsp stop` stops {them}."
