"""The native lane's cycle (``native/src/fetch_lane.rs``) on socket pairs, the test playing the client and the
broker: at every Fetch version the proxy reads, the lane writes the answer it was given, asks the broker for exactly
the request ``fetch_ahead.next_fetch`` predicts (with ``max_wait`` 0, no fetch session, ``max_bytes`` within
``fetch_max_bytes``), serves the broker's answer to the client's next Fetch under its correlation id when it is the
one predicted, and gives anything else back untouched: another request, an answer not to serve, an answer too old,
the client gone, a stop."""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from reader.proxy.fetch_request import fetch_layout
from reader.proxy.protocol import read_request_head
from tests.kafka_wire import read_exactly
from tests.unit.test_proxy_fetch_ahead import VERSIONS, _answer, _batches, _predict, _request

native = pytest.importorskip("tiering_native", reason="the compiled module is not built (bash deploy/setup.sh)")
FetchLane = native.FetchLane  # even where TIERING_NATIVE_DECODER=0 turned the module off for the proxy
FETCH_MAX_BYTES = 1 << 20
MORE = {(0, 0): _batches(1000, [3, 2])}  # high watermark 10**6: more data waiting after it


@dataclass
class Peers:
    client: socket.socket  # the test's end of the client's connection
    broker: socket.socket  # the test's end of the broker connection
    stop_w: int
    lane: Any
    result: Future[tuple[Any, ...]]


def _read(sock: socket.socket) -> bytes:
    """One frame, size prefix first."""
    head = read_exactly(sock, 4)
    return head + read_exactly(sock, struct.unpack(">i", head)[0])


def _sized(frame: bytes | memoryview) -> bytes:
    return struct.pack(">i", len(frame)) + bytes(frame)


def _request_as(frame: bytes, correlation_id: int) -> bytes:
    """A request frame (no size prefix) under another correlation id (after its api key and version)."""
    return frame[:4] + struct.pack(">i", correlation_id) + frame[8:]


def _answer_as(frame: bytes | memoryview, correlation_id: int) -> bytes:
    """An answer frame (no size prefix) under another correlation id (its first field)."""
    return struct.pack(">i", correlation_id) + bytes(frame[4:])


def _as_sent(version: int, predicted: bytes) -> bytes:
    """The prediction as the proxy sends it the broker: no wait, max_bytes within fetch_max_bytes, sessionless."""
    layout = fetch_layout(predicted, read_request_head(predicted).body, version)
    out = bytearray(predicted)
    struct.pack_into(">i", out, layout.max_wait, 0)
    struct.pack_into(">i", out, layout.max_wait + 8, min(struct.unpack_from(">i", out, layout.max_wait + 8)[0],
                                                         FETCH_MAX_BYTES))  # fmt: skip
    if layout.session >= 0:
        struct.pack_into(">ii", out, layout.session, 0, -1)
    return _sized(out)


@contextmanager
def _running(version: int, request: bytes, answer: bytes | memoryview, max_age: float = 30.0) -> Iterator[Peers]:
    client, client_end = socket.socketpair()
    broker, broker_end = socket.socketpair()
    stop_r, stop_w = os.pipe()
    for s in (client_end, broker_end):
        s.setblocking(False)  # as asyncio leaves them
    lane = FetchLane(client_end.fileno(), broker_end.fileno(), stop_r, version, 64 * 1024, 1 << 30, FETCH_MAX_BYTES,
                     max_age, 5.0, 5.0, 30.0)  # fmt: skip
    assert lane.start(request, _sized(answer)) is not None
    with ThreadPoolExecutor(1) as pool:
        peers = Peers(client, broker, stop_w, lane, pool.submit(lane.run))
        try:
            yield peers
        finally:
            os.write(stop_w, b"x")
            peers.result.exception(10)
            for fd in (stop_r, stop_w):
                os.close(fd)
            for s in (client, client_end, broker, broker_end):
                s.close()


