"""The compiled decoder (``tiering_native``) against the pure-Python reference, on the same bytes.

Hypothesis writes batches (every codec, null and empty keys and values, headers with null values,
LogAppendTime, transactions with their markers) and both decoders must give the same records, through
the consumer's path (message tuples) and the Spark data source's (Arrow rows, aborted transactions and
control batches dropped, a slice's offset range kept). Corrupt input, truncated or with flipped bits
(CRC left as is, or recomputed so the damage reaches the record decoder), must give the same error
class at the same byte position; the compiled decoder never crashes and never reads past its buffer.
"""

from __future__ import annotations

import os
import subprocess
import sys

import crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.decoders import DECODERS, column_outcome, outcome
from tests.kafka_encoder import encode_batch, sample_records

HEADERS = st.lists(st.tuples(st.text(max_size=8), st.none() | st.binary(max_size=16)), max_size=3)
RECORD = st.tuples(st.none() | st.binary(max_size=24), st.none() | st.binary(max_size=300), HEADERS)
# (records, codec, attribute bits: 0x08 LogAppendTime, 0x10 transactional, producer id)
BATCH = st.tuples(
    st.lists(RECORD, min_size=1, max_size=25),
    st.integers(0, 4),
    st.sampled_from([0, 0x08, 0x10]),
    st.sampled_from([7, 8]),
)
ABORT, COMMIT = b"\x00\x00\x00\x00", b"\x00\x00\x00\x01"
MARKER_VALUE = b"\x00\x00\x00\x00\x00\x07"


def _segment(batches: list, markers: list[bool]) -> tuple[bytes, tuple[tuple[int, int, int], ...]]:
    """The batches at consecutive offsets, each transactional one followed by an ABORT or COMMIT marker;
    returns the bytes and the aborted transactions (producer id, first offset, marker offset)."""
    data = b""
    offset = 1000
    aborted = []
    for i, (recs, codec, bits, pid) in enumerate(batches):
        txn = bits == 0x10
        data += encode_batch(offset, recs, codec=codec, attributes_extra=bits, producer_id=pid if txn else -1,
                             base_timestamp=1_700_000_000_000 + i)  # fmt: skip
        first = offset
        offset += len(recs)
        if txn:
            abort = markers[i % len(markers)]
            key = ABORT if abort else COMMIT
            data += encode_batch(offset, [(key, MARKER_VALUE, [])], attributes_extra=0x30, producer_id=pid)
            if abort:
                aborted.append((pid, first, offset))
            offset += 1
    return data, tuple(aborted)


SEGMENTS = st.builds(_segment, st.lists(BATCH, min_size=1, max_size=6), st.lists(st.booleans(), min_size=1))


def _both(fn, *args, **kwargs) -> tuple:
    python, native = (fn(name, *args, **kwargs) for name in DECODERS)
    return python, native


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(SEGMENTS)
def test_generated_batches_decode_identically(segment: tuple) -> None:
    data, _ = segment
    python, native = _both(outcome, data)
    assert isinstance(python, list), python
    assert native == python


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(SEGMENTS, st.integers(0, 200), st.integers(0, 200), st.sampled_from([64, 4096, 16 << 20]),
       st.sampled_from([1, 7, 65536]))  # fmt: skip
def test_generated_batches_give_identical_arrow_rows(segment: tuple, skip: int, keep: int, window: int,
                                                     max_rows: int) -> None:  # fmt: skip
    data, aborted = segment
    first = 1000 + skip
    python, native = _both(column_outcome, data, first=first, last=first + keep, aborted=aborted,
                           window=window, max_rows=max_rows)  # fmt: skip
    assert isinstance(python, list), python
    assert native == python
    assert all(not (row["offset"] < first or row["offset"] > first + keep) for row in native)


def _sample() -> bytes:
    data, _ = _segment(
        [(sample_records(40, seed=codec), codec, bits, 7) for codec in range(5) for bits in (0, 0x08, 0x10)], [True]
    )
    return data


SAMPLE = _sample()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, len(SAMPLE)))
def test_truncated_input_gives_the_same_error_at_the_same_position(cut: int) -> None:
    data = SAMPLE[:cut]
    python, native = _both(outcome, data)
    assert native == python
    python, native = _both(column_outcome, data)
    assert native == python


def _flipped(flips: list[tuple[int, int]]) -> bytearray:
    data = bytearray(SAMPLE)
    for position, bit in flips:
        data[position] ^= 1 << bit
    return data


FLIPS = st.lists(st.tuples(st.integers(0, len(SAMPLE) - 1), st.integers(0, 7)), min_size=1, max_size=6)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(FLIPS)
def test_flipped_bits_give_the_same_error_at_the_same_position(flips: list[tuple[int, int]]) -> None:
    data = bytes(_flipped(flips))
    python, native = _both(outcome, data)
    assert native == python
    python, native = _both(column_outcome, data)
    assert native == python


def _recrc(data: bytearray) -> bytes:
    """Every batch's CRC-32C recomputed (so flipped bits inside it reach the record decoder), following
    the length fields as long as they lead to whole batches."""
    pos = 0
    while len(data) - pos >= 61:
        length = int.from_bytes(data[pos + 8 : pos + 12], "big", signed=True)
        if length < 49 or pos + 12 + length > len(data):
            break
        data[pos + 17 : pos + 21] = crc32c.crc32c(bytes(data[pos + 21 : pos + 12 + length])).to_bytes(4, "big")
        pos += 12 + length
    return bytes(data)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(FLIPS)
def test_flipped_records_under_a_valid_crc_give_the_same_outcome(flips: list[tuple[int, int]]) -> None:
    data = _recrc(_flipped(flips))
    python, native = _both(outcome, data)
    assert native == python


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(FLIPS)
def test_flipped_records_under_a_valid_crc_give_the_same_arrow_outcome(flips: list[tuple[int, int]]) -> None:
    data = _recrc(_flipped(flips))
    python, native = _both(column_outcome, data)
    assert native == python


def test_without_the_compiled_decoder_the_reference_is_used_and_said_once() -> None:
    env = {**os.environ, "TIERING_NATIVE_DECODER": "0"}
    code = "import logging; logging.basicConfig(); from tiering_core.formats import native; print(native.DECODER)"
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "python"
    env["TIERING_NATIVE_DECODER"] = "1"
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "native"


@pytest.mark.parametrize("bad", [b"", b"\x00" * 10])
def test_native_entry_points_reject_buffers_too_short(bad: bytes) -> None:
    import tiering_native

    with pytest.raises(tiering_native.DecodeError):
        tiering_native.batch_payload(bad, 0, 49, 0, 0)
    with pytest.raises(ValueError):
        tiering_native.decode_records(bad, 0, 1, 0, 0, None, tuple)
