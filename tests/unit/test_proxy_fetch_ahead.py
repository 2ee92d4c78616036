"""Fetch ahead: the Fetch a client sends next is predicted from its request and the broker's answer, byte for byte
what kio encodes for the request with each partition past its last whole batch, at every version the proxy
handles; no prediction where the broker would have nothing to give at once; a held answer is given only to the
request predicted, only while fresh, and its budget is given back whatever becomes of it."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import struct
import uuid

import pytest
from kio.schema.errors import ErrorCode
from kio.static.primitive import i32, i64
from prometheus_client import CollectorRegistry, Counter

from reader.proxy.fetch_ahead import (
    FetchAhead,
    Held,
    NextFetch,
    client_layout,
    given_by_body,
    given_by_scan,
    last_batch_end,
    next_fetch,
    request_key,
    served,
)
from reader.proxy.fetch_scan import scan_fetch
from reader.proxy.protocol import (
    build,
    nested,
    new_request,
    parse,
    read_request_head,
    request_frame,
    request_type,
    response_body_start,
    response_frame,
    response_type,
)
from tests.kafka_encoder import encode_batch

VERSIONS = range(4, 19)
TOPICS = (("orders", uuid.UUID(int=7)), ("ünïcode", uuid.UUID(int=11)))


def _batches(base: int, counts: list[int], epoch: int = 5) -> bytes:
    out, offset = b"", base
    for count in counts:
        out += encode_batch(offset, [(None, b"v" * 100, [])] * count, leader_epoch=epoch)
        offset += count
    return out


def _request(version: int, *, isolation: int = 0, last_fetched_epoch: int = 3) -> tuple[bytes, object]:
    request = request_type(1, version)
    topic_type = nested(request, "topics")
    part_type = nested(topic_type, "partitions")
    topics = tuple(
        build(topic_type, topic=name, topic_id=topic_id, partitions=tuple(
            build(part_type, partition=i32(p), current_leader_epoch=i32(5), fetch_offset=i64(1000 * (p + 1)),
                  last_fetched_epoch=i32(last_fetched_epoch), log_start_offset=i64(-1),
                  partition_max_bytes=i32(1 << 20), replica_directory_id=uuid.UUID(int=0))
            for p in range(2)))
        for name, topic_id in TOPICS
    )  # fmt: skip
    body = build(request, replica_id=i32(-1), max_wait=datetime.timedelta(milliseconds=500), min_bytes=i32(1),
                 max_bytes=i32(50 << 20), isolation_level=isolation, session_id=i32(0), session_epoch=i32(-1),
                 topics=topics, forgotten_topics_data=(), rack_id="", cluster_id=None)  # fmt: skip
    return new_request(1, version, 12, "client-1", body), body


def _answer(version: int, records: dict[tuple[int, int], bytes], *, high: int = 10**6, stable: int = 10**6,
            error: ErrorCode = ErrorCode.none, throttle_ms: int = 0) -> memoryview:  # fmt: skip
    """An answer to ``_request``: ``records`` by (topic, partition), the rest without records."""
    response = response_type(1, version)
    topic_type = nested(response, "responses")
    data_type = nested(topic_type, "partitions")
    topics = tuple(
        build(topic_type, topic=name, topic_id=topic_id, partitions=tuple(
            build(data_type, partition_index=i32(p), error_code=error if (t, p) == (1, 1) else ErrorCode.none,
                  high_watermark=i64(high), last_stable_offset=i64(stable), log_start_offset=i64(0),
                  aborted_transactions=None, preferred_read_replica=i32(-1), records=records.get((t, p)))
            for p in range(2)))
        for t, (name, topic_id) in enumerate(TOPICS)
    )  # fmt: skip
    body = build(response, throttle_time=datetime.timedelta(milliseconds=throttle_ms), error_code=ErrorCode.none,
                 session_id=i32(0), responses=topics)  # fmt: skip
    return response_frame(12, 1, version, body)[4:]


def _next(frame: bytes, version: int) -> NextFetch:
    """A client's Fetch as the Fetch handler keeps it to ask its next one ahead."""
    start = read_request_head(frame).body
    layout = client_layout(frame, start, version)
    assert layout is not None
    return NextFetch(frame, start, version, layout)


def _predict(version: int, frame: bytes, answer: memoryview) -> bytes | None:
    request = _next(frame, version)
    start = response_body_start(answer, 1, version)
    records_at: list[int] = []
    by_scan = given_by_scan(answer, start, scan_fetch(answer, version, start, records_at), records_at)
    by_body = given_by_body(parse(response_type(1, version), answer, start), version)
    assert by_scan == by_body  # a broker's answer and one the proxy parsed (remote partitions merged) read alike
    return None if by_scan is None else next_fetch(request, by_scan)


