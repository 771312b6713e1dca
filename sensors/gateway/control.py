"""The gateway's control endpoint: how the offset sensor asks for a flush, and ``dbsp
gateway status`` for the figures.

A running gateway serves HTTP on ``gateway.control_host:control_port`` and writes where,
with its pid, to ``<home>/gateway.json``.  ``POST /flush`` makes every source hand over its
partly filled buffer, waits until the broker acknowledged everything produced, commits the
cursors and answers the figures; the sensor calls it just before it reads the end offsets
to cut a step, so the step holds every record the gateway had read (the demand-based flush
of docs/gateway.md: a partial buffer waits for a step that needs it, never for a timer).
``GET /status`` answers the figures alone.  ``POST /rescale?workers=N`` moves the sources to
N I/O threads while they run (ICADD, :mod:`.workers`) and answers once it is over; it is
refused (500, saying why) while a migration runs.
"""

from __future__ import annotations

import json
import os
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from .errors import GatewayError

STATE_FILE = "gateway.json"


class ControlServer:
    """Serves ``flush`` (POST /flush) and ``status`` (GET /status) on a thread of its own."""

    def __init__(
        self,
        host: str,
        port: int,
        flush: Callable[[], dict],
        status: Callable[[], dict],
        rescale: Callable[[int], dict] | None = None,
    ) -> None:
        routes = {("POST", "/flush"): flush, ("GET", "/status"): status}
        if rescale is not None:
            routes[("POST", "/rescale")] = lambda workers: rescale(int(workers))

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, method: str) -> None:
                parts = urllib.parse.urlsplit(self.path)
                route = routes.get((method, parts.path))
                if route is None:
                    self.send_error(404, "POST /flush, GET /status or POST /rescale?workers=N")
                    return
                try:
                    code, body = 200, route(**dict(urllib.parse.parse_qsl(parts.query)))
                except Exception as e:  # the caller sees why, the gateway keeps serving
                    code, body = 500, {"error": f"{type(e).__name__}: {e}"}
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._answer("GET")

            def do_POST(self) -> None:
                self._answer("POST")

            def log_message(self, format: str, *args) -> None:
                pass  # the gateway's own log says what matters

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="gateway-control", daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self, home: str) -> None:
        self._thread.start()
        os.makedirs(home, exist_ok=True)
        with open(os.path.join(home, STATE_FILE), "w") as f:
            json.dump({"pid": os.getpid(), "url": self.url}, f)

    def stop(self, home: str) -> None:
        self._server.shutdown()
        self._server.server_close()
        _remove_state(home, os.getpid())


def _remove_state(home: str, pid: int) -> None:
    path = os.path.join(home, STATE_FILE)
    try:
        with open(path) as f:
            if json.load(f).get("pid") == pid:
                os.remove(path)
    except (OSError, ValueError):
        pass


def running_url(home: str) -> str | None:
    """The control URL of the gateway running for ``home``, or None when none runs."""
    try:
        with open(os.path.join(home, STATE_FILE)) as f:
            state = json.load(f)
        os.kill(state["pid"], 0)
        return state["url"]
    except (OSError, ValueError, KeyError, ProcessLookupError):
        return None


def require_running(home: str) -> str:
    """The control URL of the gateway running for ``home``; an error saying how to start one."""
    url = running_url(home)
    if url is None:
        raise GatewayError(f"no gateway runs with its state in {home}: start one with: dbsp gateway")
    return url


def call(url: str, path: str, timeout: float) -> dict:
    """``POST /flush``, ``GET /status`` or ``POST /rescale?workers=N`` of the gateway at ``url``."""
    method = "GET" if path == "/status" else "POST"
    request = urllib.request.Request(url + path, method=method, data=b"" if method == "POST" else None)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.load(response)
    except urllib.error.HTTPError as e:
        raise GatewayError(f"the gateway at {url} failed {method} {path}: {e.read().decode(errors='replace')}") from e
    except (urllib.error.URLError, TimeoutError, OSError) as e:
        raise GatewayError(
            f"the gateway at {url} did not answer {method} {path} within {timeout:g} s ({e}); "
            "check it runs (dbsp gateway status) or restart it (dbsp gateway)"
        ) from e


def flush_running(home: str, timeout: float = 30.0) -> dict | None:
    """Flushes the gateway running for ``home`` and returns its figures; None when none runs."""
    url = running_url(home)
    return None if url is None else call(url, "/flush", timeout)


FIGURES = "_gateway"


def record_figures(root: str, step: int, figures: dict) -> None:
    """Keeps the gateway's per-source figures as they stood when ``step`` was cut."""
    os.makedirs(os.path.join(root, FIGURES), exist_ok=True)
    path = os.path.join(root, FIGURES, f"{step:010d}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(figures, f)
    os.replace(path + ".tmp", path)


UNFLUSHED = "_gateway_unflushed"


def record_unflushed(root: str, step: int, reason: str) -> None:
    """Keeps why ``step`` was cut without the gateway's flush."""
    os.makedirs(os.path.join(root, UNFLUSHED), exist_ok=True)
    with open(os.path.join(root, UNFLUSHED, f"{step:010d}.txt"), "w") as f:
        f.write(reason)


def unflushed_steps(root: str, first: int, last: int) -> dict[int, str]:
    """The steps of ``first..last`` cut without the gateway's flush, with why."""
    directory = os.path.join(root, UNFLUSHED)
    steps = [int(name[:10]) for name in os.listdir(directory)] if os.path.isdir(directory) else []
    reasons = {}
    for step in sorted(s for s in steps if first <= s <= last):
        with open(os.path.join(directory, f"{step:010d}.txt")) as f:
            reasons[step] = f.read()
    return reasons


def figures_of_steps(root: str, first: int, last: int) -> dict | None:
    """What the gateway read for steps ``first..last``: per source the bytes, waits for a
    buffer and errors between the cut before ``first`` and the cut of ``last`` (None when
    no gateway figures were kept for them)."""
    directory = os.path.join(root, FIGURES)
    kept = sorted(int(name[:10]) for name in os.listdir(directory)) if os.path.isdir(directory) else []
    upto = [s for s in kept if s <= last]
    if not upto or upto[-1] < first:
        return None
    before = [s for s in kept if s < first]
    end = _load(directory, upto[-1])["sources"]
    start = _load(directory, before[-1])["sources"] if before else {}
    return {
        name: {k: figures.get(k, 0) - start.get(name, {}).get(k, 0) for k in ("bytes", "waits", "errors")}
        | {"status": figures.get("status")}
        for name, figures in end.items()
    }


def _load(directory: str, step: int) -> dict:
    with open(os.path.join(directory, f"{step:010d}.json")) as f:
        return json.load(f)
