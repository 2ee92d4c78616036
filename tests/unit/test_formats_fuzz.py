"""Fuzzing: damaged segment bytes either decode or raise FormatError, never anything else."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.kafka_encoder import encode_batch, sample_records
from tiering_core.errors import FormatError
from tiering_core.formats import iter_batches, scan_headers

SEGMENT = b"".join(encode_batch(i * 20, sample_records(20, i), codec=i % 5, leader_epoch=i) for i in range(6))


def _consume(data: bytes) -> None:
    try:
        for _ in scan_headers("fuzz.log", data):
            pass
    except FormatError:
        pass
    try:
        for _ in iter_batches("fuzz.log", data, verify_crc=False):
            pass
    except FormatError:
        pass
    try:
        for _ in iter_batches("fuzz.log", data):
            pass
    except FormatError:
        pass


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, len(SEGMENT) - 1), st.integers(0, 255)), min_size=1, max_size=8))
def test_flipped_bytes_decode_or_raise_format_error(flips: list[tuple[int, int]]) -> None:
    data = bytearray(SEGMENT)
    for pos, value in flips:
        data[pos] = value
    _consume(bytes(data))


@settings(max_examples=200, deadline=None)
@given(st.integers(0, len(SEGMENT)), st.binary(max_size=64))
def test_cut_and_garbage_tails_decode_or_raise_format_error(cut: int, tail: bytes) -> None:
    _consume(SEGMENT[:cut] + tail)


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=0, max_size=400))
def test_random_bytes_decode_or_raise_format_error(data: bytes) -> None:
    _consume(data)
