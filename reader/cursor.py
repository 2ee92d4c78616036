"""Whole record batches from the remote copies, read ahead: what the access layer's Fetch answers and the HTTP
service's pages are made of (the batches as Kafka wrote them, never decoded).

A ``BatchCursor`` reads one partition sequentially from an offset: the copy's ``.log`` in the same
windows as every other remote reader (``reader.windows.windows_from``: batch-aligned ranges of about
``fetch_window_bytes``, the keys of the disk cache and what the hot-data preloader warms), paid for in
the memory pool before each GET, with up to ``prefetch_windows`` windows downloaded ahead on the
reader's download threads. A read hands out the batches of the head window from the fetch offset on,
about ``max_bytes`` of them (at least one batch, as Kafka's fetch), as the bytes Kafka wrote: nothing is
decoded or re-encoded, every batch's CRC-32C is checked and offsets must lie inside the copy and grow.

``CursorCache`` keeps cursors between a client's fetches, keyed by the topic's id, the partition and the
offset each continues at (a topic deleted and created again under its name is another id), so a
client's next fetch finds its read-ahead ready; several clients reading one partition at different
offsets get a cursor each. Cursors are caches: evicting one only costs read-ahead.

Read-ahead is best effort. Every downloaded window a cursor holds while no read is using it (the windows
ahead, and the head window between two fetches) is marked evictable in the memory pool, so another
partition's read needed now takes that room back instead of waiting for a fetch that may never come
(one consumer's twelve cursors once held the whole pool while its thirteenth partition waited). A read
waits at most ``memory_wait`` seconds for room (``MemoryBusy``); the served batches are copied out of the
window, so the window's pool bytes are all the memory it holds and an answer's records are the
connection's to account for (``reader/proxy/budget.py``).
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass

from reader.batches import check_offsets, complete_prefix, scanned_headers
from reader.errors import MemoryBusy, RemoteDataCorrupt
from reader.remote import RemoteReader, verify_crcs
from reader.segments import SegmentCopy
from reader.txn import TxnView
from reader.windows import continued_in, windows_from
from tiering_core.formats import AbortedTxn, BatchHeader

_BEYOND = (1 << 63) - 1  # the last offset of an aborted transaction whose marker only the broker has


# What the broker said of transactions the remote data leaves open: (producer id, first offset) -> aborted
Outcomes = Mapping[tuple[int, int], bool]


def settled(view: TxnView, decided: Outcomes) -> TxnView:
    """``view`` with the open transactions the broker decided resolved: an aborted one becomes an aborted
    transaction reaching past the remote data (its marker is the broker's), a committed one is just kept."""
    aborted, unresolved = list(view.aborted), {}
    for producer_id, first in view.unresolved.items():
        outcome = decided.get((producer_id, first))
        if outcome is None:
            unresolved[producer_id] = first
        elif outcome:
            aborted.append(AbortedTxn(0, producer_id, first, _BEYOND, -1))
    return TxnView(sorted(aborted, key=lambda a: a.first_offset), unresolved)


@dataclass(frozen=True, slots=True)
class ServedBatches:
    """Batches for one partition of a Fetch answer: ``data`` whole batches (possibly empty), the aborted
    transactions overlapping them (read_committed), and where the next fetch continues."""

    data: bytes | memoryview
    aborted: list[AbortedTxn]
    next_offset: int
    # read_committed stopped at transactions whose outcome is not remote yet: producer id -> first offset
    undecided: Mapping[int, int] | None = None
    key: str = ""  # the .log object the batches come from (errors decoding them name it)


class _Window:
    """``future``, ``reserved`` and ``taken`` change under the pool's lock (``MemoryPool.cond``): the pool
    evicts windows from other threads."""

    __slots__ = ("copy", "end", "future", "reserved", "start", "taken")

    def __init__(self, copy: SegmentCopy, start: int, end: int) -> None:
        self.copy, self.start, self.end = copy, start, end
        self.future: Future[bytes] | None = None
        self.reserved = 0
        self.taken = False  # the head window while a read uses it: not evictable


class BatchCursor:
    """One partition from ``position`` on. One caller at a time (the cache hands it out exclusively); the
    next copy is located ahead on a download thread, so a copy's end costs no wait (KIP-1003's idea)."""

    def __init__(self, reader: RemoteReader, topic: str, topic_id: str, partition: int, position: int,
                 memory_wait: float) -> None:  # fmt: skip
        self.reader = reader
        self.pool = reader.pool
        self.memory_wait = memory_wait
        self.topic, self.topic_id, self.partition = topic, topic_id, partition
        self.position = position
        self.copy: SegmentCopy | None = None
        self.txns: TxnView | None = None
        self.lock = threading.Lock()  # the windows: the caller and the planning of the next copy
        self.windows: deque[_Window] = deque()
        self.next_job: Future[None] | None = None
        self.after: SegmentCopy | None = None  # the copy whose next one was located ahead
        self.data: bytes | None = None  # the head window's bytes, once taken
        self.headers: list[BatchHeader] = []
        self.next_batch = 0

    def read(self, max_bytes: int, read_committed: bool, min_one: bool = True,
             decided: Outcomes | None = None) -> ServedBatches:  # fmt: skip
        """Batches from ``position``, at most ``max_bytes`` of them, except one larger batch when ``min_one``
        (Kafka's rule for the first partition with data in an answer; without it such a batch waits for the
        next fetch). ``decided``: outcomes the broker gave of transactions the remote data leaves open
        (``TieredView.learn_outcomes``). Raises NotInRemote at the remote end (the broker has the rest),
        OffsetOutOfRange below the remote start, and the store's read errors (nothing is skipped: the next read
        retries at the same offset); MemoryBusy leaves the cursor as it was."""
        head = self._hold_head()
        try:
            return self._read(max_bytes, read_committed, min_one, decided)
        except MemoryBusy:
            raise
        except BaseException:
            self.close()  # planned afresh from ``position`` next time
            raise
        finally:
            self._idle_head(head)

    # -- what the pool may take back --------------------------------------------------------------
    def _hold_head(self) -> _Window | None:
        """The head window, no longer evictable while this read uses it (its data may have been evicted
        between fetches: ``_read`` then downloads it again)."""
        with self.pool.cond:
            head = self.windows[0] if self.windows else None
            if head is not None:
                self.pool.unmark(id(head))
                head.taken = self.data is not None
            return head

    def _idle_head(self, before: _Window | None) -> None:
        """Between fetches the head window's data is read-ahead too: evictable."""
        with self.pool.cond:
            if before is not None:
                before.taken = False
            head = self.windows[0] if self.windows else None
            if head is not None and self.data is not None and head.reserved:
                head.taken = False
                self.pool.mark_evictable(id(head), head.reserved, lambda: self._evict_head(head))

    def _evict_head(self, w: _Window) -> bool:
        """Called by the pool (its lock held): drop the idle head window's data; the next read gets it again."""
        if w.taken or not self.windows or self.windows[0] is not w:
            return False
        self.data, self.headers, self.next_batch = None, [], 0
        w.future = None
        self._give_back(w)
        return True

    def _evict_ahead(self, w: _Window) -> bool:
        """Called by the pool (its lock held): drop a downloaded read-ahead window that no read uses."""
        if w.taken or w.future is None or not w.future.done():
            return False
        w.future = None
        self._give_back(w)
        return True

    def _downloaded(self, w: _Window) -> None:
        """A read-ahead download ended (on a download thread): its window may now be evicted."""
        with self.pool.cond:
            if w.reserved and not w.taken:
                self.pool.mark_evictable(id(w), w.reserved, lambda: self._evict_ahead(w))

    def _give_back(self, w: _Window) -> None:
        if w.reserved:
            self.pool.release(w.reserved)
            w.reserved = 0

    def _read(self, max_bytes: int, read_committed: bool, min_one: bool, decided: Outcomes | None) -> ServedBatches:
        while True:
            if self.data is None:
                self._next_window()
            assert self.copy is not None and self.data is not None
            headers = self.headers
            i = self.next_batch
            while i < len(headers) and headers[i].last_offset < self.position:
                i += 1
            j, size = i, 0
            while j < len(headers) and ((j == i and min_one) or size + headers[j].size <= max_bytes):
                size += headers[j].size
                j += 1
            if i == j < len(headers):  # the next batch is larger than the room left
                return ServedBatches(b"", [], self.position)
            if i == j:  # the window is used up
                self._drop_head()
                continue
            chosen = headers[i:j]
            if read_committed:
                chosen = self._resolved(chosen, decided)
                if not chosen:
                    assert self.txns is not None
                    undecided = dict(self.txns.unresolved)
                    self.txns = None  # asked again next time: the outcome may have been copied meanwhile
                    return ServedBatches(b"", [], self.position, undecided=undecided)
                j = i + len(chosen)
            first, last = chosen[0], chosen[-1]
            records = bytes(memoryview(self.data)[first.position : last.position + last.size])  # see the docstring
            aborted = []
            if read_committed and self.txns is not None:
                aborted = [a for a in self.txns.aborted
                           if a.last_offset >= self.position and a.first_offset <= last.last_offset]  # fmt: skip
            self.next_batch = j
            self.position = last.last_offset + 1
            self._fill()
            return ServedBatches(records, aborted, self.position, key=self.copy.log_key)

    def _next_window(self) -> None:
        """Take the head window (the next copy's first, located ahead or now, when this copy is done)."""
        if not self.windows and self.next_job is not None:
            self.next_job.result()  # the next copy, being located ahead
            self.next_job = None
        if not self.windows:
            self._begin(self.reader.locate(self.topic, self.partition, self.position, self.topic_id))
        head = self.windows[0]
        if head.copy is not self.copy:  # into the next copy
            self.copy, self.txns = head.copy, None
            self.position = max(self.position, head.copy.base_offset)
        self._take_head()

    def _resolved(self, chosen: list[BatchHeader], decided: Outcomes | None) -> list[BatchHeader]:
        """The batches before the first one of a transaction whose outcome is beyond the remote data and not
        among those ``decided``."""
        if self.txns is None:
            assert self.copy is not None
            self.txns = self.reader.transactions(self.copy)
        if self.txns.unresolved and decided:
            self.txns = settled(self.txns, decided)
        unresolved = self.txns.unresolved
        if not unresolved:
            return chosen
        for k, h in enumerate(chosen):
            first = unresolved.get(h.producer_id) if h.is_transactional else None
            if first is not None and h.last_offset >= first:
                return chosen[:k]
        return chosen

    # -- windows --------------------------------------------------------------------------------
    def _begin(self, copy: SegmentCopy) -> None:
        self.close()
        self.copy, self.txns = copy, None
        self.position = max(self.position, copy.base_offset)
        self._plan(copy, copy.position_for(self.position))
        self._fill()

    def _plan(self, copy: SegmentCopy, start: int) -> None:
        planned = windows_from(copy, start, self.reader.settings.fetch_window_bytes)
        with self.lock:
            self.windows.extend(_Window(copy, w.start, w.end) for w in planned)
        self.after = None

    def _fill(self) -> None:
        """Start downloads of the next windows into free pool room (read-ahead never waits for room); when
        the last copy planned is all scheduled, locate the one after it."""
        ahead = self.reader.settings.prefetch_windows
        with self.lock:
            planned = list(self.windows)[: ahead + 1]
            tail = self.windows[-1] if self.windows else None
        for w in planned:
            with self.pool.cond:
                if w.future is not None or w.taken:
                    continue
                if not self.pool.try_reserve(w.end - w.start):
                    break
                w.reserved = w.end - w.start
                w.future = future = self.reader.executor.submit(self.reader.read_or_gone, w.copy, w.start, w.end,
                                                                cacheable=True)  # fmt: skip
            future.add_done_callback(lambda _, w=w: self._downloaded(w))  # type: ignore[misc]
        if tail is not None and tail.end >= tail.copy.size and len(planned) <= ahead and tail.copy is not self.after:
            self.after = tail.copy  # once per copy: at the remote end there is no next one to find
            self.next_job = self.reader.executor.submit(self._plan_next, tail.copy)

    def _plan_next(self, copy: SegmentCopy) -> None:
        """On a download thread: locate the copy after ``copy`` and plan its windows (from the first offset
        after ``copy``: overlapping copies after a leader change start below it)."""
        try:
            following = self.reader.next_copy(copy)
        except Exception:  # read-ahead only: the caller locates it again itself when it gets there
            return
        if following is None:
            return
        windows = continued_in(following, copy, self.reader.settings.fetch_window_bytes)
        with self.lock:
            if self.windows and self.windows[-1].copy is copy:  # not closed or moved meanwhile
                self.windows.extend(_Window(following, w.start, w.end) for w in windows)

    def _take_head(self) -> None:
        """The head window's bytes: read ahead, else downloaded now into room the pool makes by evicting
        read-ahead, waiting at most ``memory_wait`` for it."""
        w = self.windows[0]
        with self.pool.cond:
            self.pool.unmark(id(w))
            w.taken = True
            future = w.future
        if future is None:
            size = w.end - w.start
            if not self.pool.reserve(size, self.memory_wait):
                with self.pool.cond:
                    w.taken = False
                raise MemoryBusy(f"no room in the memory pool for {size} bytes of {w.copy.log_key} within "
                                 f"{self.memory_wait}s")  # fmt: skip
            with self.pool.cond:
                w.reserved = size
            w.future = future = self.reader.executor.submit(self.reader.read_or_gone, w.copy, w.start, w.end,
                                                            cacheable=True)  # fmt: skip
        data = future.result()
        copy = w.copy
        key = copy.log_key
        try:
            whole = complete_prefix(key, data, w.start)
            if whole != len(data):
                raise RemoteDataCorrupt(key, w.start + whole, "a window of the object ends inside a batch")
            headers = scanned_headers(key, data, w.start)
            check_offsets(key, headers, w.start, copy.base_offset, copy.end_offset, -1)
            verify_crcs(key, data, headers, w.start)
        except RemoteDataCorrupt:
            self.reader.damaged(key)
            raise
        self.data, self.headers, self.next_batch = data, headers, 0

    def _drop_head(self) -> None:
        with self.lock:
            w = self.windows.popleft()
        self._release(w)
        self.data, self.headers, self.next_batch = None, [], 0

    def _release(self, w: _Window) -> None:
        with self.pool.cond:
            self.pool.unmark(id(w))
            if w.future is not None and not w.future.done():
                w.future.cancel()
            w.taken = False
            self._give_back(w)

    def close(self) -> None:
        """Free the pool room of every window (read-ahead still downloading is abandoned)."""
        with self.lock:
            windows, self.windows = list(self.windows), deque()
        for w in windows:
            self._release(w)
        self.data, self.headers, self.next_batch = None, [], 0
        self.copy = None


class CursorCache:
    """Cursors by ``(topic id, partition, next offset)``, least recently used evicted past ``capacity``."""

    def __init__(self, reader: RemoteReader, capacity: int, memory_wait: float) -> None:
        self.reader = reader
        self.capacity = capacity
        self.memory_wait = memory_wait
        self.lock = threading.Lock()
        self.cursors: OrderedDict[tuple[str, int, int], BatchCursor] = OrderedDict()

    def read(self, topic: str, topic_id: str, partition: int, offset: int, max_bytes: int,
             read_committed: bool, min_one: bool = True, decided: Outcomes | None = None) -> ServedBatches:  # fmt: skip
        """``BatchCursor.read`` on the cursor of this incarnation of the topic that continues at ``offset`` (a
        new one if none does)."""
        with self.lock:
            cursor = self.cursors.pop((topic_id, partition, offset), None)
        if cursor is None:
            cursor = BatchCursor(self.reader, topic, topic_id, partition, offset, self.memory_wait)
        served = cursor.read(max_bytes, read_committed, min_one, decided)  # on an error the cursor closes itself
        self._keep(cursor)
        return served

    def _keep(self, cursor: BatchCursor) -> None:
        evicted = []
        with self.lock:
            key = (cursor.topic_id, cursor.partition, cursor.position)
            old = self.cursors.pop(key, None)
            if old is not None:
                evicted.append(old)
            self.cursors[key] = cursor
            while len(self.cursors) > self.capacity:
                evicted.append(self.cursors.popitem(last=False)[1])
        for c in evicted:
            c.close()

    def drop(self, topic_id: str) -> None:
        """Close the cursors of a topic id (a deleted incarnation: their read-ahead holds pool room)."""
        with self.lock:
            gone = [key for key in self.cursors if key[0] == topic_id]
            cursors = [self.cursors.pop(key) for key in gone]
        for c in cursors:
            c.close()

    def close(self) -> None:
        with self.lock:
            cursors, self.cursors = list(self.cursors.values()), OrderedDict()
        for c in cursors:
            c.close()
