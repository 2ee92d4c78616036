"""Running the service: open the reader (recover the metadata), then serve with uvicorn until SIGTERM.

The metadata is recovered before the port opens, so a bad configuration or an unreachable cluster
fails the start with its message instead of a service that answers 503 forever. uvicorn bounds what
one connection may send (request line and headers; the endpoints take no body) and answers 503 past
``max_concurrent_requests``.
"""

from __future__ import annotations

import uvicorn

from reader.http.app import create_app
from reader.http.config import ServiceSettings
from reader.http.service import FetchService
from reader.remote import RemoteReader
from tiering_core.logs import get_logger

log = get_logger(__name__)


def serve(settings: ServiceSettings) -> None:
    """Serve until SIGINT/SIGTERM (in-flight requests finish, then the reader closes)."""
    http = settings.http
    service = FetchService(RemoteReader.open(settings), http.cursors, http.memory_wait_seconds)
    try:
        app = create_app(service, http)
        config = uvicorn.Config(
            app, host=http.host, port=http.port, log_config=None, access_log=False,
            limit_concurrency=http.max_concurrent_requests, timeout_graceful_shutdown=30, server_header=False,
        )  # fmt: skip
        server = uvicorn.Server(config)
        log.info("reader service starting", host=http.host, port=http.port,
                 authenticated=bool(http.tokens), max_fetch_bytes=http.max_fetch_bytes)  # fmt: skip
        server.run()
    finally:
        service.close()
