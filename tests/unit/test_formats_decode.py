"""Decoding record batches: every codec round-trips, every corruption is a FormatError at its position."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from tests.kafka_encoder import encode_batch, sample_records
from tiering_core.errors import FormatError, UnsupportedFormatError
from tiering_core.formats import (
    TruncatedBatchError,
    control_marker,
    iter_batches,
    mapped,
    scan_headers,
    summarize_segment,
)
from tiering_core.formats.records import Record


@pytest.mark.parametrize("codec", [0, 1, 2, 3, 4])
def test_every_codec_round_trips(codec: int) -> None:
    records = sample_records(120, seed=codec)
    data = encode_batch(1000, records, codec=codec) + encode_batch(1120, records[:5], codec=codec)
    batches = list(iter_batches("seg.log", data))
    assert [b.header.base_offset for b in batches] == [1000, 1120]
    assert batches[0].header.compression == ["none", "gzip", "snappy", "lz4", "zstd"][codec]
    got = [(r.key, r.value, list(r.headers)) for r in batches[0].records]
    assert got == records
    assert [r.offset for r in batches[0].records] == list(range(1000, 1120))
    assert batches[1].records[4].timestamp == 1_700_000_000_000 + 4


def test_header_scan_matches_full_decode() -> None:
    data = b"".join(encode_batch(i * 10, sample_records(10, i)) for i in range(20))
    headers = list(scan_headers("seg.log", data))
    assert [(h.base_offset, h.last_offset, h.position) for h in headers] == [
        (b.header.base_offset, b.header.last_offset, b.header.position) for b in iter_batches("seg.log", data)
    ]
    assert headers[-1].position + headers[-1].size == len(data)


def test_zero_filled_tail_ends_the_data() -> None:
    data = encode_batch(0, sample_records(3)) + b"\x00" * 4096
    assert len(list(iter_batches("seg.log", data))) == 1


def test_crc_mismatch_names_the_batch_position() -> None:
    first = encode_batch(0, sample_records(3))
    second = bytearray(encode_batch(3, sample_records(3)))
    second[-1] ^= 0xFF
    with pytest.raises(FormatError, match="CRC-32C mismatch") as info:
        list(iter_batches("seg.log", first + bytes(second)))
    assert info.value.position == len(first) and info.value.path == "seg.log"


def test_partial_tail_is_a_truncated_batch() -> None:
    data = encode_batch(0, sample_records(3)) + encode_batch(3, sample_records(3))[:-7]
    with pytest.raises(TruncatedBatchError, match="extends past the end"):
        list(iter_batches("seg.log", data))


def test_legacy_magic_is_unsupported() -> None:
    legacy = bytearray(encode_batch(0, sample_records(1)))
    legacy[16] = 1
    with pytest.raises(UnsupportedFormatError, match="legacy message format v1"):
        list(scan_headers("seg.log", bytes(legacy)))


def test_bad_length_and_codec_are_reported() -> None:
    data = bytearray(encode_batch(0, sample_records(1)))
    struct.pack_into(">i", data, 8, 20)
    with pytest.raises(FormatError, match="below the minimum"):
        list(scan_headers("seg.log", bytes(data)))
    data = bytearray(encode_batch(0, sample_records(1)))
    data[22] |= 7
    with pytest.raises(FormatError, match="unknown compression codec id 7"):
        list(scan_headers("seg.log", bytes(data)))


def test_record_count_mismatch_is_reported() -> None:
    data = bytearray(encode_batch(0, sample_records(4)))
    struct.pack_into(">i", data, 57, 3)  # recordsCount says 3, the records section holds 4
    with pytest.raises(FormatError):
        list(iter_batches("seg.log", bytes(data), verify_crc=False))


def test_control_marker_decoding() -> None:
    commit = Record(5, 0, struct.pack(">hh", 0, 1), struct.pack(">hi", 0, 7), ())
    assert control_marker(commit) == ("COMMIT", 7)
    abort = Record(6, 0, struct.pack(">hh", 0, 0), struct.pack(">hi", 0, 3), ())
    assert control_marker(abort).kind == "ABORT"


def test_summarize_segment_validates_and_summarizes(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000100.log"
    path.write_bytes(
        encode_batch(100, sample_records(10), leader_epoch=3) + encode_batch(110, sample_records(5), leader_epoch=4)
    )
    summary = summarize_segment(path)
    assert (summary.base_offset, summary.last_offset, summary.batch_count) == (100, 114, 2)
    assert summary.leader_epochs == (3, 4)
    assert summary.size == path.stat().st_size
    with mapped(path) as buf:
        assert len(list(iter_batches(str(path), buf))) == 2
    damaged = bytearray(path.read_bytes())
    damaged[80] ^= 1
    path.write_bytes(bytes(damaged))
    with pytest.raises(FormatError, match=str(path)):
        summarize_segment(path)


def test_streamed_validation_matches_the_whole_file_and_reports_absolute_positions(tmp_path: Path) -> None:
    import crc32c

    from tiering_core.formats import summarize_fd

    path = tmp_path / "00000000000000000000.log"
    data = b"".join(encode_batch(i * 50, sample_records(50, i), codec=i % 5) for i in range(40))
    path.write_bytes(data + b"\x00" * 100)
    fd = os.open(path, os.O_RDONLY)
    try:
        summary, crc = summarize_fd(str(path), fd, len(data), window=4096)
        assert summary == summarize_segment(path)
        assert summary.size == len(data) and crc == crc32c.crc32c(data)
        with pytest.raises(FormatError, match="zero-filled") as zeros:
            summarize_fd(str(path), fd, len(data) + 100, window=4096)  # a rolled segment has no zero tail
        assert zeros.value.position == len(data)
        damaged = bytearray(data)
        damaged[len(data) - 30] ^= 1
        path.write_bytes(bytes(damaged))
        with pytest.raises(FormatError) as info:
            summarize_fd(str(path), fd, len(data), window=4096)
        last_batch = list(scan_headers(str(path), bytes(damaged)))[-1]
        assert info.value.position == last_batch.position
    finally:
        os.close(fd)
