"""Whole record batches from the remote copies, read ahead: what the access layer's Fetch answers and the HTTP
service's pages are made of (the batches as Kafka wrote them, never decoded).

A ``BatchCursor`` reads one partition sequentially from an offset over the read core every sequential remote
reader shares (``reader/readahead.py``: the same batch-aligned windows as every other reader, paid for in the
memory pool before each GET, up to ``prefetch_windows`` downloaded ahead, the next copy located ahead). A
read hands out the batches of the head window from the fetch offset on, about ``max_bytes`` of them (at least
one batch, as Kafka's fetch), as the bytes Kafka wrote: nothing is decoded or re-encoded. Every batch's
CRC-32C is checked and its offsets must lie inside the copy and grow, on the thread that downloaded the window.

``CursorCache`` keeps cursors between a client's fetches, keyed by the topic's id, the partition and the
offset each continues at (a topic deleted and created again under its name is another id), so a
client's next fetch finds its read-ahead ready; several clients reading one partition at different
offsets get a cursor each. Cursors are caches: evicting one only costs read-ahead.

Read-ahead is best effort. Every downloaded window a cursor holds while no read is using it (the windows
ahead, and the head window between two fetches: ``ReadAhead.park``) is evictable in the memory pool, so
another partition's read needed now takes that room back instead of waiting for a fetch that may never come
(one consumer's twelve cursors once held the whole pool while its thirteenth partition waited). A read
waits at most ``memory_wait`` seconds for room (``MemoryBusy``). The served batches are a view of the
window's bytes, not a copy (a 1 MiB copy, about 0.13 ms timed alone, was about a third of a read): a window
popped or evicted while an answer still holds a view stays alive until the answer is sent, and that memory is the
connection's answer budget's (``reader/proxy/budget.py`` counts an answer's records before it is read), so
memory stays within the pool plus the answer budget. Window bytes are immutable ``bytes``: a view never sees
them change.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

from reader.batches import checked_window
from reader.errors import MemoryBusy, WouldBlock
from reader.readahead import ReadAhead, Window
from reader.remote import RemoteReader
from reader.segments import SegmentCopy
from reader.txn import TxnView
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


class BatchCursor:
    """One partition from ``position`` on, over its ``ReadAhead`` windows. One caller at a time (the cache hands
    it out exclusively)."""

    def __init__(self, reader: RemoteReader, topic: str, topic_id: str, partition: int, position: int,
                 memory_wait: float) -> None:  # fmt: skip
        self.reader = reader
        self.topic, self.topic_id, self.partition = topic, topic_id, partition
        self.position = position
        self.copy: SegmentCopy | None = None
        self.txns: TxnView | None = None
        self.windows = ReadAhead(reader, _checked_batches, memory_wait)
        self.head: Window | None = None  # the taken head window
        self.next_batch = 0

    def read(self, max_bytes: int, read_committed: bool, min_one: bool = True,
             decided: Outcomes | None = None, block: bool = True) -> ServedBatches:  # fmt: skip
        """Batches from ``position``, at most ``max_bytes`` of them, except one larger batch when ``min_one``
        (Kafka's rule for the first partition with data in an answer; without it such a batch waits for the
        next fetch). ``decided``: outcomes the broker gave of transactions the remote data leaves open
        (``TieredView.learn_outcomes``). Raises NotInRemote at the remote end (the broker has the rest),
        OffsetOutOfRange below the remote start, and the store's read errors (nothing is skipped: the next read
        retries at the same offset); MemoryBusy leaves the cursor as it was. Without ``block``, only what is
        in memory now is read: WouldBlock where the read would wait (nothing served, the position unchanged)."""
        if self.head is not None and not self.windows.unpark():  # evicted between fetches: taken again
            self.head, self.next_batch = None, 0
        try:
            return self._read(max_bytes, read_committed, min_one, decided, block)
        except (MemoryBusy, WouldBlock):
            raise
        except BaseException:
            self.close()  # planned afresh from ``position`` next time
            raise
        finally:
            self.windows.park()  # between fetches the head window is read-ahead too: evictable

    def _read(self, max_bytes: int, read_committed: bool, min_one: bool, decided: Outcomes | None,
              block: bool) -> ServedBatches:  # fmt: skip
        """One window's batches; where they use the window up with room left in ``max_bytes`` and the next
        window of the same copy is already downloaded, the batches of it that fit too (joined: the only copy
        of served bytes). Otherwise a 4 MiB window served in 1 MiB answers ends in a short answer every time,
        a round trip per window more for the client."""
        served = self._window_batches(max_bytes, read_committed, min_one, decided, block)
        room = max_bytes - len(served.data)
        head = self.head
        if not served.data or room <= 0 or head is None or self.next_batch < len(head.prepared):
            return served
        if not self.windows.next_ready(head.copy):
            return served
        try:
            more = self._window_batches(room, read_committed, False, decided, False)
        except WouldBlock:  # evicted meanwhile: the next read takes it
            return served
        if not more.data:
            return served
        aborted = served.aborted + [a for a in more.aborted if a not in served.aborted]
        return ServedBatches(b"".join((served.data, more.data)), aborted, more.next_offset, key=served.key)

    def _window_batches(self, max_bytes: int, read_committed: bool, min_one: bool, decided: Outcomes | None,
                        block: bool) -> ServedBatches:  # fmt: skip
        while True:
            if self.head is None:
                self._next_window(block)
            head = self.head
            assert self.copy is not None and head is not None and head.data is not None
            headers: list[BatchHeader] = head.prepared
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
                self.windows.pop()
                self.head, self.next_batch = None, 0
                continue
            chosen = headers[i:j]
            if read_committed:
                if self.txns is None and not block:
                    raise WouldBlock(f"the transaction index of {self.copy.log_key} is not read yet")
                chosen = self._resolved(chosen, decided)
                if not chosen:
                    assert self.txns is not None
                    undecided = dict(self.txns.unresolved)
                    self.txns = None  # asked again next time: the outcome may have been copied meanwhile
                    return ServedBatches(b"", [], self.position, undecided=undecided)
                j = i + len(chosen)
            first, last = chosen[0], chosen[-1]
            records = memoryview(head.data)[first.position : last.position + last.size]  # see the docstring
            aborted = []
            if read_committed and self.txns is not None:
                aborted = [a for a in self.txns.aborted
                           if a.last_offset >= self.position and a.first_offset <= last.last_offset]  # fmt: skip
            self.next_batch = j
            self.position = last.last_offset + 1
            self.windows.fill()
            return ServedBatches(records, aborted, self.position, key=self.copy.log_key)

    def _next_window(self, block: bool) -> None:
        """Take the head window (the next copy's first, located ahead or now, when this copy is done)."""
        if self.windows.head(block) is None:
            if not block:
                raise WouldBlock(f"no copy of {self.topic}-{self.partition} located at offset {self.position}")
            copy = self.reader.locate(self.topic, self.partition, self.position, self.topic_id)
            self.windows.begin(copy, copy.position_for(max(self.position, copy.base_offset)))
        head = self.windows.take(block)
        if head.copy is not self.copy:  # into the next copy
            self.copy, self.txns = head.copy, None
            self.position = max(self.position, head.copy.base_offset)
        self.head, self.next_batch = head, 0
        self.windows.fill()

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

    def close(self) -> None:
        """Free the pool room of every window (read-ahead still downloading gives it back when it ends)."""
        self.windows.clear()
        self.head, self.next_batch = None, 0
        self.copy = None


def _checked_batches(copy: SegmentCopy, data: bytes, start: int) -> tuple[list[BatchHeader], int]:
    """A window's batches (on the thread that downloaded it): whole, offsets inside the copy and growing, each
    batch's CRC-32C checked. Its headers are all it keeps beside the bytes."""
    return checked_window(copy.log_key, data, start, copy.base_offset, copy.end_offset, -1), 0


class CursorCache:
    """Cursors by ``(topic id, partition, next offset)``, least recently used evicted past ``capacity``."""

    def __init__(self, reader: RemoteReader, capacity: int, memory_wait: float) -> None:
        self.reader = reader
        self.capacity = capacity
        self.memory_wait = memory_wait
        self.lock = threading.Lock()
        self.cursors: OrderedDict[tuple[str, int, int], BatchCursor] = OrderedDict()

    def read(self, topic: str, topic_id: str, partition: int, offset: int, max_bytes: int,
             read_committed: bool, min_one: bool = True, decided: Outcomes | None = None,
             block: bool = True) -> ServedBatches:  # fmt: skip
        """``BatchCursor.read`` on the cursor of this incarnation of the topic that continues at ``offset`` (a
        new one if none does)."""
        with self.lock:
            cursor = self.cursors.pop((topic_id, partition, offset), None)
        if cursor is None:
            if not block:
                raise WouldBlock(f"no read of {topic}-{partition} continues at offset {offset}")
            cursor = BatchCursor(self.reader, topic, topic_id, partition, offset, self.memory_wait)
        try:
            served = cursor.read(max_bytes, read_committed, min_one, decided, block)  # an error closes the cursor
        except WouldBlock:
            self._keep(cursor)  # as it was: the read waits for it elsewhere
            raise
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
