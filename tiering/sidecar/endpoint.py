"""The sidecar's HTTP endpoint on ``metrics_host:metrics_port``.

``/metrics`` serves the Prometheus text (``/metrics?name[]=a&name[]=b``: only those samples, as
prometheus_client's own handler does; with thousands of partitions the whole text is tens of thousands of
series, which a caller polling for one counter should not make the sidecar render), ``/status`` the
sidecar's status as JSON (what ``<state_dir>/status.json`` holds: per partition the copy lag, the last
error and the next retry). Requests are logged at debug level through the structured log (http.server
would print plain lines to stderr).
"""

from __future__ import annotations

import errno
import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from tiering_core.errors import ConfigError
from tiering_core.logs import get_logger

log = get_logger(__name__)
_INDEX = b"/metrics  Prometheus metrics\n/status   the sidecar's status (JSON)\n"


class StatusEndpoint:
    """Listens as soon as it is built (so a taken port fails before anything else starts)."""

    def __init__(self, host: str, port: int, registry: CollectorRegistry, status: Callable[[], dict[str, Any]]) -> None:
        handler = type("Handler", (_Handler,), {"registry": registry, "status": staticmethod(status)})
        try:
            self.server = ThreadingHTTPServer((host, port), handler)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ConfigError(
                    f"metrics_host:metrics_port {host}:{port} is already in use (another sidecar or program listens "
                    "there): set another metrics_port, or metrics_port: null to turn the endpoint off"
                ) from None
            raise ConfigError(f"cannot listen on metrics_host:metrics_port {host}:{port}: {exc.strerror}") from None
        self.server.daemon_threads = True
        self.address = f"{host}:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, name="http-endpoint", daemon=True)
        self._thread.start()
        log.info("serving /metrics and /status", address=self.address)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class _Handler(BaseHTTPRequestHandler):
    registry: CollectorRegistry
    status: Callable[[], dict[str, Any]]

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        path = url.path.rstrip("/")
        if path == "/metrics":
            names = parse_qs(url.query).get("name[]")
            registry = self.registry if not names else self.registry.restricted_registry(names)
            self._send(200, CONTENT_TYPE_LATEST, generate_latest(registry))
        elif path == "/status":
            self._send(200, "application/json", json.dumps(self.status()).encode())
        elif path == "":
            self._send(200, "text/plain; charset=utf-8", _INDEX)
        else:
            self._send(404, "text/plain; charset=utf-8", b"not found; see /metrics and /status\n")

    def _send(self, code: int, content_type: str, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("http request", client=self.client_address[0], request=format % args)
