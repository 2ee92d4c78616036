"""Fuzzing the segment scanners: what decodes must be exactly what was encoded, the rest FormatError.

"No crash" is not enough: a scan that stops early without an error is how a copy once held 8 MiB of
a 12 MiB segment (issue 7.1). Each test checks the decoded extent (offsets, batch count, byte count)
against what the encoder wrote, and the windowed validation of rolled segments with every window
size, including edges that cut a batch header at each of its 61 bytes.
"""

from __future__ import annotations

import tempfile
from typing import NamedTuple

import crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.kafka_encoder import encode_batch, sample_records
from tiering_core.errors import FormatError
from tiering_core.formats import HEADER_SIZE, SegmentSummary, iter_batches, scan_headers, summarize_fd


class Encoded(NamedTuple):
    """A segment as the encoder wrote it: bytes, each batch's (position, size, base, last offset)."""

    data: bytes
    batches: list[tuple[int, int, int, int]]

    @property
    def first_offset(self) -> int:
        return self.batches[0][2]

    @property
    def last_offset(self) -> int:
        return self.batches[-1][3]


def encode_segment(base: int, shapes: list[tuple[int, int, int]]) -> Encoded:
    """Batches at consecutive offsets from ``base``; a shape is (record count, seed, codec)."""
    parts, batches, position, offset = [], [], 0, base
    for count, seed, codec in shapes:
        raw = encode_batch(offset, sample_records(count, seed), codec=codec, leader_epoch=seed % 3)
        parts.append(raw)
        batches.append((position, len(raw), offset, offset + count - 1))
        position += len(raw)
        offset += count
    return Encoded(b"".join(parts), batches)


SEGMENT = encode_segment(0, [(20, i, i % 5) for i in range(6)])
SHAPES = st.lists(st.tuples(st.integers(1, 40), st.integers(0, 50), st.integers(0, 4)), min_size=1, max_size=12)
# small base offsets leave the first bytes of every header zero, the case a scan once took for the end
BASES = st.one_of(st.integers(0, 1000), st.integers(0, 2**62))


def summarize_bytes(data: bytes, window: int, length: int | None = None) -> tuple[SegmentSummary, int]:
    with tempfile.TemporaryFile() as f:
        f.write(data)
        f.flush()
        return summarize_fd("fuzz.log", f.fileno(), len(data) if length is None else length, window)


def assert_whole(encoded: Encoded, summary: SegmentSummary, crc: int) -> None:
    """The summary states exactly the encoded extent: offsets, batches and bytes."""
    assert (summary.base_offset, summary.last_offset) == (encoded.first_offset, encoded.last_offset)
    assert (summary.batch_count, summary.size) == (len(encoded.batches), len(encoded.data))
    assert crc == crc32c.crc32c(encoded.data)


def whole_batches_before(encoded: Encoded, cut: int) -> list[tuple[int, int, int, int]]:
    return [b for b in encoded.batches if b[0] + b[1] <= cut]


# -- rolled segments, validated in windows -------------------------------------------------------
@settings(max_examples=150, deadline=None)
@given(BASES, SHAPES, st.integers(1, 6000))
def test_windowed_validation_states_exactly_what_was_encoded(base: int, shapes: list, window: int) -> None:
    encoded = encode_segment(base, shapes)
    assert_whole(encoded, *summarize_bytes(encoded.data, window))


def test_every_window_size_over_a_segment_larger_than_the_window() -> None:
    encoded = encode_segment(3, [(5, i, i % 5) for i in range(12)])
    assert len(encoded.data) > 1500
    for window in range(1, len(encoded.data) + 2):
        assert_whole(encoded, *summarize_bytes(encoded.data, window))


@pytest.mark.parametrize("into", range(HEADER_SIZE + 1))
def test_window_edge_at_every_byte_of_a_zero_prefixed_header(into: int) -> None:
    """Fixed-size batches at small offsets (their headers start with six zero bytes); windows sized so
    the first edge falls ``into`` bytes into the header of batch k, for several k."""
    encoded = encode_segment(0, [(1, 7, 0)] * 60)
    sizes = {size for _, size, _, _ in encoded.batches}
    assert len(sizes) == 1 and not any(encoded.data[:6])
    for k in (1, 2, 7, 30):
        window = encoded.batches[k][0] + into
        assert_whole(encoded, *summarize_bytes(encoded.data, window))


@settings(max_examples=150, deadline=None)
@given(BASES, SHAPES, st.integers(1, 6000), st.integers(1, 64))
def test_zero_tail_in_a_rolled_segment_is_an_error(base: int, shapes: list, window: int, zeros: int) -> None:
    encoded = encode_segment(base, shapes)
    with pytest.raises(FormatError) as info:
        summarize_bytes(encoded.data + bytes(zeros), window)
    assert info.value.position == len(encoded.data)


