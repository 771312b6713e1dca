"""``dbsp``: the project's command line.

This module parses and dispatches only: each command's module (:mod:`.commands`,
:mod:`.gateway_command`) is imported when that command runs, so ``dbsp gateway`` loads
no Dagster and no PySpark.

Local state lives under ``$DBSP_HOME`` (default ``./.dbsp``): the pipelines' Delta tables,
the embedded broker's and Spark Connect server's pids and logs, and the Dagster home (``$DAGSTER_HOME`` unless set),
so partitions, runs and sensor cursors survive a restart.
"""

import argparse
import importlib
import os
import sys
import traceback
from pathlib import Path

from circuits.errors import DbspError

from .config import HOME_ENV, POSTGRES_ENV, ConfigError, home
from .console import log_path

DAGSTER_YAML = """\
# Written by dbsp: one run per pipeline at a time, in the order requested (steps run in
# order); runs of a pipeline carry the tag dbsp/pipeline. Dagster's queue, except that a run
# with nothing ahead of it launches at once (dagster_project/run_coordinator.py).
run_coordinator:
  module: dagster_project.run_coordinator
  class: StepRunCoordinator
  config:
    max_concurrent_runs: 4
    dequeue_interval_seconds: 1
    tag_concurrency_limits:
      - key: "dbsp/pipeline"
        value:
          applyLimitPerUniqueValue: true
        limit: 1
telemetry:
  enabled: false
# Runs execute in the resident step worker that `dbsp dev` starts beside the code server
# (dagster_project/step_worker.py); run monitoring fails a run whose worker died.
run_launcher:
  module: dagster_project.step_worker
  class: StepWorkerLauncher
run_monitoring:
  enabled: true
  poll_interval_seconds: 5
  max_resume_run_attempts: 0
"""
EVENT_LOG_YAML = """\
# Every run's events in one SQLite database, its connections kept open by each process
# (dagster_project/event_log.py). `dbsp dev` creates it before Dagster's processes start.
event_log_storage:
  module: dagster_project.event_log
  class: LocalEventLogStorage
  config:
    base_dir: {base_dir}
"""


POSTGRES_YAML = f"""\
# Runs, events, schedules and sensor cursors in PostgreSQL (dagster-postgres), shared by every
# process and machine that uses this home; the URL, with its password, stays in the environment.
storage:
  postgres:
    postgres_url:
      env: {POSTGRES_ENV}
"""


def dagster_yaml(dagster_home: str, postgres: bool = False) -> str:
    """The ``dagster.yaml`` that ``dbsp`` writes in a new Dagster home: the instance's
    storage in SQLite under the home, or with ``postgres`` in the database that
    ``$DBSP_DAGSTER_POSTGRES_URL`` names."""
    if postgres:
        return DAGSTER_YAML + POSTGRES_YAML
    return DAGSTER_YAML + EVENT_LOG_YAML.format(base_dir=os.path.join(os.path.abspath(dagster_home), "history"))


def _prepare_home() -> None:
    """Absolute ``$DBSP_HOME`` (so Dagster's run processes agree) and a default Dagster home in it."""
    os.environ[HOME_ENV] = home()
    os.environ.setdefault("DAGSTER_HOME", home("dagster"))
    os.makedirs(os.environ["DAGSTER_HOME"], exist_ok=True)
    config = os.path.join(os.environ["DAGSTER_HOME"], "dagster.yaml")
    postgres = bool(os.environ.get(POSTGRES_ENV))
    _write_once(config, dagster_yaml(os.environ["DAGSTER_HOME"], postgres))
    if postgres and POSTGRES_ENV not in Path(config).read_text():
        raise ConfigError(
            f"{POSTGRES_ENV} is set, but {config} (written before) keeps the instance elsewhere: "
            f"add its storage section (docs/configuration.md, 'The Dagster instance'), or move the file "
            f"away for dbsp to write one on Postgres, or unset {POSTGRES_ENV}"
        )
    # Dagster's UI greets a home without this file with its "join the community" dialog.
    _write_once(os.path.join(os.environ["DAGSTER_HOME"], ".nux", "nux.yaml"), "seen: 1\n")


def _write_once(path: str, text: str) -> None:
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)