def _advanced(version: int, body, ends: dict[tuple[int, int], tuple[int, int]]) -> object:  # type: ignore[no-untyped-def]
    topics = []
    for t, topic in enumerate(body.topics):
        parts = []
        for p in topic.partitions:
            if (t, int(p.partition)) in ends:
                offset, epoch = ends[(t, int(p.partition))]
                p = dataclasses.replace(p, fetch_offset=i64(offset))
                if version >= 12:
                    p = dataclasses.replace(p, last_fetched_epoch=i32(epoch))
            parts.append(p)
        topics.append(dataclasses.replace(topic, partitions=tuple(parts)))
    return dataclasses.replace(body, topics=tuple(topics))


def test_the_last_whole_batch_ends_the_records() -> None:
    records = _batches(1000, [3, 1, 7], epoch=9)
    view = memoryview(records)
    assert last_batch_end(view, 0, len(records)) == (1011, 9)
    partial = records + _batches(1011, [4])[:-10]  # the broker may end with a batch cut short: clients skip it
    assert last_batch_end(memoryview(partial), 0, len(partial)) == (1011, 9)
    assert last_batch_end(memoryview(partial), 0, 30) is None  # not even a header
    shifted = b"x" * 5 + records  # records at a position inside a larger answer
    assert last_batch_end(memoryview(shifted), 5, len(records)) == (1011, 9)
    old = bytearray(records)
    old[16] = 1  # magic 1: a message set the prediction does not read
    assert last_batch_end(memoryview(bytes(old)), 0, len(old)) is None


@pytest.mark.parametrize("version", VERSIONS)
def test_the_next_fetch_is_the_request_past_the_last_batch_of_each_partition(version: int) -> None:
    frame, body = _request(version)
    answer = _answer(version, {(0, 0): _batches(1000, [10, 20]), (1, 1): _batches(2000, [5], epoch=6)})
    predicted = _predict(version, frame, answer)
    expected = _advanced(version, body, {(0, 0): (1030, 5), (1, 1): (2005, 6)})
    assert predicted == request_frame(read_request_head(frame), frame, expected)
    assert _next(predicted, version).layout == _next(frame, version).layout  # what ask() and its key rely on


@pytest.mark.parametrize("version", (12, 18))
def test_a_client_that_sends_no_last_fetched_epoch_keeps_sending_none(version: int) -> None:
    frame, body = _request(version, last_fetched_epoch=-1)
    predicted = _predict(version, frame, _answer(version, {(0, 1): _batches(2000, [4])}))
    assert predicted == request_frame(read_request_head(frame), frame, _advanced(version, body, {(0, 1): (2004, -1)}))


@pytest.mark.parametrize("version", (4, 12, 13, 18))
def test_nothing_is_asked_ahead_where_the_broker_has_nothing_more_to_give_at_once(version: int) -> None:
    frame, _ = _request(version)
    records = {(0, 0): _batches(1000, [10])}
    assert _predict(version, frame, _answer(version, records, high=1011)) is not None
    assert _predict(version, frame, _answer(version, records, high=1010)) is None  # at the high watermark
    assert _predict(version, frame, _answer(version, {}, high=5000)) is None  # no records at all
    assert _predict(version, frame, _answer(version, records, error=ErrorCode.not_leader_or_follower)) is None
    assert _predict(version, frame, _answer(version, records, throttle_ms=100)) is None
    committed, _ = _request(version, isolation=1)  # read_committed reads up to the last stable offset
    assert _predict(version, committed, _answer(version, records, high=5000, stable=1010)) is None
    assert _predict(version, committed, _answer(version, records, high=5000, stable=1011)) is not None


