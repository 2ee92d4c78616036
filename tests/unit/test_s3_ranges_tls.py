"""Ranged GETs (``PresignedRanges``) over https: the server's certificate verified against the CA bundle
boto3 is given (AWS_CA_BUNDLE), an untrusted one refused with the store's error, and a plain-http endpoint
never loading a CA bundle (about 50 ms of every reader's start-up). The server is a local https server
answering Range requests; the S3 semantics are tested against MinIO in tests/integration/test_stores_s3.py."""

from __future__ import annotations

import os
import ssl
import threading
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
