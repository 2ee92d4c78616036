"""Ranged GETs of S3 objects through presigned URLs and plain keep-alive HTTP connections.

A ranged GET through boto3 costs about 3 ms of CPU before a byte moves (request building, SigV4
signing, event hooks, response parsing; measured on this project's machines), and reading the body
through urllib3 as much again per 4 MiB: the reader's downloads were the largest CPU cost of a remote
read. Here each object's URL is presigned once (``presign_seconds``, a SigV4 query signature that does not
cover the Range header) and every GET of a range is one request on a per-thread ``http.client``
connection, its body read straight into the bytes returned. Errors keep the store's contract: a
missing object is ObjectNotFound, a refused or reset connection or a 5xx answer StoreUnavailable, any
other answer RemoteStoreError naming the key and the endpoint.

An S3 server closes a keep-alive connection left idle (MinIO after 30 s, S3 after about 20): a reader idle that
long found every thread's connection closed, took each for an unreachable store and slept the fetcher's backoff
(``read_retry_backoff_seconds``) before its first read, about a second before the first record of a catch-up
through the proxy. As urllib3 does, a kept connection the server has closed is seen before it is used (its
socket reads as ready: the server's FIN, or bytes no request asked for) and opened again, and a request whose
kept connection breaks before any of the answer came (the server closed it as the request went out) is sent
once more on a new one at once: a GET of a range changes nothing, so sending it twice is safe.
"""

from __future__ import annotations

import http.client
import select
import socket
import ssl
import threading
import time
from collections import OrderedDict
from functools import cached_property
from typing import Any
from urllib.parse import urlsplit

from tiering_core.stores.base import ObjectNotFound, RemoteStoreError, StoreUnavailable

_URLS = 4096  # presigned URLs kept (one per object read recently)


def _ready(sock: socket.socket) -> bool:
    """Whether the socket has something to read now (poll, not select: a proxy's descriptors pass 1024)."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


class PresignedRanges:
    """``get_range(key, start, end)`` for ``S3Store.get_range`` (``end`` inclusive), with the store's boto3
    ``client`` (it presigns), ``bucket`` and ``endpoint`` (named in errors). Thread-safe."""

    def __init__(self, client: Any, bucket: str, endpoint: str, presign_seconds: int = 900) -> None:
        self.client, self.bucket, self.endpoint = client, bucket, endpoint
        self.presign_seconds = presign_seconds
        config = client.meta.config
        self.timeout = max(float(config.connect_timeout or 10), float(config.read_timeout or 60))
        self._urls: OrderedDict[str, tuple[float, str, str, str]] = OrderedDict()  # key -> (expiry, scheme, host, path)
        self._lock = threading.Lock()
        self._local = threading.local()

    def get_range(self, key: str, start: int, end: int) -> bytes:
        where = f"get s3://{self.bucket}/{key} bytes {start}-{end}"
        for attempt in (0, 1):
            scheme, host, path = self._url(key, fresh=attempt > 0)
            response, body = self._get(scheme, host, path, f"bytes={start}-{end}", where)
            status = response.status
            if status in (200, 206):
                return body if status == 206 else body[start : end + 1]
            if status == 416:
                return b""  # the range starts past the object's end: nothing there
            if status == 404:
                raise ObjectNotFound(key)
            if status == 403 and b"expired" in body.lower() and attempt == 0:
                continue  # the presigned URL outlived its credentials: sign again
            if status >= 500:
                raise StoreUnavailable(self.endpoint, f"HTTP {status} {body[:200]!r}", where)
            raise RemoteStoreError(f"{where} at {self.endpoint}: HTTP {status}: {body[:300]!r}")
        raise AssertionError("unreachable")

    def _get(self, scheme: str, host: str, path: str, span: str, where: str
             ) -> tuple[http.client.HTTPResponse, bytes]:  # fmt: skip
        """The answer to one GET and its body; on a kept connection that breaks before the answer begins, the
        GET once more on a new connection. StoreUnavailable when the store did not answer."""
        conn, kept = self._connection(scheme, host)
        try:
            try:
                conn.request("GET", path, headers={"Range": span})
                response = conn.getresponse()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, ConnectionAbortedError):
                if not kept:
                    raise
                self._drop(scheme, host)  # closed by the server as the request went out: not the store's fault
                conn, _ = self._connection(scheme, host)
                conn.request("GET", path, headers={"Range": span})
                response = conn.getresponse()
            return response, response.read()
        except (OSError, http.client.HTTPException) as exc:
            self._drop(scheme, host)
            raise StoreUnavailable(self.endpoint, exc, where) from exc

    def _url(self, key: str, fresh: bool) -> tuple[str, str, str]:
        now = time.monotonic()
        with self._lock:
            found = self._urls.get(key)
            if found is not None and not fresh and found[0] > now:
                self._urls.move_to_end(key)
                return found[1:]
        parts = urlsplit(self.sign(key, self.presign_seconds))
        entry = (now + self.presign_seconds / 2, parts.scheme, parts.netloc, f"{parts.path}?{parts.query}")
        with self._lock:
            self._urls[key] = entry
            while len(self._urls) > _URLS:
                self._urls.popitem(last=False)
        return entry[1:]

    def sign(self, key: str, seconds: int) -> str:
        """A GET of ``key`` presigned for ``seconds``; RemoteStoreError naming the key if the credentials cannot
        sign."""
        try:
            url: str = self.client.generate_presigned_url(
                "get_object", Params={"Bucket": self.bucket, "Key": key}, ExpiresIn=seconds
            )
        except Exception as exc:  # credentials that cannot sign: the store's error, naming the key
            raise RemoteStoreError(f"signing a GET of s3://{self.bucket}/{key}: {exc}") from exc
        return url

    @cached_property
    def ssl(self) -> ssl.SSLContext:
        """The TLS context of https endpoints, built on first use: loading the CA bundle costs about 50 ms,
        which a reader of a plain-http endpoint (a local MinIO) should not pay at start-up."""
        verify = self.client._endpoint.http_session._verify  # boto3's own verify setting (path, True or False)
        context = ssl.create_default_context(cafile=verify if isinstance(verify, str) else None)
        if verify is False:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return context

    def _connection(self, scheme: str, host: str) -> tuple[http.client.HTTPConnection, bool]:
        """This thread's connection to ``host`` and whether it was kept from an earlier GET; a kept one whose
        socket reads as ready (the server closed it, or sent what no request asked for) is opened again."""
        conns: dict[tuple[str, str], http.client.HTTPConnection] = self._local.__dict__.setdefault("conns", {})
        conn = conns.get((scheme, host))
        if conn is not None and conn.sock is not None and _ready(conn.sock):
            self._drop(scheme, host)
            conn = None
        if conn is not None:
            return conn, conn.sock is not None
        if scheme == "https":
            conn = http.client.HTTPSConnection(host, timeout=self.timeout, context=self.ssl)
        else:
            conn = http.client.HTTPConnection(host, timeout=self.timeout)
        conns[(scheme, host)] = conn
        return conn, False

    def _drop(self, scheme: str, host: str) -> None:
        conn = self._local.__dict__.get("conns", {}).pop((scheme, host), None)
        if conn is not None:
            conn.close()
