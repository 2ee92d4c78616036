"""The remote lane's cycle (``native/src/remote_lane.rs``) on socket pairs, the test playing the client and the broker:
at every Fetch version the proxy reads, the lane writes the answer it was given, sends the probe before each next
answer (at the high watermark the last probe's answer gave), builds the answer from the batches handed and the
probe's offsets exactly as the Python encoder writes it (``fetch_answer.fetch_answer_pieces``), serves it to the
client's next Fetch when it is the one ``fetch_ahead.next_fetch`` predicts, and gives the client's request back
untouched when the broker refuses a partition or the request is another."""

from __future__ import annotations

import datetime
import os
import socket
import struct
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from kio.schema.errors import ErrorCode
from kio.static.primitive import i32, i64

from reader.proxy.fetch_answer import fetch_answer_pieces
from reader.proxy.fetch_request import fetch_layout
from reader.proxy.protocol import build, nested, read_request_head, response_type
from tests.unit.test_native_lane import _answer_as, _read, _request_as, _sized
from tests.unit.test_proxy_fetch_ahead import TOPICS, VERSIONS, _answer, _batches, _predict, _request

native = pytest.importorskip("tiering_native", reason="the compiled module is not built (bash deploy/setup.sh)")
RemoteLane = native.RemoteLane
LOG_START = 7  # the remote start each answer names as the log start
PROBE_ID = 4242  # the probe's correlation id
PARTS = [(t, p) for t in range(2) for p in range(2)]  # (topic, partition) in answer order, as _answer lists them


def _key(version: int, t: int) -> bytes:
    name, topic_id = TOPICS[t]
    return topic_id.bytes if version >= 13 else name.encode()


def _parts(version: int) -> list[tuple[bytes, int, int]]:
    return [(_key(version, t), p, LOG_START) for t, p in PARTS]


def _expected(version: int, correlation_id: int, records: dict[tuple[int, int], bytes], high: int,
              stable: int) -> bytes:  # fmt: skip
    """The answer the Python path encodes for these batches and offsets (a remote partition as ``FetchPlan``
    builds it), size prefix first."""
    response = response_type(1, version)
    topic_type = nested(response, "responses")
    data_type = nested(topic_type, "partitions")
    topics = tuple(
        build(topic_type, topic=name, topic_id=topic_id, partitions=tuple(
            build(data_type, partition_index=i32(p), error_code=ErrorCode.none, high_watermark=i64(high),
                  last_stable_offset=i64(stable), log_start_offset=i64(LOG_START), aborted_transactions=None,
                  preferred_read_replica=i32(-1), records=records.get((t, p), b""))
            for p in range(2)))
        for t, (name, topic_id) in enumerate(TOPICS)
    )  # fmt: skip
    body = build(response, throttle_time=datetime.timedelta(0), error_code=ErrorCode.none, session_id=i32(0),
                 responses=topics)  # fmt: skip
    pieces = fetch_answer_pieces(correlation_id, version, body)
    assert pieces is not None
    return b"".join(bytes(piece) for piece in pieces)


def _probe(version: int, request: bytes, at: int) -> bytes:
    """The probe the Fetch handler sends for ``request``: every partition at ``at`` with no room, no wait, no session
    (size prefix first)."""
    layout = fetch_layout(request, read_request_head(request).body, version)
    out = bytearray(request)
    struct.pack_into(">i", out, layout.max_wait, 0)
    if layout.session >= 0:
        struct.pack_into(">ii", out, layout.session, 0, -1)
    for partitions in layout.topics:
        for p in partitions:
            struct.pack_into(">q", out, p.offset, at)
            struct.pack_into(">i", out, p.max_bytes, 0)
    return _sized(_request_as(bytes(out), PROBE_ID))


def _offsets_in(version: int, probe: bytes) -> set[int]:
    layout = fetch_layout(probe[4:], read_request_head(probe[4:]).body, version)
    return {struct.unpack_from(">q", probe, 4 + p.offset)[0] for ps in layout.topics for p in ps}