@settings(max_examples=150, deadline=None)
@given(BASES, SHAPES, st.integers(1, 6000), st.data())
def test_cut_segment_is_an_error_unless_cut_at_a_batch_boundary(base: int, shapes: list, window: int,
                                                                draw: st.DataObject) -> None:  # fmt: skip
    encoded = encode_segment(base, shapes)
    cut = draw.draw(st.integers(1, len(encoded.data)))
    kept = whole_batches_before(encoded, cut)
    if kept and kept[-1][0] + kept[-1][1] == cut:
        summary, crc = summarize_bytes(encoded.data[:cut], window)
        assert_whole(Encoded(encoded.data[:cut], kept), summary, crc)
    else:
        with pytest.raises(FormatError):
            summarize_bytes(encoded.data[:cut], window)


@settings(max_examples=100, deadline=None)
@given(BASES, SHAPES, st.integers(1, 6000), st.data())
def test_zero_length_field_inside_a_rolled_segment_is_an_error(base: int, shapes: list, window: int,
                                                               draw: st.DataObject) -> None:  # fmt: skip
    encoded = encode_segment(base, shapes)
    position = draw.draw(st.sampled_from([b[0] for b in encoded.batches]))
    damaged = bytearray(encoded.data)
    damaged[position : position + HEADER_SIZE] = bytes(HEADER_SIZE)
    with pytest.raises(FormatError) as info:
        summarize_bytes(bytes(damaged), window)
    assert info.value.position == position


def test_file_shorter_than_the_length_to_copy_is_an_error() -> None:
    with pytest.raises(FormatError, match="file ended"):
        summarize_bytes(SEGMENT.data, 4096, length=len(SEGMENT.data) + 1)


# -- damaged bytes: an error, or exactly the encoded extent ---------------------------------------
def _extent(data: bytes, *, verify_crc: bool) -> tuple[list[tuple[int, int, int]], int]:
    """Decoded batches as (base offset, last offset, record count), and the bytes they span."""
    batches = list(iter_batches("fuzz.log", data, verify_crc=verify_crc))
    end = batches[-1].header.position + batches[-1].header.size if batches else 0
    return [(b.header.base_offset, b.header.last_offset, len(b.records)) for b in batches], end


def _assert_tail_is_end_of_data(data: bytes, end: int) -> None:
    """Bytes after the last decoded batch are only what Kafka's scan stops at: a zero-filled tail of
    under 17 bytes, or zeros where a length field would be."""
    tail = data[end:]
    assert not tail or (len(tail) < 17 and not any(tail)) or not any(tail[8:12])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, len(SEGMENT.data) - 1), st.integers(0, 255)), min_size=1, max_size=8))
def test_flipped_bytes_decode_exactly_or_raise_format_error(flips: list[tuple[int, int]]) -> None:
    data = bytearray(SEGMENT.data)
    for pos, value in flips:
        data[pos] = value
    damaged = bytes(data)
    try:
        batches, end = _extent(damaged, verify_crc=True)
    except FormatError:
        return
    # only fields outside the CRC (baseOffset, length, leader epoch, magic, crc) can change unnoticed; a
    # zeroed length field ends the data there, as in Kafka's scan: a prefix of the batches, nothing else
    if end < len(damaged):
        _assert_tail_is_end_of_data(damaged, end)
    counts = [last - first + 1 for _, _, first, last in SEGMENT.batches]
    assert [b[2] for b in batches] == counts[: len(batches)]
    try:
        summary, _ = summarize_bytes(damaged, 1000)
    except FormatError:
        return
    assert (summary.size, summary.batch_count) == (len(damaged), len(SEGMENT.batches))


@settings(max_examples=200, deadline=None)
@given(st.integers(0, len(SEGMENT.data)), st.binary(max_size=64))
def test_cut_and_garbage_tails_decode_exactly_or_raise_format_error(cut: int, tail: bytes) -> None:
    data = SEGMENT.data[:cut] + tail
    kept = whole_batches_before(SEGMENT, cut)
    for verify_crc in (False, True):
        try:
            batches, end = _extent(data, verify_crc=verify_crc)
        except FormatError:
            continue
        expected = [(first, last, last - first + 1) for _, _, first, last in kept]
        assert batches[: len(expected)] == expected, "a batch before the cut was lost or changed"
        _assert_tail_is_end_of_data(data, end)
    try:
        headers = list(scan_headers("fuzz.log", data))
    except FormatError:
        return
    assert [h.base_offset for h in headers[: len(kept)]] == [b[2] for b in kept]


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=0, max_size=400))
def test_random_bytes_decode_or_raise_format_error(data: bytes) -> None:
    try:
        _batches, end = _extent(data, verify_crc=True)
    except FormatError:
        return
    _assert_tail_is_end_of_data(data, end)
