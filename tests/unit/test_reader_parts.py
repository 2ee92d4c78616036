"""The reader's pure parts: memory pool, read_committed filter, disk cache, batch checks, messages."""

from __future__ import annotations

import itertools
import struct
import threading
from array import array
from pathlib import Path

import pytest
from confluent_kafka import TIMESTAMP_CREATE_TIME
from hypothesis import given
from hypothesis import strategies as st

from reader.batches import checked_headers, complete_prefix
from reader.disk_cache import DiskCache
from reader.errors import RemoteDataCorrupt
from reader.messages import TieredMessage, message_class
from reader.pool import MemoryPool
from reader.spark.slices import decode_slice
from reader.txn import AbortFilter, TxnView
from reader.windows import windows_from
from tests.decoders import slice_over
from tests.kafka_consumer_model import consumer_kept
from tests.kafka_encoder import encode_batch, sample_records
from tiering_core.formats import AbortedTxn, decode_batch, scan_headers

TXN, CONTROL = 0x10, 0x20


def control(offset: int, pid: int, kind: int) -> bytes:
    key = struct.pack(">hh", 0, kind)  # version 0, 0 = ABORT, 1 = COMMIT
    value = struct.pack(">hi", 0, 3)
    return encode_batch(offset, [(key, value, [])], attributes_extra=TXN | CONTROL, producer_id=pid)


def data(offset: int, n: int, pid: int = -1) -> bytes:
    return encode_batch(offset, sample_records(n, offset), attributes_extra=TXN if pid >= 0 else 0, producer_id=pid)


def kept(view: TxnView, start: int, log: bytes) -> list[int]:
    f = AbortFilter(view, start)
    return [h.base_offset for h in scan_headers("log", log) if h.last_offset >= start and f.keep(h)]


def test_aborted_transaction_and_its_marker_are_dropped_like_the_broker_does() -> None:
    log = data(0, 10) + data(10, 3, pid=7) + data(13, 2, pid=8) + control(15, 7, 0) + data(16, 2, pid=7) + control(
        18, 7, 1) + control(19, 8, 1) + data(20, 4)  # fmt: skip
    view = TxnView([AbortedTxn(0, 7, 10, 15, 15)], {})
    assert kept(view, 0, log) == [0, 13, 16, 20]  # 7's aborted batch and every control batch are gone
    assert kept(view, 16, log) == [16, 20]  # an abort that ended before the start does not linger
    assert kept(TxnView([], {}), 0, log) == [0, 10, 13, 16, 20]  # read_uncommitted-like: only markers dropped


@given(st.lists(st.tuples(st.integers(0, 3), st.sampled_from(["data", "data", "commit", "abort"])), max_size=60))
def test_every_reader_drops_the_batches_kafkas_consumer_drops(ops: list[tuple[int, str]]) -> None:
    """The one abort rule (reader/txn.py ``AbortedRanges``) against Kafka's consumer walk, through the
    TieredConsumer's / HTTP service's / access layer's ``AbortFilter`` and the Spark source's slice reader,
    on interleaved transactions of three producers (3 = no producer) committed and aborted in any order."""
    log, aborted, first, offset = b"", [], {}, 0
    for producer, op in [*ops, *((p, "commit") for p in range(3))]:
        pid = 100 + producer if producer < 3 else -1
        if op == "data":
            log += data(offset, 2, pid)
            first.setdefault(pid, offset)
            offset += 2
        elif pid in first:
            log += control(offset, pid, 0 if op == "abort" else 1)
            if op == "abort":
                aborted.append(AbortedTxn(0, pid, first[pid], offset, offset))
            del first[pid]
            offset += 1
    want = [b.header.base_offset for b in consumer_kept("log", log, aborted)]
    assert kept(TxnView(aborted, {}), 0, log) == want
    ranges = tuple((a.producer_id, a.first_offset, a.last_offset) for a in aborted)
    part = slice_over(log, 0, max(offset - 1, 0), ranges)
    rows = [o for b in decode_slice(part, [(log, 0)]) for o in b.column("offset").to_pylist()] if log else []
    assert rows == [o for base in want for o in (base, base + 1)]  # each data batch holds two records


def test_unresolved_transaction_is_reported_from_its_first_offset() -> None:
    f = AbortFilter(TxnView([], {9: 20}), 0)
    early, late, plain = (next(scan_headers("x", b)) for b in (data(10, 2, pid=9), data(20, 2, pid=9), data(30, 1)))
    assert not f.unresolved_at(early) and f.unresolved_at(late) and not f.unresolved_at(plain)


