"""The compiled check of a downloaded window (native/src/window.rs, ``tiering_native.checked_window``) against the
Python reference it replaces (``reader.batches.checked_window``): the same ``BatchHeader``s for a good window, and
the same fault (position in the object and reason) for a window cut at any byte, with any byte changed, or with
offsets outside the copy or not after the ones before."""

from __future__ import annotations

import random

import pytest

from reader import batches
from reader.errors import RemoteDataCorrupt
from tests.kafka_encoder import encode_batch, sample_records
from tiering_core.formats import BatchHeader, scan_headers

native = pytest.importorskip("tiering_native", reason="the compiled module is not built (bash deploy/setup.sh)")
BASE = 5000  # where the window starts in its object: errors name positions in the object


def _window() -> tuple[bytes, int]:
    """Batches of every codec, one transactional, one with log-append time; the bytes and the last offset."""
    data, offset = b"", 100
    for i, codec in enumerate((0, 1, 2, 3, 4, 0)):
        records = sample_records(6 + i, seed=codec)
        extra = 0x10 if i == 2 else 0x08 if i == 4 else 0
        data += encode_batch(offset, records, codec=codec, attributes_extra=extra, producer_id=7 if i == 2 else -1)
        offset += len(records)
    return data, offset - 1


def _outcome(compiled: bool, data: bytes, first: int, last: int, after: int) -> object:
    saved = batches._native
    batches._native = native if compiled else None
    try:
        return batches.checked_window("k", data, BASE, first, last, after)
    except RemoteDataCorrupt as exc:
        return "corrupt", exc.position, exc.reason
    finally:
        batches._native = saved


def _both(data: bytes, first: int, last: int, after: int) -> object:
    compiled, reference = _outcome(True, data, first, last, after), _outcome(False, data, first, last, after)
    assert compiled == reference
    return compiled


def test_a_good_window_gives_the_headers_the_python_scan_makes() -> None:
    data, last = _window()
    headers = _both(data, 100, last, 99)
    assert isinstance(headers, list) and all(type(h) is BatchHeader for h in headers)
    assert headers == list(scan_headers("k", data))
    assert [h.position for h in headers][:2] == [0, headers[0].size]


def test_offsets_outside_the_copy_or_not_growing_are_the_same_fault() -> None:
    data, last = _window()
    for first, high, after in ((100, last - 1, 99), (101, last, 99), (100, last, 100), (100, last, 5000)):
        outcome = _both(data, first, high, after)
        assert isinstance(outcome, tuple) and "batch offsets" in outcome[2], outcome


@pytest.mark.parametrize("seed", range(4))
def test_any_byte_changed_or_any_cut_gives_the_same_outcome_to_both(seed: int) -> None:
    data, last = _window()
    rng = random.Random(seed)
    unseen = []
    for _ in range(400):
        broken = bytearray(data)
        at = rng.randrange(len(data))
        broken[at] ^= 1 << rng.randrange(8)
        if not isinstance(_both(bytes(broken), 100, last, 99), tuple):
            unseen.append(at)
    starts = [h.position for h in scan_headers("k", data)]
    # only the bytes no check covers: a leader epoch (outside the CRC), a base offset still in order
    assert all(any(0 <= at - s < 16 and not 8 <= at - s < 12 for s in starts) for at in unseen), unseen
    boundaries = {h.position for h in scan_headers("k", data)} | {len(data)}
    for cut in range(0, len(data), 7 + seed):
        outcome = _both(data[:cut], 100, last, 99)
        # a window cut at a batch boundary is whole batches; anywhere else it ends inside one: a fault
        assert isinstance(outcome, list) == (cut in boundaries), (cut, outcome)
