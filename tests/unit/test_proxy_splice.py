"""Pass-through answers through a kernel pipe as they arrive (``reader/proxy/splice.py``) over real TCP sockets on
loopback: the broker side sends a Fetch answer in pieces, the relay scans it as ``scan_fetch`` does and moves it
to the client side byte for byte; an erring partition's header and the node endpoints are rewritten in place at
the same size (kio parses the result); with no pipe free, a top-level error, another request's answer or broken
lengths, nothing goes out and the answer comes back whole, and the next frame in the broker's socket is never
touched."""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from reader.proxy.fetch_scan import ScannedFetch, ScannedPartition, scan_fetch
from reader.proxy.pass_through import rewrite_endpoints
from reader.proxy.protocol import parse, response_body_start, response_type
from reader.proxy.routing import Router
from reader.proxy.splice import Passed, PipePool, Relay, pipe_max_size
from tests.fetch_answers import VERSIONS, fetch_answer


@contextmanager
def tcp_pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    """Two connected TCP sockets on loopback."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        a = socket.create_connection(server.getsockname())
        b, _ = server.accept()
    try:
        yield a, b
    finally:
        a.close()
        b.close()


def sized(frame: bytes | memoryview) -> bytes:
    return struct.pack(">i", len(frame)) + bytes(frame)


def send_in_pieces(sock: socket.socket, data: bytes, piece: int = 7_001) -> threading.Thread:
    """Send ``data`` in pieces with pauses between them, as a broker paced by TCP does."""

    def run() -> None:
        for at in range(0, len(data), piece):
            sock.sendall(data[at : at + piece])
            time.sleep(0.001)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def receive_all(sock: socket.socket, size: int) -> bytes:
    got = bytearray()
    while len(got) < size:
        chunk = sock.recv(size - len(got))
        assert chunk, "the connection closed early"
        got += chunk
    return bytes(got)


class RecordingGate:
    """Leaves every partition as it came (or writes ``fixed`` over an erring one) and the tagged fields too
    (or rewrites them with ``router``); records what it was shown."""

    def __init__(self, fixed: bytes | None = None, router: Router | None = None) -> None:
        self.fixed, self.router = fixed, router
        self.shown: list[ScannedPartition] = []
        self.scans: list[ScannedFetch] = []  # ``passed``

    async def partition(self, partition: ScannedPartition) -> bytes | None:
        self.shown.append(partition)
        return self.fixed

    def tagged(self, section: bytes) -> bytes:
        return section if self.router is None else rewrite_endpoints(section, self.router)

    async def passed(self, scan: ScannedFetch) -> None:
        self.scans.append(scan)


def run_relay(pool: PipePool, answer: bytes, version: int, after: bytes = b"", gate: RecordingGate | None = None,
              correlation_id: int = 42) -> tuple[Passed | bytearray, bytes, bytes]:  # fmt: skip
    """Send ``sized(answer) + after`` from a 'broker' in pieces; the relay reads the size prefix as FrameProtocol
    does and relays the rest to a 'client' that reads all it is sent. Returns what the relay gave, what the
    client got, and what is left in the broker's socket after the answer."""
    with tcp_pair() as (broker, proxy_up), tcp_pair() as (proxy_down, client):
        proxy_up.setblocking(False)  # the proxy's sockets, as asyncio has them
        proxy_down.setblocking(False)
        feeder = send_in_pieces(broker, sized(answer) + after)

        async def main() -> tuple[Passed | bytearray, bytes]:
            loop = asyncio.get_running_loop()
            head = b""
            while len(head) < 4:
                head += await loop.sock_recv(proxy_up, 4 - len(head))
            (size,) = struct.unpack(">i", head)
            reading = loop.run_in_executor(None, receive_until_closed, client)
            relay = Relay(pool, proxy_up.fileno(), proxy_down.fileno())
            try:
                got = await relay.relay(head, size, version, correlation_id, gate or RecordingGate(), 10)
            finally:
                relay.close()
                proxy_down.shutdown(socket.SHUT_WR)
            return got, await reading

        got, out = asyncio.run(main())
        feeder.join()
        proxy_up.setblocking(True)
        proxy_up.settimeout(5)
        rest = receive_all(proxy_up, len(after)) if after else b""
    return got, out, rest


def receive_until_closed(sock: socket.socket) -> bytes:
    sock.settimeout(10)
    got = bytearray()
    while chunk := sock.recv(1 << 20):
        got += chunk
    return bytes(got)


def parsed(frame: bytes, version: int) -> Any:
    body = frame[4:]
    return parse(response_type(1, version), body, response_body_start(body, 1, version))


@pytest.mark.parametrize("version", VERSIONS)
def test_an_answer_goes_through_byte_for_byte_with_the_scan_of_a_whole_answer(version: int) -> None:
    answer, _ = fetch_answer(version, record_copies=4096)  # 1 MiB of records in the first partition
    pool = PipePool(4, 64 * 1024)  # smaller than the answer: it goes through a chunk at a time
    gate = RecordingGate()
    got, out, _ = run_relay(pool, bytes(answer), version, gate=gate)
    assert isinstance(got, Passed) and not got.changed and gate.scans == [got.scan]
    assert got.scan.partitions == scan_fetch(answer, version, response_body_start(answer, 1, version)).partitions
    assert got.scan.correlation_id == 42 and got.scan.plain
    assert out == sized(answer)
    assert pool.made == len(pool.idle) == 1  # one pipe, given back empty