@pytest.mark.parametrize("version", VERSIONS)
def test_the_lane_asks_what_python_predicts_and_serves_it_to_the_request_predicted(version: int) -> None:
    request, _ = _request(version)
    answer = _answer(version, MORE)
    with _running(version, request, answer) as peers:
        assert _read(peers.client) == _sized(answer)  # the answer given, as given
        predicted = _predict(version, request, answer)
        assert predicted is not None
        assert _read(peers.broker) == _as_sent(version, predicted)
        ahead = _answer(version, {(0, 0): _batches(1005, [4]), (1, 1): _batches(2000, [1])})
        peers.broker.sendall(_sized(ahead))
        peers.client.sendall(_sized(_request_as(predicted, 99)))
        assert _read(peers.client) == _sized(_answer_as(ahead, 99))
        then = _predict(version, _request_as(predicted, 99), ahead)
        assert then is not None
        assert _read(peers.broker) == _as_sent(version, then)
        peers.broker.sendall(_sized(_answer_as(_answer(version, {(0, 0): _batches(1009, [1])}), 99)))  # to `then`
        other = struct.pack(">hhih", 3, 12, 100, -1) + b"\x00"  # a Metadata request, say
        peers.client.sendall(_sized(other))
        outcome, detail, pending, served, answers, offsets, passed = peers.result.result(10)
    assert (outcome, detail, pending, served) == ("request", "missed", other, 1)
    assert [size for size, _ in answers] == [len(answer) + 4, len(ahead) + 4]
    assert passed == 8 and len(offsets) == 4  # two answers of four partitions, the offsets of each partition kept


@pytest.mark.parametrize("version", [12, 13, 17])
def test_an_answer_not_to_serve_gives_the_clients_request_back(version: int) -> None:
    request, _ = _request(version)
    answer = _answer(version, MORE)
    with _running(version, request, answer) as peers:
        _read(peers.client)
        predicted = _read(peers.broker)[4:]
        peers.broker.sendall(_sized(_answer(version, MORE, error=ErrorCode.not_leader_or_follower)))
        mine = _request_as(_predict(version, request, answer) or b"", 77)
        peers.client.sendall(_sized(mine))
        outcome, detail, pending, served, *_ = peers.result.result(10)
    assert predicted and (outcome, detail, pending, served) == ("request", "unusable", mine, 0)


def test_an_answer_asked_ahead_and_not_claimed_within_the_max_age_is_dropped_and_nothing_read() -> None:
    version = 13
    request, _ = _request(version)
    with _running(version, request, _answer(version, MORE), max_age=0.3) as peers:
        _read(peers.client)
        _read(peers.broker)
        peers.broker.sendall(_sized(_answer(version, MORE)))
        began = time.monotonic()
        outcome, detail, pending, *_ = peers.result.result(10)
        waited = time.monotonic() - began
    assert (outcome, detail, pending) == ("done", "stale", None)
    assert waited < 5, waited


def test_no_more_data_waiting_asks_nothing_ahead() -> None:
    version = 13
    request, _ = _request(version)
    answer = _answer(version, MORE, high=1005, stable=1005)  # the answer reached the end: the client would wait
    with _running(version, request, answer) as peers:
        assert _read(peers.client) == _sized(answer)
        outcome, detail, *_ = peers.result.result(10)
        peers.broker.setblocking(False)
        with pytest.raises(BlockingIOError):
            peers.broker.recv(1)  # nothing was asked
    assert (outcome, detail) == ("done", "no more data waiting")


def test_a_client_that_closes_a_broker_that_closes_and_a_stop_end_the_run() -> None:
    version = 13
    request, _ = _request(version)
    with _running(version, request, _answer(version, MORE)) as peers:
        _read(peers.client)
        _read(peers.broker)
        peers.broker.sendall(_sized(_answer(version, MORE)))
        peers.client.shutdown(socket.SHUT_WR)
        assert peers.result.result(10)[0] == "closed"
    with _running(version, request, _answer(version, MORE)) as peers:
        _read(peers.client)
        _read(peers.broker)
        threading.Timer(0.2, os.write, (peers.stop_w, b"x")).start()
        assert peers.result.result(10)[0] == "stopped"  # waiting for the broker's answer
    with _running(version, request, _answer(version, MORE)) as peers:
        _read(peers.client)
        _read(peers.broker)
        peers.broker.shutdown(socket.SHUT_WR)
        assert peers.result.result(10)[:2] == ("failed", "the broker closed the connection")


def test_the_lane_refuses_what_it_cannot_serve_as_it_is() -> None:
    version = 13
    request, _ = _request(version)
    lane = FetchLane(0, 0, 0, version, 64 * 1024, 1 << 30, FETCH_MAX_BYTES, 0.1, 5.0, 5.0, 1.0)
    assert lane.start(request, _sized(_answer(version, MORE))) == FETCH_MAX_BYTES  # 2 x 2 partitions of 1 MiB, clamped
    assert lane.start(request, _sized(_answer(version, MORE, throttle_ms=100))) is None
    assert lane.start(request, _sized(_answer(version, {}))) is None  # no records: nothing to read on from
    assert lane.start(request[:-3], _sized(_answer(version, MORE))) is None  # a request that does not walk
    small = FetchLane(0, 0, 0, version, len(request) - 1, 1 << 30, FETCH_MAX_BYTES, 0.1, 5.0, 5.0, 1.0)
    assert small.start(request, _sized(_answer(version, MORE))) is None  # larger than the lane reads