def _records(batches: dict[tuple[int, int], bytes]) -> list[bytes | None]:
    return [batches.get(part) for part in PARTS]


@dataclass
class Peers:
    client: socket.socket
    broker: socket.socket
    lane: Any
    pool: ThreadPoolExecutor

    def run(self) -> Future[tuple[Any, ...]]:
        return self.pool.submit(self.lane.run)


@contextmanager
def _lane(version: int, request: bytes, answer: bytes, first: dict[tuple[int, int], bytes], max_age: float = 30.0
          ) -> Iterator[Peers]:  # fmt: skip
    client, client_end = socket.socketpair()
    broker, broker_end = socket.socketpair()
    stop_r, stop_w = os.pipe()
    for s in (client_end, broker_end):
        s.setblocking(False)
    lane = RemoteLane(client_end.fileno(), broker_end.fileno(), stop_r, version, 64 * 1024, 1 << 30, max_age, 5.0,
                      5.0, 30.0)  # fmt: skip
    assert lane.start(request, [answer], _probe(version, request, 900), _parts(version), _records(first))
    with ThreadPoolExecutor(1) as pool:
        try:
            yield Peers(client, broker, lane, pool)
        finally:
            os.write(stop_w, b"x")
            for fd in (stop_r, stop_w):
                os.close(fd)
            for s in (client, client_end, broker, broker_end):
                s.close()


@pytest.mark.parametrize("version", VERSIONS)
def test_the_native_answer_is_the_one_the_python_encoder_writes(version: int) -> None:
    batches = {(0, 1): _batches(1000, [3, 2]), (1, 0): _batches(50, [1])}
    built = native.remote_answer(version, 99, _parts(version), [(10**6, 10**6 - 3)] * 4, _records(batches))
    assert built == _expected(version, 99, batches, 10**6, 10**6 - 3)


@pytest.mark.parametrize("version", VERSIONS)
def test_the_lane_probes_then_serves_the_batches_handed_to_the_request_predicted(version: int) -> None:
    request, _ = _request(version)
    first = {(0, 0): _batches(1000, [3, 2])}
    answer = _expected(version, 12, first, 10**6, 10**6)
    second = {(0, 0): _batches(1005, [4]), (1, 1): _batches(2000, [1])}
    third = {(0, 0): _batches(1009, [2])}
    with _lane(version, request, answer, first) as peers:
        peers.lane.extend(_records(second))
        peers.lane.extend(_records(third))
        peers.lane.finish()
        running = peers.run()
        probe = _read(peers.broker)
        assert probe == _probe(version, request, 900)
        assert _read(peers.client) == answer  # the answer given, as given
        peers.broker.sendall(_sized(_probe_answer(version, 5000)))
        predicted = _predict(version, request, memoryview(answer)[4:])
        assert predicted is not None
        peers.client.sendall(_sized(_request_as(predicted, 31)))
        assert _read(peers.client) == _expected(version, 31, second, 5000, 4990)
        assert _offsets_in(version, _read(peers.broker)) == {5000}  # the next probe at the high watermark given
        peers.broker.sendall(_sized(_probe_answer(version, 6000)))
        given = memoryview(_expected(version, 31, second, 10**6, 10**6))[4:]
        then = _predict(version, _request_as(predicted, 31), given)
        assert then is not None
        peers.client.sendall(_sized(_request_as(then, 32)))
        assert _read(peers.client) == _expected(version, 32, third, 6000, 5990)
        outcome, detail, pending, served, answers, offsets, partitions = running.result(10)
    assert (outcome, detail, pending, served) == ("done", "the remote answers handed are served", None, 2)
    assert len(answers) == 3 and partitions == 8 and len(offsets) == 4


def _probe_answer(version: int, high: int, error: ErrorCode = ErrorCode.none) -> bytes:
    """The broker's answer to a probe: no records, the high watermark ``high`` (last stable 10 below)."""
    return _answer_as(_answer(version, {}, high=high, stable=high - 10, error=error), PROBE_ID)


