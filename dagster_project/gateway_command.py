"""``dbsp gateway``: runs the source gateway, shows its figures, rescales it.

It loads what the gateway process needs and no more: no Dagster, no PySpark (a
pipeline's circuit is not built: the gateway reads its topics only)."""

import argparse
import json
import logging
import signal
import sys
import threading
import time

from rich.console import Console
from rich.table import Table

from circuits.errors import DbspError
from gateway.control import call, require_running
from gateway.gateway import Gateway
from storage.cursors import CursorStore

from .config import home, load_project
from .console import log_path
from .kafka import kafka_settings
from .store import store_settings


def gateway(args: argparse.Namespace) -> int:
    """``dbsp gateway``: runs the source gateway until interrupted; ``status``: its figures;
    ``rescale --workers N``: moves the running gateway's sources to N I/O threads (ICADD)."""
    if args.action == "status":
        return _gateway_status(args)
    if args.action == "rescale":
        return _gateway_rescale(args)
    project = load_project(args.config, circuits=False)
    if not project.sources:
        raise DbspError("the configuration has no sources: add a sources: section to dbsp.yaml (see dbsp.example.yaml)")
    kafka, store = kafka_settings(project), store_settings(project)
    bootstrap = kafka.bootstrap({g.topic: project.topic_partitions(g.topic) for g in project.sources})
    path = log_path(home("logs"), "gateway")
    logging.basicConfig(filename=path, level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    running = Gateway(
        project.gateway,
        project.sources,
        bootstrap,
        kafka.client_config(),
        home("gateway"),
        CursorStore(store.gateway_cursors(project.gateway.cursors)),
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