def test_memory_pool_caps_bytes_and_evicts_read_ahead_for_demand() -> None:
    pool = MemoryPool(100)
    assert pool.try_reserve(60) and not pool.try_reserve(50)
    evicted = []

    def evict() -> bool:
        evicted.append(1)
        pool.release(60)
        return True

    pool.mark_evictable(1, 60, evict)
    assert pool.reserve(80, timeout=1) and evicted == [1] and pool.used == 80
    assert not pool.reserve(30, timeout=0.05)  # nothing evictable: waits, then gives up
    threading.Timer(0.05, pool.release, args=(80,)).start()
    assert pool.reserve(30, timeout=5) and pool.peak == 80
    with pytest.raises(ValueError):
        pool.reserve(101)


def test_disk_cache_round_trip_eviction_and_damage(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path, 2 * 1028)
    cache.put("k", 0, 1023, b"a" * 1024)
    cache.put("k", 1024, 2047, b"b" * 1024)
    assert cache.get("k", 0, 1023) == b"a" * 1024  # now the most recently used
    cache.put("k", 2048, 3071, b"c" * 1024)
    assert cache.get("k", 1024, 2047) is None and cache.get("k", 0, 1023) == b"a" * 1024
    again = DiskCache(tmp_path, 2 * 1028)
    assert again.get("k", 2048, 3071) == b"c" * 1024
    (entry,) = [p for p in tmp_path.glob("*.win") if p.read_bytes()[4:5] == b"c"]
    entry.write_bytes(entry.read_bytes()[:-1] + b"X")
    assert again.get("k", 2048, 3071) is None and not entry.exists()


def test_a_damaged_object_leaves_the_disk_cache_whole(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path, 1 << 20)
    for start in (0, 1024):
        cache.put("damaged", start, start + 1023, b"d" * 1024)
    cache.put("other", 0, 1023, b"o" * 1024)
    cache.discard("damaged")
    assert cache.get("damaged", 0, 1023) is None and cache.get("damaged", 1024, 2047) is None
    assert cache.get("other", 0, 1023) == b"o" * 1024 and cache.size == 1028
    assert sorted(p.name for p in tmp_path.glob("*.win")) == [DiskCache._name("other", 0, 1023)]


def test_batch_checks_name_the_key_and_position() -> None:
    log = data(100, 3) + data(103, 2)
    assert complete_prefix("key", log + log[:20], 0) == len(log)
    broken = bytearray(log)
    broken[8:12] = (5).to_bytes(4, "big")
    with pytest.raises(RemoteDataCorrupt, match="key at byte 1000: batch length 5"):
        complete_prefix("key", bytes(broken), 1000)
    with pytest.raises(RemoteDataCorrupt, match="out of order or outside"):
        checked_headers("key", data(103, 2) + data(100, 3), 0, 100, 104, -1)
    with pytest.raises(RemoteDataCorrupt, match=r"outside the copy's 100\.\.103"):
        checked_headers("key", log, 0, 100, 103, -1)


class _Copy:
    """What ``windows_from`` reads of a SegmentCopy: the .log's size and the offset index's positions."""

    def __init__(self, size: int, positions: list[int]) -> None:
        self.size, self.index_positions = size, array("q", positions)


@given(st.integers(2, 20_000).flatmap(lambda size: st.tuples(
    st.just(size), st.lists(st.integers(1, size - 1), unique=True, max_size=60).map(sorted),
    st.integers(16, 3000), st.integers(1, 3000))))  # fmt: skip
def test_windows_hold_whole_batches_and_are_the_same_ranges_for_every_reader(case) -> None:
    size, positions, width, first = case
    copy = _Copy(size, positions)
    ranges = {}
    for start in [0, *positions]:
        windows = windows_from(copy, start, width, first)  # type: ignore[arg-type]
        assert windows[0].start == start and windows[-1].end == size
        assert all(a.end == b.start for a, b in itertools.pairwise(windows))
        assert all(w.end > w.start and (w.end == size or w.end in positions) for w in windows)
        ranges[start] = [(w.start, w.end) for w in windows]
    for later in ranges.values():  # from its third window on, a reader starting at any batch start reads
        tail = later[2:]  # the ranges a reader from the object's start reads (the disk cache's keys)
        assert tail == ranges[0][len(ranges[0]) - len(tail) :]


def test_tiered_messages_have_the_consumer_message_interface() -> None:
    raw = data(5, 4)
    header = next(scan_headers("x", raw))
    out = decode_batch("x", raw, header, cls=message_class("orders", 3, header)).records
    expected = sample_records(4, 5)
    assert [m.offset() for m in out] == [5, 6, 7, 8]
    for m, (key, value, headers) in zip(out, expected, strict=True):
        assert isinstance(m, TieredMessage) and m.error() is None
        assert (m.topic(), m.partition(), m.key(), m.value()) == ("orders", 3, key, value)
        assert m.headers() == (headers or None)
        assert m.timestamp()[0] == TIMESTAMP_CREATE_TIME and m.leader_epoch() == 0
        assert len(m) == len(value or b"")
