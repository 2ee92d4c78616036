"""``BatchCursor`` (``reader/cursor.py``) over real record batches and a fake store: what a read serves, byte for
byte and offset by offset, across window boundaries, and what a read that may not wait does."""

from __future__ import annotations

import os
import threading
from array import array
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from reader.cursor import BatchCursor, CursorCache
from reader.errors import WouldBlock
from reader.pool import MemoryPool
from tests.kafka_encoder import encode_batch

KIB = 1024


@dataclass(eq=False)
class Copy:
    """A copy of whole batches of 5 records each, of a few KiB, at offsets 0.."""

    data: bytes
    positions: list[int]
    offsets: list[int]  # each batch's base offset
    log_key: str = "t/0/copy.log"
    base_offset: int = 0
    index_positions: array = field(init=False)

    def __post_init__(self) -> None:
        self.index_positions = array("q", self.positions)

    @property
    def size(self) -> int:
        return len(self.data)

    @property
    def end_offset(self) -> int:
        return self.offsets[-1] + 4

    def position_for(self, offset: int) -> int:
        return max(p for p, o in zip(self.positions, self.offsets, strict=True) if o <= offset)


def make_copy(batches: int) -> Copy:
    data, positions, offsets = bytearray(), [], []
    for n in range(batches):
        positions.append(len(data))
        offsets.append(5 * n)
        data += encode_batch(5 * n, [(None, os.urandom(700 + 13 * (n % 7)), []) for _ in range(5)])
    return Copy(bytes(data), positions, offsets)


class Reader:
    """What a cursor uses of a ``RemoteReader``: one copy, ranged reads that can be held back."""

    def __init__(self, copy: Copy, window: int, ahead: int) -> None:
        self.copy = copy
        self.settings = SimpleNamespace(fetch_window_bytes=window, prefetch_windows=ahead)
        self.pool = MemoryPool(16 << 20)
        self.executor = ThreadPoolExecutor(4)
        self.gate = threading.Event()
        self.gate.set()
        self.reads = 0

    def locate(self, topic: str, partition: int, offset: int, topic_id: str) -> Copy:
        return self.copy

    def read_or_gone(self, copy: Copy, start: int, end: int, *, cacheable: bool = False) -> bytes:
        self.gate.wait(10)
        self.reads += 1
        return copy.data[start:end]

    def next_copy(self, copy: Copy) -> None:
        return None

    def damaged(self, key: str) -> None:
        raise AssertionError(f"{key} reported damaged")


def settled(reader: Reader) -> None:
    """Wait until every download queued so far has ended."""
    for _ in range(3):
        reader.executor.submit(lambda: None).result(10)
    for f in [reader.executor.submit(lambda: None) for _ in range(4)]:
        f.result(10)


def offsets_of(data: bytes | memoryview, copy: Copy) -> list[int]:
    """The base offsets of the whole batches in ``data``, checked to be the copy's bytes there."""
    raw = bytes(data)
    start = copy.data.index(raw[:61])
    assert copy.data[start : start + len(raw)] == raw
    return [o for p, o in zip(copy.positions, copy.offsets, strict=True) if start <= p < start + len(raw)]


def test_reads_go_on_into_the_next_window_when_it_is_downloaded_and_serve_every_byte_once() -> None:
    """Answers of about ``max_bytes`` each, not a short one at the end of every window, and every batch of the
    copy served exactly once, in order, as its bytes."""
    copy = make_copy(200)  # about 700 KiB
    reader = Reader(copy, window=64 * KIB, ahead=16)
    cursor = BatchCursor(reader, "t", "id", 0, 0, memory_wait=1.0)  # type: ignore[arg-type]
    served, sizes = [], []
    while cursor.position <= copy.end_offset:
        settled(reader)
        got = cursor.read(40 * KIB, read_committed=False)
        assert got.data and len(got.data) <= 40 * KIB and got.next_offset == cursor.position
        sizes.append(len(got.data))
        served += offsets_of(got.data, copy)
    assert served == copy.offsets
    batch = max(b - a for a, b in zip(copy.positions, copy.positions[1:], strict=False))
    assert all(s > 40 * KIB - batch for s in sizes[:-1])  # every answer but the last is full
    cursor.close()
    settled(reader)
    assert reader.pool.used == 0


def test_a_read_that_may_not_wait_serves_only_downloaded_windows_and_never_skips_an_offset() -> None:
    """With downloads held back, ``block=False`` is WouldBlock (nothing served, the cursor where it was, kept
    by the cache); once the window is downloaded it is served, and a read that may wait goes on from there. A
    read that would go on into a window not downloaded yet ends at the window instead."""
    copy = make_copy(60)
    reader = Reader(copy, window=64 * KIB, ahead=0)
    reader.gate.clear()
    cache = CursorCache(reader, capacity=4, memory_wait=1.0)  # type: ignore[arg-type]
    with pytest.raises(WouldBlock):
        cache.read("t", "id", 0, 0, 40 * KIB, False, block=False)  # no cursor continues at 0 yet
    reader.gate.set()
    first = cache.read("t", "id", 0, 0, 40 * KIB, False)
    served = offsets_of(first.data, copy)
    reader.gate.clear()  # the next window is not downloaded (no read-ahead)
    position, blocked, in_memory = first.next_offset, 0, 0
    while True:
        downloads = reader.reads
        try:
            got = cache.read("t", "id", 0, position, 40 * KIB, False, block=False)
            assert reader.reads == downloads  # served from memory: nothing downloaded for it
            in_memory += 1
        except WouldBlock:
            blocked += 1
            assert ("id", 0, position) in cache.cursors  # kept, where it was
            reader.gate.set()
            got = cache.read("t", "id", 0, position, 40 * KIB, False)
            reader.gate.clear()
        served += offsets_of(got.data, copy)
        position = got.next_offset
        if position > copy.end_offset:
            break
    assert served == copy.offsets
    assert blocked >= 3 and in_memory >= 3  # both kinds of read happened, windows apart
    reader.gate.set()
    cache.close()
    settled(reader)
    assert reader.pool.used == 0
