"""LZ4 records sections in the compiled decoder: the frame layout Kafka's producers write (one frame,
independent 64 KiB blocks, no checksums) is decoded block by block straight into the payload; every other
layout goes through the general frame decoder. Both must give exactly what python-lz4 (the reference
decoder's library) gives, or an error where it gives one, for every layout and for damaged frames."""

from __future__ import annotations

import random

import lz4.frame
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

native = pytest.importorskip("tiering_native", reason="the compiled decoder is not built (bash deploy/setup.sh)")

HEADER = 61
KAFKA = {"block_size": lz4.frame.BLOCKSIZE_MAX64KB, "block_linked": False, "content_checksum": False,
         "store_size": False}  # fmt: skip
LAYOUTS = {
    "kafka": KAFKA,
    "content size": {**KAFKA, "store_size": True},
    "256 KiB blocks": {**KAFKA, "block_size": lz4.frame.BLOCKSIZE_MAX256KB},
    "4 MiB blocks": {**KAFKA, "block_size": lz4.frame.BLOCKSIZE_MAX4MB},
    "content checksum": {**KAFKA, "content_checksum": True},
    "block checksums": {**KAFKA, "block_checksum": True},
    "linked blocks": {**KAFKA, "block_linked": True},
}


def _data(size: int) -> bytes:
    """Compressible text with incompressible stretches (LZ4 stores those blocks uncompressed)."""
    noise = random.Random(size)
    parts, n = [], 0
    while n < size:
        part = noise.randbytes(70_000) if len(parts) % 3 == 2 else b"order-%d;" % n * 500
        parts.append(part)
        n += len(part)
    return b"".join(parts)[:size]


def _payload(section: bytes) -> bytes:
    """``batch_payload`` of a batch whose records section is ``section`` (header zeros, CRC not checked)."""
    buf = bytes(HEADER) + section
    return native.batch_payload(buf, 0, len(buf) - 12, 0, 3, False)


@pytest.mark.parametrize("size", [0, 1, 1000, 65536, 65537, 300_000, 2_000_000])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_layout_decodes_as_python_lz4(layout: str, size: int) -> None:
    data = _data(size)
    frame = lz4.frame.compress(data, **LAYOUTS[layout])
    assert lz4.frame.decompress(frame) == data
    assert _payload(frame) == data


def test_only_the_first_frame_of_a_section_is_read() -> None:
    """As python-lz4 and Kafka's consumers read it: bytes after the first frame's end mark are ignored."""
    first, second = _data(70_000), _data(1000)
    section = lz4.frame.compress(first, **KAFKA) + lz4.frame.compress(second, **KAFKA)
    assert lz4.frame.decompress(section) == first
    assert _payload(section) == first


FRAME = lz4.frame.compress(_data(200_000), **KAFKA)


def _same_as_reference(frame: bytes) -> None:
    """The same bytes as python-lz4 where it decodes ``frame``, an error where it does not; never a crash.
    One difference is kept: the LZ4 block format makes a match offset of 0 invalid ("denotes a corrupted
    block"), which lz4_flex refuses and the C library copies from anyway."""
    try:
        expected = lz4.frame.decompress(frame)
    except RuntimeError:
        with pytest.raises(native.DecodeError):
            _payload(frame)
        return
    try:
        got = _payload(frame)
    except native.DecodeError as exc:
        assert "0 is not a valid match offset" in exc.args[2], exc.args  # lz4_flex's OffsetZero, as displayed
    else:
        assert got == expected


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, len(FRAME) - 1), st.integers(0, 7)), min_size=1, max_size=4))
def test_damaged_frames_decode_as_python_lz4_or_fail(flips: list[tuple[int, int]]) -> None:
    """A flipped bit anywhere: descriptor, header checksum, block sizes, block data."""
    frame = bytearray(FRAME)
    for position, bit in flips:
        frame[position] ^= 1 << bit
    _same_as_reference(bytes(frame))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, len(FRAME) - 1))
def test_truncated_frames_decode_as_python_lz4_or_fail(cut: int) -> None:
    _same_as_reference(FRAME[:cut])
