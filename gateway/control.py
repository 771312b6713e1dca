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
