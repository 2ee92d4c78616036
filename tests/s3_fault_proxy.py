"""An HTTP proxy on 127.0.0.1 in front of the stack's S3 server that fails chosen requests: S3 error answers
(503 SlowDown, 500 InternalError) and connections reset in the middle of a body.

Each request is classified by its S3 operation (``PutObject``, ``UploadPart``, ``CompleteMultipartUpload``,
``GetObject``, ...: method, query and path-style path). ``plan(operation, *faults)`` queues faults that the
next requests of that operation get, one each, in order. ``throttle(operation, *faults)`` gives every
distinct request of the operation (same path, part number and range) those faults on its first attempts,
one each, in order: an S3 that throttles (``throttle("GetObject", SLOW_DOWN, SLOW_DOWN)``), so that the
retries of every request run into it. Everything else is
forwarded to the server and its answer returned as it came. ``injected`` counts what was injected, so a
test can check that its faults happened; ``presigned`` counts requests by operation that came with a presigned
URL's query signature (``X-Amz-Signature``) rather than boto3's Authorization header.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import struct
import threading
from collections import Counter, defaultdict, deque
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "expect", "proxy-connection", "te", "upgrade"}


@dataclass(frozen=True)
class Fault:
    """``status`` > 0: answer that S3 error (after the server handled the request, if ``forwarded``);
    0: reset the connection half way through the body (the request's if it has one, else the answer's)."""

    name: str
    status: int = 0
    code: str = ""
    forwarded: bool = False


SLOW_DOWN = Fault("503 SlowDown", 503, "SlowDown")
INTERNAL_ERROR = Fault("500 InternalError", 500, "InternalError")
LOST_ANSWER = Fault("500 after the server did it", 500, "InternalError", forwarded=True)
RESET = Fault("reset mid-body")


def operation(method: str, path: str, query: dict[str, list[str]]) -> str:
    """The S3 operation of a path-style request (``/bucket`` or ``/bucket/key``)."""
    on_object = "/" in path.strip("/")
    if method == "PUT":
        return "UploadPart" if "partNumber" in query else "PutObject" if on_object else "CreateBucket"
    if method == "POST":
        if "uploadId" in query:
            return "CompleteMultipartUpload"
        return "CreateMultipartUpload" if "uploads" in query else "DeleteObjects"
    if method == "DELETE":
        return "AbortMultipartUpload" if "uploadId" in query else "DeleteObject"
    if method == "HEAD":
        return "HeadObject" if on_object else "HeadBucket"
    if on_object:
        return "ListParts" if "uploadId" in query else "GetObject"
    return "ListMultipartUploads" if "uploads" in query else "ListObjects"


class S3FaultProxy:
    """Started on construction; ``close()`` (or the ``with`` block's end) stops it and drops its connections."""

    def __init__(self, endpoint_url: str) -> None:
        target = urlsplit(endpoint_url)
        self.target = (target.hostname or "127.0.0.1", target.port or 80)
        self.lock = threading.Lock()
        self.planned: dict[str, deque[Fault]] = defaultdict(deque)
        self.throttled: dict[str, tuple[Fault, ...]] = {}
        self.seen: Counter[tuple[str, ...]] = Counter()
        self.requests: Counter[str] = Counter()
        self.presigned: Counter[str] = Counter()
        self.injected: Counter[tuple[str, str]] = Counter()
        self.sockets: set[socket.socket] = set()
        handler = type("Handler", (_Handler,), {"proxy": self})
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.endpoint_url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, name="s3-fault-proxy", daemon=True).start()

    def plan(self, op: str, *faults: Fault) -> None:
        with self.lock:
            self.planned[op].extend(faults)

    def throttle(self, op: str, *faults: Fault) -> None:
        with self.lock:
            self.throttled[op] = faults

    def pending(self) -> int:
        """Planned faults not injected yet."""
        with self.lock:
            return sum(len(q) for q in self.planned.values())

    def fault_for(self, op: str, identity: tuple[str, ...], presigned: bool) -> Fault | None:
        with self.lock:
            self.requests[op] += 1
            self.presigned[op] += presigned
            fault = None
            if self.planned[op]:
                fault = self.planned[op].popleft()
            elif op in self.throttled:
                attempt = self.seen[identity]
                self.seen[identity] += 1
                fault = self.throttled[op][attempt] if attempt < len(self.throttled[op]) else None
            if fault is not None:
                self.injected[(op, fault.name)] += 1
            return fault

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        with self.lock:
            for s in self.sockets:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def __enter__(self) -> S3FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Handler(BaseHTTPRequestHandler):
    """One client connection: each request forwarded on one keep-alive connection to the server, or failed."""

    protocol_version = "HTTP/1.1"
    proxy: S3FaultProxy
    upstream: http.client.HTTPConnection | None = None

    def setup(self) -> None:
        super().setup()
        with self.proxy.lock:
            self.proxy.sockets.add(self.connection)

    def finish(self) -> None:
        with contextlib.suppress(OSError):
            super().finish()
        with self.proxy.lock:
            self.proxy.sockets.discard(self.connection)
        if self.upstream is not None:
            self.upstream.close()

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: the tests check what was injected."""

    def do_any(self) -> None:
        url = urlsplit(self.path)
        query = parse_qs(url.query, keep_blank_values=True)
        op = operation(self.command, url.path, query)
        identity = (op, url.path, *query.get("partNumber", []), self.headers.get("Range", ""))
        fault = self.proxy.fault_for(op, identity, presigned="X-Amz-Signature" in query)
        length = int(self.headers.get("Content-Length") or 0)
        if fault is RESET and length:
            self.rfile.read(length // 2)
            return self._reset()
        body = self._read_body(length)
        if fault is not None and fault.status and not fault.forwarded:
            return self._error(fault, url.path)
        status, reason, headers, payload = self._forward(body)
        if fault is not None and fault.forwarded:
            return self._error(fault, url.path)
        self.send_response_only(status, reason)
        for name, value in headers:
            if name.lower() not in _HOP_BY_HOP and (name.lower() != "content-length" or self.command == "HEAD"):
                self.send_header(name, value)
        if self.command != "HEAD":
            self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if fault is RESET:
            self.wfile.write(payload[: len(payload) // 2])
            return self._reset()
        self.wfile.write(payload)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = do_any

    def _read_body(self, length: int) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() != "chunked":
            return self.rfile.read(length)
        chunks = []
        while size := int(self.rfile.readline().split(b";")[0], 16):
            chunks.append(self.rfile.read(size))
            self.rfile.readline()
        while self.rfile.readline() not in (b"\r\n", b"\n", b""):  # trailers
            pass
        return b"".join(chunks)

    def _forward(self, body: bytes) -> tuple[int, str, list[tuple[str, str]], bytes]:
        for attempt in (0, 1):  # the server may have closed the idle keep-alive connection
            if self.upstream is None:
                self.upstream = http.client.HTTPConnection(*self.proxy.target, timeout=60)
            try:
                self.upstream.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
                for name, value in self.headers.items():
                    if name.lower() not in _HOP_BY_HOP and name.lower() != "content-length":
                        self.upstream.putheader(name, value)
                if body or self.command in ("PUT", "POST"):
                    self.upstream.putheader("Content-Length", str(len(body)))
                self.upstream.endheaders(body)
                response = self.upstream.getresponse()
                payload = response.read()
                return response.status, response.reason, response.getheaders(), payload
            except (OSError, http.client.HTTPException):
                self.upstream.close()
                self.upstream = None
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def _error(self, fault: Fault, resource: str) -> None:
        body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{fault.code}</Code>'
                f"<Message>injected by the test's fault proxy: {fault.name}</Message>"
                f"<Resource>{resource}</Resource><RequestId>fault-proxy</RequestId></Error>").encode()  # fmt: skip
        self.send_response_only(fault.status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _reset(self) -> None:
        """Close with a TCP RST (SO_LINGER 0): the peer sees its connection reset, not an orderly end."""
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.connection.close()
        self.close_connection = True
