"""``dbsp``: the project's command line.

Local state lives under ``$DBSP_HOME`` (default ``./.dbsp``): the pipelines' Delta tables,
the embedded broker's and Spark Connect server's pids and logs, and the Dagster home (``$DAGSTER_HOME`` unless set),
so partitions, runs and sensor cursors survive a restart.
"""

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import signal
import sys
import threading
import time
import traceback

import pyarrow as pa
from dagster import DagsterInstance
from rich.console import Console
from rich.table import Table

from circuits.daemon import listening
from circuits.errors import DbspError
from circuits.spark import stop_connect_server
from gateway.control import call, require_running
from gateway.gateway import Gateway
from sensors.broker import stop_local_broker
from sensors.status import report
from storage.cursors import CursorStore
from storage.lease import Holder
from storage.views import read_view

from . import devserver
from .config import CONFIG_ENV, HOME_ENV, home, load_project
from .console import Progress, log_path, output_to_log
from .demo import DemoResult, run_demo
from .factory import open_pipeline
from .klogs_demo import run_klogs_demo
from .resources import EMBEDDED, build_resources
from .status import dead_letters_note, status_text

DAGSTER_YAML = """\
# Written by dbsp: one run per pipeline at a time, in the order requested (steps run in
# order); runs of a pipeline carry the tag dbsp/pipeline.
run_queue:
  max_concurrent_runs: 4
  dequeue_interval_seconds: 1
  tag_concurrency_limits:
    - key: "dbsp/pipeline"
      value:
        applyLimitPerUniqueValue: true
      limit: 1
telemetry:
  enabled: false
"""


def _prepare_home() -> None:
    """Absolute ``$DBSP_HOME`` (so Dagster's run processes agree) and a default Dagster home in it."""
    os.environ[HOME_ENV] = home()
    os.environ.setdefault("DAGSTER_HOME", home("dagster"))
    os.makedirs(os.environ["DAGSTER_HOME"], exist_ok=True)
    _write_once(os.path.join(os.environ["DAGSTER_HOME"], "dagster.yaml"), DAGSTER_YAML)
    # Dagster's UI greets a home without this file with its "join the community" dialog.
    _write_once(os.path.join(os.environ["DAGSTER_HOME"], ".nux", "nux.yaml"), "seen: 1\n")


def _write_once(path: str, text: str) -> None:
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)


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
    project, _ = _pipeline(args)
    path = log_path(home("logs"), "demo")
    with output_to_log(path, echo=args.verbose, until_exit=True) as terminal:
        # Verbose: the events scroll by, so no live line to garble them.
        with Progress(
            terminal, live=False if args.verbose else None, mirror=None if args.verbose else sys.stdout
        ) as progress:
            progress.line(
                f"dbsp demo: {args.steps} steps of {args.events_per_step} Nexmark events, run through Dagster"
            )
            try:
                result = run_demo(project, args.steps, args.events_per_step, args.seed, args.reset, progress, args.sql)
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
        succeeded = run_klogs_demo(load_project(args.config), args.one_step, DagsterInstance.get())
    if not succeeded:
        print(f"dbsp klogs-demo: a step failed; full log: {path}", file=sys.stderr)
    return 0 if succeeded else 1


def _reason(e: Exception) -> str:
    # The project's own errors name the setting and the fix; others need their type.
    return str(e) if isinstance(e, DbspError) else f"{type(e).__name__}: {e}"


def _demo_summary(result: DemoResult, daemons: str, path: str) -> list[str]:
    passed, checks = result.checks
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
        *(f"{view} equals Spark batch SQL: {'yes' if same else 'no'}" for view, same in (result.matches or {}).items()),
    ]
    stopped = (
        [f"dbsp demo stopped after step {failed.step} failed; its full trace is in the log below"] if failed else []
    )
    return [
        "",
        *(stopped or checked),
        f"asset checks: {passed} of {checks} passed",
        result.dead_letters,
        *([daemons] if daemons else []),
        f"full log (Dagster's events, Spark's output): {path}",
    ]


def status(args: argparse.Namespace) -> int:
    """Prints the committed step, checkpoint version, layout, lease and lag per partition."""
    project, spec = _pipeline(args)
    resources = build_resources(project)
    root = resources["store"].pipeline_root(spec.name)
    print(f"pipeline {spec.name}")
    print(status_text(report(root, resources["kafka"].source(spec))))
    print(dead_letters_note(root))
    return 0


def recover(args: argparse.Namespace) -> int:
    """Runs every divided but uncommitted step (optionally breaking a dead run's lease)."""
    project, spec = _pipeline(args)
    resources = build_resources(project)
    pipeline = open_pipeline(spec, resources["spark"], resources["store"])
    recovery = pipeline.recover(resources["kafka"].source(spec).read, _holder("recover"), args.break_lease)
    if args.break_lease:
        print(f"broke the lease: {recovery.broken}")
    print(f"ran steps {list(recovery.ran)}; next step {recovery.next_step}")
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
        (f"Kafka broker on port {broker_port} (its records are gone)", stop_local_broker(broker_port, home("broker"))),
    ):
        print(f"{'stopped' if stopped else 'not running:'} the embedded {what}")
    return 0


