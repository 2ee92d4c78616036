"""Fetch answers without kio: the scan of pass-through answers reads the same partition headers as kio's full
parse, and the hand encoder of the answers the proxy builds writes the same bytes as kio's, at every version the
proxy handles (records and unknown tagged fields skipped by their size, records written by reference)."""

from __future__ import annotations

import datetime
import struct
import uuid

import pytest
from kio.schema.errors import ErrorCode
from kio.static.primitive import i32, i64

from reader.proxy.fetch_answer import fetch_answer_pieces
from reader.proxy.fetch_scan import ScannedPartition, scan_fetch
from reader.proxy.protocol import (
    ProtocolError,
    build,
    nested,
    parse,
    response_body_start,
    response_frame,
    response_pieces,
    response_type,
)

VERSIONS = range(4, 19)
TOPIC_IDS = (uuid.UUID(int=7), uuid.UUID(int=11))


def _answer(version: int, *, error: ErrorCode = ErrorCode.none, endpoints: bool = False, diverging: bool = False,
            record_copies: int = 3) -> tuple[memoryview, list[ScannedPartition]]:  # fmt: skip
    """A Fetch answer frame (without its size) of two topics, the first with two partitions (one with aborted
    transactions and records, one with null records), and the partition headers it must scan to."""
    response = response_type(1, version)
    topic_type = nested(response, "responses")
    data_type = nested(topic_type, "partitions")
    txn_type = nested(data_type, "aborted_transactions")
    expected: list[ScannedPartition] = []
    topics = []
    for t, (name, topic_id) in enumerate(zip(("orders", "ünïcode"), TOPIC_IDS, strict=True)):
        key = topic_id if version >= 13 else name
        parts = []
        for index in range(2 - t):
            records = bytes(range(256)) * record_copies if index == 0 else None
            code = error if t == 1 else ErrorCode.none
            values = dict(partition_index=i32(index), error_code=code, high_watermark=i64(1000 + index),
                          last_stable_offset=i64(900 + index), log_start_offset=i64(100 + index),
                          aborted_transactions=(build(txn_type, producer_id=i64(5), first_offset=i64(950)),)
                          if index == 0 else None, preferred_read_replica=i32(-1), records=records)  # fmt: skip
            if diverging and version >= 12:
                epoch_type = nested(data_type, "diverging_epoch")
                values["diverging_epoch"] = build(epoch_type, epoch=i32(3), end_offset=i64(77))
            parts.append(build(data_type, **values))
            expected.append(ScannedPartition(key, index, int(code), 1000 + index, 900 + index,
                                             100 + index if version >= 5 else -1, len(records or b"")))  # fmt: skip
        topics.append(build(topic_type, topic=name, topic_id=topic_id, partitions=tuple(parts)))
    values = dict(throttle_time=datetime.timedelta(0), error_code=ErrorCode.none, session_id=i32(0),
                  responses=tuple(topics))  # fmt: skip
    if endpoints and version >= 16:
        endpoint_type = nested(response, "node_endpoints")
        values["node_endpoints"] = (build(endpoint_type, node_id=i32(1), host="broker", port=i32(9092), rack=None),)
    frame = response_frame(42, 1, version, build(response, **values))[4:]
    return frame, expected


@pytest.mark.parametrize("version", (4, 12, 13, 18))
def test_response_pieces_join_to_the_frame_with_the_records_by_reference(version: int) -> None:
    frame, _ = _answer(version, record_copies=256)  # 64 KiB of records in each topic's first partition
    body = parse(response_type(1, version), frame, response_body_start(frame, 1, version))
    pieces = response_pieces(42, 1, version, body)
    assert b"".join(pieces) == struct.pack(">i", len(frame)) + bytes(frame)
    records = [p.records for t in body.responses for p in t.partitions if p.records]
    assert len(records) == 2
    shared = [piece.obj for piece in pieces if isinstance(piece, memoryview)]
    assert len(shared) == 2 and all(a is b for a, b in zip(shared, records, strict=True))  # not copied


@pytest.mark.parametrize("version", VERSIONS)
def test_the_scan_reads_what_kio_parses(version: int) -> None:
    frame, expected = _answer(version, diverging=True)
    start = response_body_start(frame, 1, version)
    scan = scan_fetch(frame, version, start)
    parsed = parse(response_type(1, version), frame, start)
    kio_read = [ScannedPartition(t.topic_id if version >= 13 else t.topic, int(p.partition_index),
                                 int(p.error_code), int(p.high_watermark), int(p.last_stable_offset),
                                 int(getattr(p, "log_start_offset", -1)), len(p.records or b""))
                for t in parsed.responses for p in t.partitions]  # fmt: skip
    assert scan.partitions == kio_read == expected
    assert scan.plain


@pytest.mark.parametrize("version", VERSIONS)
def test_an_answer_with_a_partition_error_is_not_plain(version: int) -> None:
    frame, expected = _answer(version, error=ErrorCode.offset_out_of_range)
    scan = scan_fetch(frame, version, response_body_start(frame, 1, version))
    assert scan.partitions == expected
    assert not scan.plain


@pytest.mark.parametrize("version", range(16, 19))
def test_an_answer_with_node_endpoints_is_not_plain(version: int) -> None:
    frame, _ = _answer(version, endpoints=True)
    scan = scan_fetch(frame, version, response_body_start(frame, 1, version))
    assert scan.tagged and not scan.plain


@pytest.mark.parametrize("version", (4, 11, 12, 16))
def test_a_truncated_or_padded_answer_is_a_protocol_error(version: int) -> None:
    frame, _ = _answer(version)
    start = response_body_start(frame, 1, version)
    for broken in (frame[: len(frame) - 10], bytes(frame) + b"\0"):
        with pytest.raises(ProtocolError):
            scan_fetch(broken, version, start)


@pytest.mark.parametrize("version", VERSIONS)
def test_the_hand_encoder_writes_what_kio_writes(version: int) -> None:
    frame, _ = _answer(version, record_copies=256)
    body = parse(response_type(1, version), frame, response_body_start(frame, 1, version))
    pieces = fetch_answer_pieces(42, version, body)
    assert pieces is not None
    assert b"".join(pieces) == b"".join(response_pieces(42, 1, version, body))
    assert sum(isinstance(piece, memoryview) for piece in pieces) == 2  # the records, by reference


@pytest.mark.parametrize("version", range(12, 19))
def test_an_answer_with_tagged_fields_is_left_to_kio(version: int) -> None:
    for shape in ({"diverging": True}, {"endpoints": True}):
        if "endpoints" in shape and version < 16:
            continue
        frame, _ = _answer(version, **shape)  # type: ignore[arg-type]
        body = parse(response_type(1, version), frame, response_body_start(frame, 1, version))
        assert fetch_answer_pieces(42, version, body) is None
