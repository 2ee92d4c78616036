"""Ranged GETs (``PresignedRanges``) over https: the server's certificate verified against the CA bundle
boto3 is given (AWS_CA_BUNDLE), an untrusted one refused with the store's error, and a plain-http endpoint
never loading a CA bundle (about 50 ms of every reader's start-up). Kept connections: one the server closed while
idle is opened again before it is used, one the server closes as a request goes out carries that GET again on a
new connection, and a new connection closed without an answer is the store unavailable (the fetcher's retry,
not a loop here). The servers are local ones answering Range requests; the S3 semantics are tested against MinIO
in tests/integration/test_stores_s3.py, a real idle close in tests/integration/test_stores_s3_idle.py."""

from __future__ import annotations

import os
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.tls import self_signed
from tiering_core.stores.base import StoreUnavailable
from tiering_core.stores.config import S3StoreConfig
from tiering_core.stores.s3 import S3Store
from tiering_core.stores.s3_ranges import PresignedRanges

BLOB = os.urandom(4096)


class _Ranges(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        start, end = (int(x) for x in self.headers["Range"].removeprefix("bytes=").split("-"))
        body = BLOB[start : end + 1]
        self.send_response(206)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        """Silent: http.server would write a line per request to stderr."""


def _serve(context: ssl.SSLContext | None) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Ranges)
    if context is not None:
        server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"{'https' if context else 'http'}://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def cert(tmp_path: Path) -> Path:
    return self_signed(tmp_path)[0]


@pytest.fixture
def https_endpoint(cert: Path) -> Iterator[str]:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, cert.with_suffix(".key"))
    yield from _serve(context)


@pytest.fixture
def http_endpoint() -> Iterator[str]:
    yield from _serve(None)


def _ranges(endpoint: str) -> PresignedRanges:
    config = S3StoreConfig(bucket="b", endpoint_url=endpoint, region="us-east-1", path_style=True,
                           access_key_id="k", secret_access_key="s", max_attempts=1)  # fmt: skip
    store = S3Store(config)
    return PresignedRanges(store.client, store.bucket, store.endpoint)


def test_https_range_verified_against_the_ca_bundle(https_endpoint: str, cert: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setenv("AWS_CA_BUNDLE", str(cert))
    assert _ranges(https_endpoint).get_range("topic/0/x.log", 100, 1099) == BLOB[100:1100]


def test_https_untrusted_certificate_is_refused_naming_the_key(https_endpoint: str,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.delenv("AWS_CA_BUNDLE", raising=False)
    with pytest.raises(StoreUnavailable, match=r"topic/0/x\.log bytes 0-9.*CERTIFICATE_VERIFY_FAILED"):
        _ranges(https_endpoint).get_range("topic/0/x.log", 0, 9)


def test_plain_http_never_builds_a_tls_context(http_endpoint: str) -> None:
    ranges = _ranges(http_endpoint)
    assert ranges.get_range("topic/0/x.log", 0, 4095) == BLOB
    assert "ssl" not in vars(ranges)


class _KeptConnections:
    """A raw HTTP/1.1 server answering Range requests of BLOB on kept connections, per ``policy``: ``idle``
    closes a connection with no request for 0.2 s (as S3 servers do, later); ``second`` closes each connection
    on its second request without answering it; ``never`` closes each on its first. Counts connections."""

    def __init__(self, policy: str) -> None:
        self.policy = policy
        self.connections = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as requests:
            for n in range(1, 100):
                conn.settimeout(0.2 if self.policy == "idle" else None)
                try:
                    head = [requests.readline()]
                    while head[-1] not in (b"\r\n", b""):
                        head.append(requests.readline())
                except TimeoutError:
                    return  # idle: closed as the server would
                if head[0] == b"" or self.policy == "never" or (self.policy == "second" and n == 2):
                    return
                span = next(line for line in head if line.lower().startswith(b"range:"))
                start, end = (int(x) for x in span.split(b"=")[1].split(b"-"))
                body = BLOB[start : end + 1]
                conn.sendall(b"HTTP/1.1 206 Partial Content\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def kept(request: pytest.FixtureRequest) -> Iterator[_KeptConnections]:
    server = _KeptConnections(request.param)
    yield server
    server.close()


@pytest.mark.parametrize("kept", ["idle"], indirect=True)
def test_a_connection_the_server_closed_while_idle_is_opened_again_before_the_get(kept: _KeptConnections) -> None:
    ranges = _ranges(kept.endpoint)
    assert ranges.get_range("topic/0/x.log", 0, 99) == BLOB[:100]
    assert ranges.get_range("topic/0/x.log", 100, 199) == BLOB[100:200]  # kept: the same connection
    assert kept.connections == 1
    time.sleep(0.5)  # the server closed it meanwhile
    assert ranges.get_range("topic/0/x.log", 200, 299) == BLOB[200:300]
    assert kept.connections == 2


@pytest.mark.parametrize("kept", ["second"], indirect=True)
def test_a_kept_connection_closed_as_the_get_goes_out_carries_it_again_on_a_new_one(kept: _KeptConnections) -> None:
    ranges = _ranges(kept.endpoint)
    for start in range(0, 4000, 1000):
        assert ranges.get_range("topic/0/x.log", start, start + 999) == BLOB[start : start + 1000]
    assert kept.connections == 4  # the second GET of each connection went again on the next one


@pytest.mark.parametrize("kept", ["never"], indirect=True)
def test_a_new_connection_closed_without_an_answer_is_the_store_unavailable(kept: _KeptConnections) -> None:
    with pytest.raises(StoreUnavailable, match=r"topic/0/x\.log bytes 0-9"):
        _ranges(kept.endpoint).get_range("topic/0/x.log", 0, 9)
    assert kept.connections == 1  # not retried here: the fetcher retries with its backoff
