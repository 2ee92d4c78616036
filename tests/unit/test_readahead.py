"""The read core every sequential remote reader shares (``reader/readahead.py``), over a fake store: what it
downloads ahead, what the pool may take back, where it continues in the next copy, and that every pool byte
comes back."""

from __future__ import annotations

import gc
import itertools
import threading
import time
import weakref
from array import array
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from reader.errors import MemoryBusy, RemoteDataCorrupt, RemoteUnavailable, WouldBlock
from reader.pool import MemoryPool
from reader.readahead import IDLE, LOADING, ReadAhead

KIB = 1024


@dataclass(eq=False)
class FakeCopy:
    """A copy of ``size`` bytes whose batches start every 16 KiB, holding offsets ``base``..``end``."""

    name: str
    base_offset: int
    end_offset: int
    size: int
    index_positions: array = field(init=False)

    def __post_init__(self) -> None:
        self.index_positions = array("q", range(0, self.size, 16 * KIB))

    @property
    def log_key(self) -> str:
        return self.name

    def position_for(self, offset: int) -> int:
        per_batch = (self.end_offset - self.base_offset + 1) / len(self.index_positions)
        i = max(0, min(len(self.index_positions) - 1, int((offset - self.base_offset) // per_batch)))
        return self.index_positions[i]


class FakeReader:
    """What ``ReadAhead`` uses of a ``RemoteReader``: settings, pool, threads, ranged reads and the next copy."""

    def __init__(self, copies: list[FakeCopy], pool_bytes: int, window: int = 64 * KIB, ahead: int = 2) -> None:
        self.settings = SimpleNamespace(fetch_window_bytes=window, prefetch_windows=ahead)
        self.pool = MemoryPool(pool_bytes)
        self.executor = ThreadPoolExecutor(4)
        self.copies = copies
        self.reads: list[tuple[str, int, int]] = []
        self.failures: dict[tuple[str, int], BaseException] = {}
        self.gate = threading.Event()
        self.gate.set()
        self.locate_gate = threading.Event()
        self.locate_gate.set()
        self.damaged_keys: list[str] = []

    def read_or_gone(self, copy: FakeCopy, start: int, end: int, *, cacheable: bool = False) -> bytes:
        assert cacheable
        self.gate.wait(10)
        self.reads.append((copy.name, start, end))
        failure = self.failures.pop((copy.name, start), None)
        if failure is not None:
            try:
                raise failure
            finally:  # as a store's fresh error: nothing here holds it
                del failure
        return bytes(end - start)

    def next_copy(self, copy: FakeCopy) -> FakeCopy | None:
        self.locate_gate.wait(10)
        i = self.copies.index(copy)
        return self.copies[i + 1] if i + 1 < len(self.copies) else None

    def damaged(self, key: str) -> None:
        self.damaged_keys.append(key)


def no_prepare(copy: FakeCopy, data: bytes, start: int) -> tuple[None, int]:
    return None, 0


def settle(reader: FakeReader) -> None:
    """Wait until no download or location is running."""
    reader.executor.submit(time.sleep, 0).result()
    deadline = time.monotonic() + 10
    while reader.executor._work_queue.qsize() and time.monotonic() < deadline:  # type: ignore[attr-defined]
        time.sleep(0.01)
    time.sleep(0.05)


def walk(ahead: ReadAhead) -> list[tuple[str, int, int]]:
    """Take and pop every window to the remote end: (copy, start, end) in the order taken."""
    out = []
    while (w := ahead.head()) is not None:
        w = ahead.take()
        assert w.data is not None and len(w.data) == w.size
        out.append((w.copy.name, w.start, w.end))
        ahead.pop()
        ahead.fill()
    return out


def test_a_walk_reads_every_window_of_every_copy_once_in_order_and_gives_every_byte_back() -> None:
    a, b = FakeCopy("a", 0, 99, 200 * KIB), FakeCopy("b", 100, 199, 150 * KIB)
    reader = FakeReader([a, b], pool_bytes=1 << 20)
    ahead = ReadAhead(reader, no_prepare)
    ahead.begin(a, 0)
    taken = walk(ahead)
    assert [t[0] for t in taken] == ["a"] * 4 + ["b"] * 3
    assert all(x[2] == y[1] for x, y in itertools.pairwise(taken) if x[0] == y[0])  # contiguous within a copy
    assert taken[3][2] == a.size and taken[-1][2] == b.size
    settle(reader)
    assert sorted(reader.reads) == sorted(taken)  # nothing downloaded twice
    assert reader.pool.used == 0


def test_read_ahead_takes_only_free_room_and_stops_at_the_first_window_that_does_not_fit() -> None:
    a = FakeCopy("a", 0, 99, 1024 * KIB)
    reader = FakeReader([a], pool_bytes=200 * KIB, window=64 * KIB, ahead=8)
    other = reader.pool.try_reserve(40 * KIB)  # another reader's bytes
    assert other
    ahead = ReadAhead(reader, no_prepare)
    ahead.begin(a, 0)
    settle(reader)
    assert reader.pool.used <= reader.pool.capacity
    loaded = [w for w in ahead.windows if w.data is not None]
    assert [w.start for w in loaded] == [w.start for w in list(ahead.windows)[: len(loaded)]]  # a prefix, in order
    assert 0 < sum(w.size for w in loaded) <= 160 * KIB
    ahead.close()
    assert reader.pool.used == 40 * KIB


def test_a_demand_read_evicts_another_readers_read_ahead_instead_of_waiting() -> None:
    a, b = FakeCopy("a", 0, 99, 1024 * KIB), FakeCopy("b", 0, 99, 1024 * KIB)
    reader = FakeReader([a], pool_bytes=320 * KIB, ahead=8)
    hog = ReadAhead(reader, no_prepare)
    hog.begin(a, 0)
    settle(reader)
    assert reader.pool.used == reader.pool.capacity  # it took all the room there was
    needy = ReadAhead(reader, no_prepare, memory_wait=0.5)
    needy.begin(b, 0)
    w = needy.take()  # must not wait: the hog's windows nobody uses are evictable
    assert w.copy is b and w.data is not None
    assert reader.pool.used <= reader.pool.capacity
    hog.close()
    needy.close()
    settle(reader)
    assert reader.pool.used == 0


def test_memory_busy_after_memory_wait_leaves_the_head_window_as_it_was() -> None:
    a = FakeCopy("a", 0, 99, 256 * KIB)
    reader = FakeReader([a], pool_bytes=128 * KIB, ahead=0)
    assert reader.pool.try_reserve(100 * KIB)  # held, not evictable
    ahead = ReadAhead(reader, no_prepare, memory_wait=0.2)
    ahead.begin(a, 0)
    with pytest.raises(MemoryBusy, match=r"within 0\.2s"):
        ahead.take()
    reader.pool.release(100 * KIB)
    assert ahead.take().start == 0  # the same window, now downloaded
    ahead.close()
    assert reader.pool.used == 0


def test_a_take_that_may_not_wait_gets_only_a_window_read_ahead_and_changes_nothing_otherwise() -> None:
    """``take(block=False)`` (the access layer reading on its event loop): a window still downloading, or
    never started for want of room, is WouldBlock, the window left as it was, nothing downloaded for it; once
    read ahead it is taken at once. The next copy still being located is WouldBlock too."""
    a, b = FakeCopy("a", 0, 99, 64 * KIB), FakeCopy("b", 100, 199, 64 * KIB)
    reader = FakeReader([a, b], pool_bytes=1 << 20, ahead=1)
    reader.gate.clear()  # downloads wait
    reader.locate_gate.clear()  # and so does the location of the copy after ``a``
    ahead = ReadAhead(reader, no_prepare)
    ahead.begin(a, 0)
    with pytest.raises(WouldBlock, match="not downloaded yet"):
        ahead.take(block=False)
    assert ahead.windows[0].state == LOADING
    reader.gate.set()
    settle(reader)
    w = ahead.take(block=False)
    assert w.copy is a and w.data is not None
    ahead.pop()
    with pytest.raises(WouldBlock, match="located"):
        ahead.head(block=False)
    reader.locate_gate.set()
    settle(reader)
    assert ahead.head(block=False) is not None and ahead.head(block=False).copy is b
    ahead.close()
    settle(reader)

    c = FakeCopy("c", 0, 99, 128 * KIB)
    reader = FakeReader([c], pool_bytes=128 * KIB, ahead=0)
    assert reader.pool.try_reserve(100 * KIB)  # no room: the head window is not read ahead
    ahead = ReadAhead(reader, no_prepare, memory_wait=5)
    ahead.begin(c, 0)
    with pytest.raises(WouldBlock):
        ahead.take(block=False)  # at once, not after memory_wait
    assert ahead.windows[0].state == IDLE and reader.reads == []
    reader.pool.release(100 * KIB)
    assert ahead.take().start == 0  # a read that may wait downloads it
    ahead.close()
    assert reader.pool.used == 0


def test_a_parked_head_window_is_evictable_and_taken_again_after_eviction() -> None:
    a = FakeCopy("a", 0, 99, 128 * KIB)
    reader = FakeReader([a], pool_bytes=128 * KIB, window=64 * KIB, ahead=0)
    ahead = ReadAhead(reader, no_prepare)
    ahead.begin(a, 0)
    first = ahead.take()
    ahead.park()
    assert ahead.unpark()  # nothing needed its room: still there
    ahead.park()
    assert reader.pool.reserve(128 * KIB, timeout=0.5)  # a demand read elsewhere takes the whole pool
    reader.pool.release(128 * KIB)
    assert not ahead.unpark()  # evicted for it
    again = ahead.take()
    assert again is first and again.data is not None
    assert reader.reads.count(("a", 0, first.end)) == 2
    ahead.close()
    assert reader.pool.used == 0


def test_a_read_ahead_error_is_raised_once_when_taken_and_the_next_take_reads_again() -> None:
    a = FakeCopy("a", 0, 99, 128 * KIB)
    reader = FakeReader([a], pool_bytes=1 << 20)
    reader.failures[("a", 0)] = RemoteUnavailable("a", 3, "store down")
    ahead = ReadAhead(reader, no_prepare)
    ahead.begin(a, 0)
    settle(reader)
    with pytest.raises(RemoteUnavailable):
        ahead.take()
    assert ahead.take().data is not None
    ahead.close()
    assert reader.pool.used == 0


def test_a_read_ahead_error_taken_leaves_the_reader_in_no_reference_cycle() -> None:
    """With the cyclic garbage collector off, a read-ahead error taken and handled leaves the ``ReadAhead`` (its
    windows, their downloaded bytes) to reference counting: the frame that raised the error does not hold it (a
    store outage raises one per window, each a cycle holding a reader's windows until a collection)."""
    a = FakeCopy("a", 0, 99, 128 * KIB)
    reader = FakeReader([a], pool_bytes=1 << 20)
    reader.failures[("a", 0)] = RemoteUnavailable("a", 3, "store down")
    gc.collect()
    gc.disable()
    try:
        ahead = ReadAhead(reader, no_prepare)
        ahead.begin(a, 0)
        settle(reader)
        raised = False
        try:
            ahead.take()
        except RemoteUnavailable:
            raised = True
        ahead.close()
        settle(reader)
        gone = weakref.ref(ahead)
        del ahead
        alive = gone() is not None
    finally:
        gc.enable()
    assert raised and not alive


def test_the_next_copy_located_ahead_is_kept_even_when_the_reader_finished_the_copy_before_it() -> None:
    a, b = FakeCopy("a", 0, 99, 64 * KIB), FakeCopy("b", 100, 199, 64 * KIB)
    reader = FakeReader([a, b], pool_bytes=1 << 20)
    reader.locate_gate.clear()  # the location of b is slow
    ahead = ReadAhead(reader, no_prepare)
    ahead.begin(a, 0)
    ahead.take()
    ahead.pop()  # a is done before b is located
    threading.Timer(0.2, reader.locate_gate.set).start()
    head = ahead.head()  # waits for the location in flight instead of planning nothing
    assert head is not None and head.copy is b and head.start == 0
    ahead.close()


def test_overlapping_copies_continue_at_the_batch_holding_the_first_offset_not_read() -> None:
    a, b = FakeCopy("a", 0, 99, 128 * KIB), FakeCopy("b", 50, 199, 256 * KIB)  # b repeats 50..99
    reader = FakeReader([a, b], pool_bytes=1 << 20)
    ahead = ReadAhead(reader, no_prepare)
    ahead.begin(a, 0)
    taken = walk(ahead)
    first_of_b = next(t for t in taken if t[0] == "b")
    assert first_of_b[1] == b.position_for(100) > 0


def test_windows_dropped_while_downloading_give_their_bytes_back_when_the_download_ends() -> None:
    a = FakeCopy("a", 0, 99, 512 * KIB)
    reader = FakeReader([a], pool_bytes=1 << 20, ahead=4)
    reader.gate.clear()  # downloads hang
    ahead = ReadAhead(reader, no_prepare)
    ahead.begin(a, 0)
    assert reader.pool.used > 0
    ahead.close()
    reader.gate.set()
    settle(reader)
    assert reader.pool.used == 0


def test_a_window_prepare_finds_damaged_leaves_the_disk_cache_and_the_error_is_the_readers() -> None:
    a = FakeCopy("a", 0, 99, 128 * KIB)
    reader = FakeReader([a], pool_bytes=1 << 20)

    def corrupt(copy: FakeCopy, data: bytes, start: int) -> tuple[None, int]:
        raise RemoteDataCorrupt(copy.log_key, start, "CRC-32C mismatch")

    ahead = ReadAhead(reader, corrupt)
    ahead.begin(a, 0)
    settle(reader)
    with pytest.raises(RemoteDataCorrupt, match="CRC-32C mismatch"):
        ahead.take()
    assert "a" in reader.damaged_keys  # its windows leave the disk cache: a repaired object is read again
    ahead.close()
    settle(reader)
    assert reader.pool.used == 0


def test_a_corrupt_batch_found_ahead_by_the_stream_leaves_its_window_in_no_reference_cycle() -> None:
    """The TieredConsumer's stream checks each batch on the download thread and keeps what the check found for the
    decoder. With the cyclic garbage collector off, a batch whose CRC-32C does not match leaves the window's bytes
    (which the checking frame held) to reference counting once the decoder has raised it as RemoteDataCorrupt
    naming the key and the position: the error kept is not one whose traceback holds that frame."""
    from reader.stream import PartitionStream, _Decoding
    from tests.kafka_encoder import encode_batch

    class Window(bytearray):  # the window's bytes, with a weak reference to see when they are freed
        pass

    good = encode_batch(0, [(b"k", b"v" * 100, [])])
    bad = bytearray(encode_batch(1, [(b"k", b"w" * 100, [])]))
    bad[-1] ^= 0xFF  # the last record byte: its CRC-32C no longer matches
    data = Window(good + bytes(bad))
    copy = FakeCopy("t/0/copy.log", 0, 1, len(data))
    reader = FakeReader([copy], pool_bytes=1 << 20)
    stream = PartitionStream(reader, "t", 0, 0)  # type: ignore[arg-type]
    gc.collect()
    gc.disable()
    try:
        prepared, _ = stream._prepare(copy, data, 0)  # type: ignore[arg-type]
        assert prepared is not None and isinstance(prepared.payloads[0], bytes)
        window = SimpleNamespace(copy=copy, data=data, start=0)
        cur = _Decoding(window, data, len(data), 0, prepared.headers, prepared.payloads)  # type: ignore[arg-type]
        with pytest.raises(RemoteDataCorrupt, match=r"t/0/copy\.log.*CRC") as caught:
            stream._slicing(cur, 1, prepared.headers[1])
        assert caught.value.position == len(good)
        del caught, cur, prepared, window
        gone = weakref.ref(data)
        del data
        alive = gone() is not None
    finally:
        gc.enable()
        stream.close()
        reader.executor.shutdown()
    assert not alive, "the window's bytes are held by a reference cycle"