def dev(args: argparse.Namespace) -> int:
    """``dagster dev`` on this project's workspace with the project's Dagster home, stopped
    whole by Ctrl-C (see :mod:`dagster_project.devserver`)."""
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
    code = devserver.run(
        devserver.dagster_dev_command(target, args.dagster_args), say=lambda s: print(s, file=sys.stderr)
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


def gateway(args: argparse.Namespace) -> int:
    """``dbsp gateway``: runs the source gateway until interrupted; ``status``: its figures;
    ``rescale --workers N``: moves the running gateway's sources to N I/O threads (ICADD)."""
    if args.action == "status":
        return _gateway_status(args)
    if args.action == "rescale":
        return _gateway_rescale(args)
    project = load_project(args.config)
    if not project.sources:
        raise DbspError("the configuration has no sources: add a sources: section to dbsp.yaml (see dbsp.example.yaml)")
    kafka = build_resources(project)["kafka"]
    bootstrap = kafka.bootstrap({g.topic: project.topic_partitions(g.topic) for g in project.sources})
    path = log_path(home("logs"), "gateway")
    logging.basicConfig(filename=path, level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    running = Gateway(
        project.gateway,
        project.sources,
        bootstrap,
        kafka.client_config(),
        home("gateway"),
        CursorStore.of_gateway(project.gateway.cursors, home("gateway")),
    )
    running.start()
    print(
        f"dbsp gateway: {len(project.sources)} source group(s) into Kafka at {bootstrap}; control {running.control.url}"
    )
    for name, address in running.status()["listeners"].items():
        print(f"  {name}: listening on {address}")
    print(f"  full log: {path}; stop with Ctrl-C")
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(args.report_every):
        print(_gateway_line(running.status()), flush=True)
    running.stop()
    print(f"dbsp gateway: stopped; {_gateway_line(running.status())}")
    return 0


def _gateway_line(figures: dict) -> str:
    sources = figures["sources"].values()
    live = sum(1 for f in sources if f["status"] in ("starting", "running", "retrying"))
    read = sum(f["bytes"] for f in sources)
    produced = sum(f.get("bytes_sent", 0) for f in sources)
    return (
        f"{time.strftime('%H:%M:%S')} sources {live} live / {len(figures['sources'])}; "
        f"read {read:,} B, produced {produced:,} B; buffers in use {figures['pool']['in_use']}/{figures['pool']['buffers']}; "
        f"waits for a buffer {sum(f.get('waits', 0) for f in sources)}; errors {sum(f['errors'] for f in sources)}"
    )


def _gateway_status(args: argparse.Namespace) -> int:
    url = require_running(home("gateway"))
    figures = call(url, "/status", timeout=10)
    if args.json:
        print(json.dumps(figures, indent=2))
        return 0
    print(
        f"gateway pid {figures['pid']} at {url}, up {figures['uptime_seconds']} s, {figures['threads']} I/O thread(s)"
    )
    print(_gateway_line(figures))
    _print_workers(figures.get("workers", []))
    table = Table("source", "status", "bytes", "acked", "buffers", "waits", "errors", "last error")
    ranked = sorted(figures["sources"].items(), key=lambda item: (-item[1]["errors"], -item[1]["bytes"], item[0]))
    for name, f in ranked[: args.limit]:
        table.add_row(
            name,
            f["status"],
            f"{f['bytes']:,}",
            f"{f.get('acked', 0):,}",
            str(f["buffers"]),
            str(f.get("waits", 0)),
            str(f["errors"]),
            f.get("last_error") or "",
        )
    # A file source's id is its path: never cut or fold it (a folded name cannot be found
    # with grep, nor copied), so the table is as wide as the longest id needs.
    source = table.columns[0]
    source.no_wrap, source.min_width = True, max((len(name) for name, _ in ranked[: args.limit]), default=6)
    Console(width=max(Console().width, 140, source.min_width + 100)).print(table)
    if len(ranked) > args.limit:
        print(f"({len(ranked) - args.limit} more sources; --limit N or --json shows them)")
    return 0


def _print_workers(workers: list[dict]) -> None:
    for w in workers:
        to = f" -> {w['to_workers']} workers" if w.get("to_workers") else ""
        print(
            f"  worker {w['worker']}: {w['phase']}{to}, version {w.get('version')}, {w.get('sources', 0)} sources, "
            f"whitelist {w.get('whitelist', 0)}, hold {w.get('hold', 0)}, keys moved {w.get('moved', 0)}"
        )


def _gateway_rescale(args: argparse.Namespace) -> int:
    url = require_running(home("gateway"))
    if args.workers is None or args.workers < 1:
        print("dbsp gateway rescale: give --workers N (1 or more)", file=sys.stderr)
        return 2
    answer = call(url, f"/rescale?workers={args.workers}", timeout=120)
    r = answer["rescale"]
    print(
        f"gateway rescaled {r['from']} -> {r['to']} workers (version {r['version']}): {r['moved']} sources moved "
        f"in {r['seconds']} s"
    )
    _print_workers(answer["workers"])
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="dbsp", description="Incremental views with distributed DBSP on Spark, run by Dagster."
    )
    parser.add_argument(
        "--config", help="pipeline configuration file (default: $DBSP_CONFIG, ./dbsp.yaml, the built-in demo)"
    )
    commands = parser.add_subparsers(dest="command", required=True)

    d = commands.add_parser("demo", help="the main job: Nexmark from the embedded broker through Dagster, checked")
    d.add_argument("--steps", type=int, default=5, help="steps to run, one per batch of events (default 5)")
    d.add_argument(
        "--events-per-step", type=int, default=1000, help="Nexmark events produced for each step (default 1000)"
    )
    d.add_argument("--seed", type=int, default=0, help="the event generator's random seed (default 0)")
    d.add_argument("--reset", action="store_true", help="start the pipeline over (delete its Delta tables first)")
    d.add_argument(
        "--verbose", action="store_true", help="show Dagster's events on the terminal too (they always go to the log)"
    )
    d.add_argument("--sql", metavar="FILE", help="run the Nexmark inputs through the views of this SQL file instead")
    d.set_defaults(run=demo)

    k = commands.add_parser("klogs-demo", help="the KLogs paper's word count through Dagster, printing its totals")
    k.add_argument(
        "--one-step", action="store_true", help="all four messages in one step (default: a step per message)"
    )
    k.add_argument(
        "--verbose", action="store_true", help="show Dagster's events on the terminal too (they always go to the log)"
    )
    k.set_defaults(run=klogs_demo)

    for name, fn, text in (
        ("status", status, "committed step, checkpoint, layout, lease and lag per partition"),
        ("recover", recover, "run every divided but uncommitted step"),
        ("stop", stop, "stop the embedded Kafka broker and Spark Connect server"),
    ):
        c = commands.add_parser(name, help=text)
        c.set_defaults(run=fn)
    r = commands.add_parser("rescale", help="change the number of workers (the vnode layout)")
    r.add_argument("--workers", type=int, required=True, help="workers (Spark tasks) to spread the state's vnodes over")
    r.add_argument("--strategy", choices=["fixed", "dynamic"], help="default: the current layout's")
    r.add_argument(
        "--k", type=float, help="the dynamic strategy's maximum inaccuracy (default: the current layout's, else 0.1)"
    )
    r.add_argument("--hot", action="store_true", help="copy the moved state first, pausing only to switch")
    r.set_defaults(run=rescale)

    w = commands.add_parser("show", help="print a sink's current view as a table (time travel: --step)")
    w.add_argument("sink", help="a sink of the pipeline")
    w.add_argument("--step", type=int, help="the view as of this committed step (default: the latest committed)")
    w.add_argument("--limit", type=int, default=20, help="rows to print (default 20)")
    w.set_defaults(run=show)

    for name in ("demo", "status", "recover", "rescale", "show"):
        commands.choices[name].add_argument("--pipeline", help="pipeline name (default: the first configured)")
    commands.choices["recover"].add_argument(
        "--break-lease", action="store_true", help="take the lease from a run that died"
    )

    g = commands.add_parser(
        "gateway", help="run the source gateway (the configured sources into Kafka), show its status, or rescale it"
    )
    g.add_argument("action", nargs="?", choices=["run", "status", "rescale"], default="run")
    g.add_argument("--workers", type=int, help="I/O threads to move the running gateway's sources to (rescale)")
    g.add_argument("--report-every", type=float, default=10.0, help="seconds between progress lines (run)")
    g.add_argument("--limit", type=int, default=30, help="sources to list (status)")
    g.add_argument("--json", action="store_true", help="print the figures as JSON (status)")
    g.set_defaults(run=gateway)

    # Every option after ``dev`` but --config is dagster dev's (-p PORT, -h HOST, --help: its own help).
    v = commands.add_parser(
        "dev", help="dagster dev with the project's Dagster home (options: dagster dev's)", add_help=False
    )
    v.set_defaults(run=dev)
    for command in commands.choices.values():  # --config before or after the command
        command.add_argument(
            "--config", default=argparse.SUPPRESS, help="pipeline configuration file (as before the command)"
        )

    args, unknown = parser.parse_known_args(argv)
    if args.command == "dev":
        args.dagster_args = unknown
    elif unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    _prepare_home()
    try:
        return args.run(args)
    except DbspError as e:
        print(f"dbsp {args.command}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