@pytest.mark.parametrize("version", (4, 12, 13, 18))
def test_the_predicted_request_matches_in_any_partition_order_and_nothing_else(version: int) -> None:
    """librdkafka starts each Fetch one partition further round its list: the same request in another order
    matches; another offset, size or isolation level does not."""
    frame, body = _request(version)
    key = request_key(frame, _next(frame, version).layout)

    def encoded(request: object) -> bytes:
        return request_frame(read_request_head(frame), frame, request)

    def key_of(request: object) -> bytes:
        other = encoded(request)
        return request_key(other, _next(other, version).layout)

    topics = body.topics
    rotated = [dataclasses.replace(t, partitions=t.partitions[1:] + t.partitions[:1]) for t in topics]
    assert key_of(dataclasses.replace(body, topics=tuple(reversed(rotated)))) == key
    moved = dataclasses.replace(topics[0].partitions[0], fetch_offset=i64(1))
    changed = (dataclasses.replace(topics[0], partitions=(moved, *topics[0].partitions[1:])), *topics[1:])
    assert key_of(dataclasses.replace(body, topics=changed)) != key
    assert key_of(dataclasses.replace(body, max_bytes=i32(1 << 20))) != key
    assert key_of(dataclasses.replace(body, isolation_level=1)) != key


def _received(frame: bytes) -> Held:
    """A frame held as the broker connection gives it: its size prefix first, in one buffer."""
    return Held([memoryview(bytearray(struct.pack(">i", len(frame)) + frame))], [])


def _counts(counter: Counter) -> dict[str, float]:
    return {s.labels["outcome"]: s.value for m in counter.collect() for s in m.samples if s.name.endswith("_total")}


def test_a_held_answer_goes_only_to_the_request_predicted_while_fresh_and_is_always_given_back() -> None:
    async def run() -> None:
        outcomes = Counter("fetch_ahead", "", ("outcome",), registry=CollectorRegistry())
        ahead = FetchAhead(0.05, outcomes)
        frame, _ = _request(13)
        request = _next(frame, 13)
        other_id = frame[:4] + struct.pack(">i", 99) + frame[8:]  # the same request under another correlation id
        layout = request.layout  # another correlation id: the same positions
        released: list[int] = []

        def hold(answer: Held | None) -> None:
            asked = ahead.ask(frame, request, ahead.routed)
            assert asked is not None
            held, send = asked
            assert send != frame and send[8:] != frame[8:]  # asked with max_wait 0
            ahead.held = held
            assert ahead.ask(frame, request, ahead.routed) is None  # one at a time
            held.arrived(answer, lambda: released.append(1))

        hold(_received(b"\0\0\0\x0c" + b"answer"))
        got = await ahead.claim(other_id, layout)
        assert got is not None and released == []
        held = got.answer.result()
        assert held is not None
        assert b"".join(served(held, 99)) == struct.pack(">i", 10) + struct.pack(">i", 99) + b"answer"
        pieces = Held([struct.pack(">ii", 10, 12) + b"an", memoryview(b"swer")], [])  # an answer the proxy encoded
        assert b"".join(served(pieces, 99)) == struct.pack(">ii", 10, 99) + b"answer"
        got.free()
        assert released == [1]

        hold(_received(b"\0\0\0\x0c"))
        changed = frame[:-1] + b"\1"
        assert await ahead.claim(changed, _next(changed, 13).layout) is None  # another request: dropped
        assert released == [1, 1]
        hold(_received(b"\0\0\0\x0c"))
        assert await ahead.claim(frame, None) is None  # a request that does not read: dropped, parsed in full next
        assert released == [1, 1, 1]
        hold(_received(b"\0\0\0\x0c"))
        await asyncio.sleep(0.06)
        assert await ahead.claim(other_id, layout) is None  # too old
        assert released == [1, 1, 1, 1]
        hold(None)  # an answer not to serve: given back as it arrives
        assert released == [1, 1, 1, 1, 1]
        assert await ahead.claim(other_id, layout) is None
        assert ahead.ask(frame, request, ahead.routed - 1) is None  # predicted before the client's last Fetch
        assert _counts(outcomes) == {"served": 1, "missed": 2, "stale": 1, "unusable": 1}

    asyncio.run(run())


def test_nothing_is_asked_ahead_for_a_client_that_asks_late_after_its_answers() -> None:
    """A client whose Fetch comes more than half the max age after its answer (it processes slowly, or its queue
    is full) would find what is held for it too old: nothing is asked ahead after its next answer."""

    async def run() -> None:
        ahead = FetchAhead(0.04, Counter("fetch_ahead", "", ("outcome",), registry=CollectorRegistry()))
        frame, _ = _request(13)
        layout = _next(frame, 13).layout
        assert ahead.wanted()  # a first answer: nothing known of the client yet
        await ahead.claim(frame, layout)  # at once
        assert ahead.wanted()
        await asyncio.sleep(0.03)
        await ahead.claim(frame, layout)  # 30 ms after its answer: more than half of 40
        assert not ahead.wanted()
        await ahead.claim(frame, layout)
        assert ahead.wanted()

    asyncio.run(run())
