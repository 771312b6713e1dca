"""``dbsp``: the project's command line.

Local state lives under ``$DBSP_HOME`` (default ``./.dbsp``): the pipelines' Delta tables,
the embedded broker's and Spark Connect server's pids and logs, and the Dagster home (``$DAGSTER_HOME`` unless set),
so partitions, runs and sensor cursors survive a restart.
"""

import argparse
import os
import sys

from circuits.errors import DbspError
from circuits.spark import stop_connect_server
from sensors.broker import stop_local_broker
from sensors.ingest import run_steps
from sensors.status import report
from storage.pipeline import status as position

from .config import HOME_ENV, home, load_project
from .demo import run_demo
from .factory import describe, open_pipeline
from .resources import build_resources

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
    config = os.path.join(os.environ["DAGSTER_HOME"], "dagster.yaml")
    if not os.path.exists(config):
        with open(config, "w") as f:
            f.write(DAGSTER_YAML)


def _pipeline(args: argparse.Namespace):
    project = load_project(args.config)
    names = [p.name for p in project.pipelines]
    name = args.pipeline or names[0]
    if name not in names:
        raise DbspError(f"--pipeline {name}: no such pipeline; configured: {names}")
    spec = next(p for p in project.pipelines if p.name == name)
    return project.model_copy(update={"pipelines": [spec]}), spec


def demo(args: argparse.Namespace) -> int:
    """Runs the Nexmark views end to end through Dagster and checks q4 against Spark batch SQL."""
    project, _ = _pipeline(args)
    result = run_demo(project, args.steps, args.events_per_step, args.seed, args.reset, log=print)
    print("\nq4, average closing price per category (maintained incrementally, read from its Delta output log):")
    for category, avg_final in sorted(result.q4):
        print(f"  category {category}: {avg_final:,.2f}")
    print(f"\nq4 equals Spark batch SQL over the whole input log: {result.q4_matches}")
    print("The embedded Kafka broker and Spark Connect server keep running for the next command; `dbsp stop` stops them.")
    return 0 if result.q4_matches and result.steps else 1


def status(args: argparse.Namespace) -> int:
    """Prints the committed step, checkpoint version, layout, lease and lag per partition."""
    project, spec = _pipeline(args)
    resources = build_resources(project)
    print(f"pipeline {spec.name}")
    print(describe(report(resources["store"].pipeline_root(spec.name), resources["kafka"].source(spec))))
    return 0


def recover(args: argparse.Namespace) -> int:
    """Runs every divided but uncommitted step (optionally breaking a dead run's lease)."""
    project, spec = _pipeline(args)
    resources = build_resources(project)
    pipeline = open_pipeline(spec, resources["spark"], resources["store"])
    if args.break_lease:
        print(f"broke the lease: {pipeline.lease.break_()}")
    at = position(pipeline.root)
    with pipeline.lease.held(f"dbsp recover (pid {os.getpid()})"):
        ran = run_steps(pipeline, resources["kafka"].source(spec), at.committed_step, at.divided_step - 1)
    print(f"ran steps {list(ran)}; next step {position(pipeline.root).committed_step}")
    return 0


def rescale(args: argparse.Namespace) -> int:
    """Changes the layout: cold (checkpoint, move, checkpoint) or hot (copy first, then switch)."""
    project, spec = _pipeline(args)
    resources = build_resources(project)
    pipeline = open_pipeline(spec, resources["spark"], resources["store"])
    prepared = pipeline.prepare_rescale(args.workers, args.strategy, args.k) if args.hot else None
    with pipeline.lease.held(f"dbsp rescale (pid {os.getpid()})", wait=spec.lease_wait_seconds):
        report = pipeline.finish_rescale(prepared) if prepared else pipeline.rescale(args.workers, args.strategy, args.k)
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
    """``dagster dev`` on this project's workspace with the project's Dagster home."""
    target = ["-w", "workspace.yaml"] if os.path.exists("workspace.yaml") else ["-m", "dagster_project.definitions"]
    os.execvp("dagster", ["dagster", "dev", *target, *args.dagster_args])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dbsp", description="Incremental views with distributed DBSP on Spark, run by Dagster.")
    parser.add_argument("--config", help="pipeline configuration file (default: $DBSP_CONFIG, ./dbsp.yaml, the built-in demo)")
    commands = parser.add_subparsers(dest="command", required=True)

    d = commands.add_parser("demo", help="the main job: Nexmark from the embedded broker through Dagster, checked")
    d.add_argument("--steps", type=int, default=5)
    d.add_argument("--events-per-step", type=int, default=1000)
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--reset", action="store_true", help="start the pipeline over (delete its Delta tables first)")
    d.set_defaults(run=demo)

    for name, fn, text in (
        ("status", status, "committed step, checkpoint, layout, lease and lag per partition"),
        ("recover", recover, "run every divided but uncommitted step"),
        ("stop", stop, "stop the embedded Kafka broker and Spark Connect server"),
    ):
        c = commands.add_parser(name, help=text)
        c.set_defaults(run=fn)
    r = commands.add_parser("rescale", help="change the number of workers (the vnode layout)")
    r.add_argument("--workers", type=int, required=True)
    r.add_argument("--strategy", choices=["fixed", "dynamic"], help="default: the current layout's")
    r.add_argument("--k", type=float, help="the dynamic strategy's maximum inaccuracy (default 0.1)")
    r.add_argument("--hot", action="store_true", help="copy the moved state first, pausing only to switch")
    r.set_defaults(run=rescale)

    for name in ("demo", "status", "recover", "rescale"):
        commands.choices[name].add_argument("--pipeline", help="pipeline name (default: the first configured)")
    commands.choices["recover"].add_argument("--break-lease", action="store_true", help="take the lease from a run that died")

    v = commands.add_parser("dev", help="dagster dev with the project's Dagster home")
    v.add_argument("dagster_args", nargs=argparse.REMAINDER)
    v.set_defaults(run=dev)

    args = parser.parse_args(argv)
    _prepare_home()
    try:
        return args.run(args)
    except DbspError as e:
        print(f"dbsp {args.command}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
