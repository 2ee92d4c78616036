"""Pass-through answers through kernel pipes (``reader/proxy/splice.py``) over real TCP sockets on loopback: the
broker side sends a Fetch answer in pieces, the relay scans it as ``scan_fetch`` does and moves it to the client
side byte for byte; where the pipes run out, the scan fails or the answer needs a change, it comes back whole in
a buffer, and the next frame in the broker's socket is never touched."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from kio.schema.errors import ErrorCode

from reader.proxy.fetch_scan import scan_fetch
from reader.proxy.protocol import response_body_start
from reader.proxy.splice import PipePool, Relay, Spliced, pipe_max_size
from tests.fetch_answers import VERSIONS, fetch_answer

pytestmark = pytest.mark.skipif(not hasattr(os, "splice"), reason="splice(2) is Linux only")


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


def run_relay(pool: PipePool, answer: bytes, version: int, after: bytes = b"", send: bool = True
              ) -> tuple[Spliced | bytearray, bytes, bytes]:  # fmt: skip
    """Send ``sized(answer) + after`` from a 'broker' in pieces; the relay reads the size prefix as FrameProtocol
    does and receives the rest; an answer it spliced is sent to a 'client' (``send``) or read out of the pipes.
    Returns what the relay received, what the client got (or what was read out), and what is left in the
    broker's socket after the answer."""
    with tcp_pair() as (broker, proxy_up), tcp_pair() as (proxy_down, client):
        proxy_up.setblocking(False)  # the proxy's sockets, as asyncio has them
        proxy_down.setblocking(False)
        client.settimeout(10)
        feeder = send_in_pieces(broker, sized(answer) + after)

        async def main() -> tuple[Spliced | bytearray, bytes]:
            loop = asyncio.get_running_loop()
            head = await loop.sock_recv(proxy_up, 4)
            while len(head) < 4:
                head += await loop.sock_recv(proxy_up, 4 - len(head))
            (size,) = struct.unpack(">i", head)
            relay = Relay(pool, proxy_up.fileno(), proxy_down.fileno())
            try:
                got = await relay.receive(head, size, version)
                out = b""
                if isinstance(got, Spliced) and send:
                    reading = loop.run_in_executor(None, receive_all, client, got.size)
                    await relay.send(got, 10)
                    out = await reading
                elif isinstance(got, Spliced):
                    out = bytes(relay.take(got))
                return got, out
            finally:
                relay.close()

        got, out = asyncio.run(main())
        feeder.join()
        proxy_up.setblocking(True)
        proxy_up.settimeout(5)
        rest = receive_all(proxy_up, len(after)) if after else b""
    return got, out, rest


@pytest.mark.parametrize("version", VERSIONS)
def test_an_answer_goes_through_the_pipes_byte_for_byte_with_the_scan_of_a_whole_answer(version: int) -> None:
    answer, _ = fetch_answer(version, record_copies=512)  # 128 KiB of records in the first partition
    pool = PipePool(4, pipe_max_size())
    got, out, _ = run_relay(pool, bytes(answer), version)
    assert isinstance(got, Spliced)
    assert got.scan.partitions == scan_fetch(answer, version, response_body_start(answer, 1, version)).partitions
    assert got.scan.correlation_id == 42 and got.scan.plain
    assert out == sized(answer)
    assert len(pool.idle) == pool.made  # every pipe given back, empty


@pytest.mark.parametrize("version", (4, 12, 13, 18))
def test_an_answer_the_pipes_cannot_hold_comes_back_whole_and_the_next_frame_stays(version: int) -> None:
    answer, _ = fetch_answer(version, record_copies=1024)  # 256 KiB of records: more than two 4 KiB pipes
    nxt = sized(b"the next frame")
    got, _, rest = run_relay(PipePool(2, 4096), bytes(answer), version, after=nxt)
    assert isinstance(got, bytearray) and bytes(got) == sized(answer)
    assert rest == nxt


@pytest.mark.parametrize("version", (4, 12, 16))
def test_an_answer_with_an_error_is_scanned_as_such_and_read_out_whole(version: int) -> None:
    answer, _ = fetch_answer(version, error=ErrorCode.offset_out_of_range, record_copies=256)
    got, out, _ = run_relay(PipePool(4, pipe_max_size()), bytes(answer), version, send=False)
    assert isinstance(got, Spliced) and not got.scan.plain
    assert [p.error_code for p in got.scan.partitions] == [0, 0, int(ErrorCode.offset_out_of_range)]
    assert out == sized(answer)


def test_an_answer_whose_records_run_past_its_end_is_read_whole_and_the_next_frame_stays() -> None:
    version = 12
    answer, _ = fetch_answer(version, record_copies=4)
    broken = bytearray(answer)
    at = bytes(broken).index(bytes(range(256)))  # the first records: their compact length is the byte before
    assert broken[at - 2 : at] == bytes([0x81, 0x08])  # 1024 + 1 as an unsigned varint
    broken[at - 2 : at] = bytes([0x81, 0x48])  # 9216 + 1: past the answer's end
    nxt = sized(b"x" * 20_000)
    got, _, rest = run_relay(PipePool(4, pipe_max_size()), bytes(broken), version, after=nxt)
    assert isinstance(got, bytearray) and bytes(got) == sized(broken)
    assert rest == nxt
