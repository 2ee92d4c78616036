"""Fetch answers without kio: the scan of pass-through answers reads the same partition headers as kio's full
parse, and the hand encoder of the answers the proxy builds writes the same bytes as kio's, at every version the
proxy handles (records and unknown tagged fields skipped by their size, records written by reference)."""

from __future__ import annotations

import struct

import pytest
from kio.schema.errors import ErrorCode

from reader.proxy.fetch_answer import fetch_answer_pieces
from reader.proxy.fetch_scan import ScannedPartition, scan_fetch
from reader.proxy.protocol import (
    ProtocolError,
    parse,
    response_body_start,
    response_pieces,
    response_type,
)
from tests.fetch_answers import VERSIONS, fetch_answer


@pytest.mark.parametrize("version", (4, 12, 13, 18))
def test_response_pieces_join_to_the_frame_with_the_records_by_reference(version: int) -> None:
    frame, _ = fetch_answer(version, record_copies=256)  # 64 KiB of records in each topic's first partition
    body = parse(response_type(1, version), frame, response_body_start(frame, 1, version))
    pieces = response_pieces(42, 1, version, body)
    assert b"".join(pieces) == struct.pack(">i", len(frame)) + bytes(frame)
    records = [p.records for t in body.responses for p in t.partitions if p.records]
    assert len(records) == 2
    shared = [piece.obj for piece in pieces if isinstance(piece, memoryview)]
    assert len(shared) == 2 and all(a is b for a, b in zip(shared, records, strict=True))  # not copied


@pytest.mark.parametrize("version", VERSIONS)
def test_the_scan_reads_what_kio_parses(version: int) -> None:
    frame, expected = fetch_answer(version, diverging=True)
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
    frame, expected = fetch_answer(version, error=ErrorCode.offset_out_of_range)
    scan = scan_fetch(frame, version, response_body_start(frame, 1, version))
    assert scan.partitions == expected
    assert not scan.plain


@pytest.mark.parametrize("version", range(16, 19))
def test_an_answer_with_node_endpoints_is_not_plain(version: int) -> None:
    frame, _ = fetch_answer(version, endpoints=True)
    scan = scan_fetch(frame, version, response_body_start(frame, 1, version))
    assert scan.tagged and not scan.plain


@pytest.mark.parametrize("version", (4, 11, 12, 16))
def test_a_truncated_or_padded_answer_is_a_protocol_error(version: int) -> None:
    frame, _ = fetch_answer(version)
    start = response_body_start(frame, 1, version)
    for broken in (frame[: len(frame) - 10], bytes(frame) + b"\0"):
        with pytest.raises(ProtocolError):
            scan_fetch(broken, version, start)


@pytest.mark.parametrize("version", VERSIONS)
def test_the_hand_encoder_writes_what_kio_writes(version: int) -> None:
    frame, _ = fetch_answer(version, record_copies=256)
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
        frame, _ = fetch_answer(version, **shape)  # type: ignore[arg-type]
        body = parse(response_type(1, version), frame, response_body_start(frame, 1, version))
        assert fetch_answer_pieces(42, version, body) is None