@pytest.mark.parametrize("version", [12, 13, 17])
def test_a_probe_the_broker_refuses_gives_the_clients_request_back(version: int) -> None:
    request, _ = _request(version)
    first = {(0, 0): _batches(1000, [3, 2])}
    answer = _expected(version, 12, first, 10**6, 10**6)
    with _lane(version, request, answer, first) as peers:
        peers.lane.extend(_records({(0, 0): _batches(1005, [4])}))
        running = peers.run()
        _read(peers.broker)
        _read(peers.client)
        peers.broker.sendall(_sized(_probe_answer(version, 5000, ErrorCode.topic_authorization_failed)))
        mine = _request_as(_predict(version, request, memoryview(answer)[4:]) or b"", 77)
        peers.client.sendall(_sized(mine))
        outcome, detail, pending, served, *_ = running.result(10)
    assert (outcome, detail, pending, served) == ("request", "refused", mine, 0)


def test_another_request_is_given_back_and_with_nothing_handed_the_run_comes_back_for_more() -> None:
    version = 13
    request, _ = _request(version)
    first = {(0, 0): _batches(1000, [3, 2])}
    answer = _expected(version, 12, first, 10**6, 10**6)
    with _lane(version, request, answer, first) as peers:
        outcome, *_ = peers.run().result(10)  # nothing handed: the answer due is written and it comes back
        assert outcome == "again" and peers.lane.queued() == 0
        assert _read(peers.client) == answer
        peers.lane.extend(_records({(0, 0): _batches(1005, [4])}))
        running = peers.run()
        _read(peers.broker)
        peers.broker.sendall(_sized(_probe_answer(version, 5000)))
        other = _request_as(request, 78)  # the same offsets again: a seek back, not the prediction
        peers.client.sendall(_sized(other))
        outcome, detail, pending, served, *_ = running.result(10)
    assert (outcome, detail, pending, served) == ("request", "missed", other, 0)


def test_the_lane_refuses_a_request_whose_partitions_are_not_those_given() -> None:
    version = 13
    request, _ = _request(version)
    lane = RemoteLane(0, 0, 0, version, 64 * 1024, 1 << 30, 0.1, 5.0, 5.0, 1.0)
    probe = _probe(version, request, 900)
    assert lane.start(request, [b""], probe, _parts(version), _records({}))
    assert not lane.start(request, [b""], probe, _parts(version)[:3], [None] * 3)
    other = [(uuid.UUID(int=99).bytes, p, 0) for _, p, _ in _parts(version)]
    assert not lane.start(request, [b""], probe, other, _records({}))
    assert not lane.start(request[:-3], [b""], probe, _parts(version), _records({}))
    small = RemoteLane(0, 0, 0, version, len(request) - 1, 1 << 30, 0.1, 5.0, 5.0, 1.0)
    assert not small.start(request, [b""], probe, _parts(version), _records({}))


def test_finishing_with_the_queue_dropped_writes_the_answer_due_and_probes_nothing() -> None:
    """What the proxy does when a client gets a fetch quota while its lane runs: the answers handed are not served
    (their bytes would not be counted), the answer due goes out, and the run ends."""
    version = 13
    request, _ = _request(version)
    first = {(0, 0): _batches(1000, [3, 2])}
    answer = _expected(version, 12, first, 10**6, 10**6)
    with _lane(version, request, answer, first) as peers:
        peers.lane.extend(_records({(0, 0): _batches(1005, [4])}))
        peers.lane.finish(drop_queued=True)
        assert peers.lane.queued() == 0
        outcome, detail, pending, served, answers, *_ = peers.run().result(10)
        assert _read(peers.client) == answer
        peers.broker.setblocking(False)
        with pytest.raises(BlockingIOError):
            peers.broker.recv(1)  # no probe was sent
    assert (outcome, detail, pending, served, len(answers)) == ("done", "the remote answers handed are served", None,
                                                                 0, 1)  # fmt: skip