# The module of each command that is not in .commands.
_MODULES = {"gateway": ".gateway_command"}


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
    d.add_argument(
        "--source",
        choices=["kafka", "delta"],
        default="kafka",
        help="where the events go: the pipeline's Kafka topics (default), or Delta tables a Spark MERGE updates",
    )
    d.set_defaults(run="demo")

    k = commands.add_parser("klogs-demo", help="the KLogs paper's word count through Dagster, printing its totals")
    k.add_argument(
        "--one-step", action="store_true", help="all four messages in one step (default: a step per message)"
    )
    k.add_argument(
        "--verbose", action="store_true", help="show Dagster's events on the terminal too (they always go to the log)"
    )
    k.set_defaults(run="klogs_demo")

    for name, text in (
        ("check", "check the configuration and every view against Spark (exit 2 with the errors, each with file:line)"),
        ("status", "committed step, checkpoint, layout, lease and lag per partition"),
        ("recover", "run every divided but uncommitted step"),
        ("stop", "stop the embedded Kafka broker and Spark Connect server"),
    ):
        c = commands.add_parser(name, help=text)
        c.set_defaults(run=name)
    t = commands.add_parser(
        "step", help="divide what the pipeline's topics hold into steps and run them now, without Dagster's sensor"
    )
    t.set_defaults(run="step")
    p = commands.add_parser("produce", help="send each line of a file (a JSON record) to a pipeline's topic")
    p.add_argument("topic", help="an input topic of a configured pipeline")
    p.add_argument("file", help="a file of records, one JSON object a line (JSON Lines)")
    p.set_defaults(run="produce")
    r = commands.add_parser("rescale", help="change the number of workers (the vnode layout)")
    r.add_argument("--workers", type=int, required=True, help="workers (Spark tasks) to spread the state's vnodes over")
    r.add_argument("--strategy", choices=["fixed", "dynamic"], help="default: the current layout's")
    r.add_argument(
        "--k", type=float, help="the dynamic strategy's maximum inaccuracy (default: the current layout's, else 0.1)"
    )
    r.add_argument("--hot", action="store_true", help="copy the moved state first, pausing only to switch")
    r.set_defaults(run="rescale")

    w = commands.add_parser("show", help="print a sink's current view as a table (time travel: --step)")
    w.add_argument("sink", help="a sink of the pipeline")
    w.add_argument("--step", type=int, help="the view as of this committed step (default: the latest committed)")
    w.add_argument("--limit", type=int, default=20, help="rows to print (default 20)")
    w.set_defaults(run="show")

    q = commands.add_parser(
        "quarantine", help="leave an input record out of a step not committed yet (then: dbsp recover)"
    )
    q.add_argument("--step", type=int, required=True, help="the step whose input holds the record")
    q.add_argument("--input", required=True, help="the record's input (a key of the pipeline's sources)")
    q.add_argument("record", help='the record as JSON, its columns and _weight: {"id": 7, "ts": "x", "_weight": 1}')
    q.set_defaults(run="quarantine")

    for name in ("demo", "status", "recover", "step", "rescale", "show", "quarantine"):
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
    g.set_defaults(run="gateway")

    j = commands.add_parser("jars", help="resolve the engine's JARs now (Delta, Spark's Kafka source, Apache Kafka)")
    j.add_argument(
        "--copy-to",
        metavar="DIR",
        help="also copy them into DIR/spark and DIR/kafka: the folder DBSP_JARS_DIR names on a machine without Maven",
    )
    j.set_defaults(run="jars")

    # Every option after ``dev`` but --config is dagster dev's (-p PORT, -h HOST, --help: its own help).
    v = commands.add_parser(
        "dev", help="dagster dev with the project's Dagster home (options: dagster dev's)", add_help=False
    )
    v.set_defaults(run="dev")
    for command in commands.choices.values():  # --config before or after the command
        command.add_argument(
            "--config", default=argparse.SUPPRESS, help="pipeline configuration file (as before the command)"
        )

    args, unknown = parser.parse_known_args(argv)
    if args.command == "dev":
        args.dagster_args = unknown
    elif unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        _prepare_home()
        run = getattr(importlib.import_module(_MODULES.get(args.run, ".commands"), __package__), args.run)
        return run(args)
    except DbspError as e:
        print(f"dbsp {args.command}: {e}", file=sys.stderr)
    except KeyboardInterrupt:
        print(f"dbsp {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # not the project's own: its type says what it is, the log has its traceback
        path = log_path(home("logs"), args.command)
        with open(path, "w") as log:
            traceback.print_exc(file=log)
        first = (str(e).strip().splitlines() or [""])[0]
        print(f"dbsp {args.command}: {type(e).__name__}: {first} (traceback in {path})", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