@pytest.mark.parametrize("version", (4, 12, 13, 18))
def test_with_no_pipe_free_the_answer_comes_back_whole_and_the_next_frame_stays(version: int) -> None:
    answer, _ = fetch_answer(version, record_copies=1024)
    pool = PipePool(1, 4096)
    taken = pool.borrow()
    nxt = sized(b"the next frame")
    got, out, rest = run_relay(pool, bytes(answer), version, after=nxt)
    assert isinstance(got, bytearray) and bytes(got) == sized(answer)
    assert out == b"" and rest == nxt
    assert taken is not None


@pytest.mark.parametrize("version", (7, 12, 16))
def test_an_answer_refused_as_a_whole_or_for_another_request_comes_back_whole_with_nothing_sent(version: int) -> None:
    refused, _ = fetch_answer(version, top_error=ErrorCode.fetch_session_id_not_found, record_copies=64)
    got, out, _ = run_relay(PipePool(1, pipe_max_size()), bytes(refused), version)
    assert isinstance(got, bytearray) and bytes(got) == sized(refused) and out == b""
    other, _ = fetch_answer(version, record_copies=64)
    got, out, _ = run_relay(PipePool(1, pipe_max_size()), bytes(other), version, correlation_id=41)
    assert isinstance(got, bytearray) and bytes(got) == sized(other) and out == b""


@pytest.mark.parametrize("version", (4, 5, 12, 13, 18))
def test_an_erring_partition_header_is_rewritten_in_place_before_it_goes_out(version: int) -> None:
    answer, expected = fetch_answer(version, error=ErrorCode.offset_out_of_range, record_copies=256)
    fixed = struct.pack(">hqqq", 0, 5000, 4900, 77) if version >= 5 else struct.pack(">hqq", 0, 5000, 4900)
    gate = RecordingGate(fixed)
    got, out, _ = run_relay(PipePool(1, pipe_max_size()), bytes(answer), version, gate=gate)
    assert isinstance(got, Passed) and got.changed
    assert gate.shown == [p for p in expected if p.error_code]  # only the erring one, before it went out
    assert len(out) == len(answer) + 4
    before, after = parsed(sized(answer), version), parsed(out, version)
    erring = after.responses[1].partitions[0]
    assert (int(erring.error_code), int(erring.high_watermark), int(erring.last_stable_offset)) == (0, 5000, 4900)
    if version >= 5:
        assert int(erring.log_start_offset) == 77
    assert after.responses[0] == before.responses[0]  # everything else as the broker sent it


@pytest.mark.parametrize("version", (16, 17, 18))
@pytest.mark.parametrize(
    ("advertised", "kept"),
    [("proxy", True), ("proxy-host", True), ("127.0.0.1", False), ("a-proxy-name-longer-than-the-brokers", False)],
)
def test_node_endpoints_are_rewritten_to_the_proxys_at_the_brokers_size(version: int, advertised: str,
                                                                        kept: bool) -> None:  # fmt: skip
    """The brokers are broker-one and broker-two: a proxy host as long (no padding) or at least three bytes
    shorter in all (a padding field) keeps the endpoints; two bytes shorter (no field is that small) or longer
    leaves them out."""
    answer, _ = fetch_answer(version, endpoints=True, record_copies=64)
    router = Router(advertised, {1: 19001, 2: 19002}, None, [("127.0.0.1", 9092)])
    got, out, _ = run_relay(PipePool(1, pipe_max_size()), bytes(answer), version, gate=RecordingGate(router=router))
    assert isinstance(got, Passed) and got.changed
    assert len(out) == len(answer) + 4
    endpoints = {int(e.node_id): (e.host, int(e.port), e.rack) for e in parsed(out, version).node_endpoints}
    if kept:
        assert endpoints == {1: (advertised, 19001, None), 2: (advertised, 19002, "r2")}
    else:
        assert endpoints == {}  # left out: the client asks Metadata for the leader
    assert router.broker_address(2) == ("broker-two", 9092)  # learned on the way


def test_an_answer_whose_records_run_past_its_end_comes_back_whole_and_the_next_frame_stays() -> None:
    version = 12
    answer, _ = fetch_answer(version, record_copies=4)
    broken = bytearray(answer)
    at = bytes(broken).index(bytes(range(256)))  # the first records: their compact length is the byte before
    assert broken[at - 2 : at] == bytes([0x81, 0x08])  # 1024 + 1 as an unsigned varint
    broken[at - 2 : at] = bytes([0x81, 0x48])  # 9216 + 1: past the answer's end
    nxt = sized(b"x" * 20_000)
    got, out, rest = run_relay(PipePool(1, pipe_max_size()), bytes(broken), version, after=nxt)
    assert isinstance(got, bytearray) and bytes(got) == sized(broken)
    assert out == b"" and rest == nxt
