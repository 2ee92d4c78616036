"""The windows a sequential remote reader walks through a partition, downloaded ahead into the memory pool: the
one read core under the TieredConsumer's stream (``reader/stream.py``, which decodes records) and the cursors of
the access layer and the HTTP service (``reader/cursor.py``, which serve whole batches as Kafka wrote them).

A ``ReadAhead`` holds the planned windows of one reader, in order: the copy's ``.log`` in the ranges every
reader plans (``reader.windows``: batch-aligned, about ``fetch_window_bytes``, the keys of the disk cache), and
when the last window of a copy is scheduled, the next copy located on a download thread and its windows
planned from the batch holding the first offset after it (``continued_in``; KIP-1003's idea: a copy's end
costs no wait). Up to ``prefetch_windows`` windows after the head are downloaded ahead into free pool room
only (``try_reserve``), and each downloaded window no reader uses is evictable, so read-ahead never blocks a
read another partition needs now (``MemoryPool``). The head window a reader needs is downloaded on its own
thread when read-ahead did not get it (or it was evicted), waiting for pool room at most ``memory_wait``
seconds (``MemoryBusy``).

``prepare`` runs on the thread that downloaded a window, before the reader takes it: the stream checks CRCs and
decompresses there (ahead of its decoder, the GIL released in C), the cursors scan and verify their batches.
What it keeps beyond the window's bytes it reserves in the pool itself and reports, so the window's pool bytes
are all the memory a window holds. A download is ``RemoteReader.read_or_gone``: a copy retention deleted
under a reader is OffsetOutOfRange, as the broker answers below its log start.

A window's state changes under the pool's lock (``MemoryPool.cond``), since the pool evicts from other threads:
IDLE (nothing held), LOADING (its bytes reserved, the download running), READY (downloaded, evictable),
TAKEN (the reader's until it pops it or parks it). One reader thread at a time calls ``take``, ``park``,
``pop``, ``begin`` and ``close``; downloads and the location of the next copy run on the reader's threads.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future, wait
from typing import Any

from reader.errors import MemoryBusy, RemoteDataCorrupt, WouldBlock
from reader.remote import RemoteReader
from reader.segments import SegmentCopy
from reader.windows import WindowRange, continued_in, windows_from
from tiering_core.logs import get_logger

log = get_logger(__name__)
IDLE, LOADING, READY, TAKEN = range(4)

# On the downloading thread: (copy, the window's bytes, where they start) -> (what the reader takes with them,
# pool bytes it reserved for that). May raise; the error is the reader's when it takes the window.
Prepare = Callable[[SegmentCopy, bytes, int], tuple[Any, int]]


class Window:
    """Bytes ``[start, end)`` of a copy's ``.log``; once downloaded, the bytes and what ``prepare`` made of them."""

    __slots__ = ("copy", "data", "done", "dropped", "end", "error", "future", "prepared", "reserved", "start",
                 "state")  # fmt: skip

    def __init__(self, copy: SegmentCopy, start: int, end: int) -> None:
        self.copy, self.start, self.end = copy, start, end
        self.data: bytes | None = None
        self.prepared: Any = None
        self.reserved = 0  # pool bytes held: the window's while LOADING, READY or TAKEN, plus what prepare kept
        self.state = IDLE
        self.error: BaseException | None = None  # a read-ahead download's error, raised when the window is taken
        self.dropped = False  # no longer planned: a download still running gives its bytes back when it ends
        self.future: Future[None] | None = None
        self.done = threading.Event()

    @property
    def size(self) -> int:
        return self.end - self.start

    @property
    def last(self) -> bool:
        """The copy's last window."""
        return self.end >= self.copy.size


class ReadAhead:
    def __init__(self, reader: RemoteReader, prepare: Prepare, memory_wait: float | None = None) -> None:
        self.reader = reader
        self.pool = reader.pool
        self.prepare = prepare
        self.memory_wait = memory_wait  # None: a demand read waits for pool room as long as it takes
        self.width = reader.settings.fetch_window_bytes
        self.ahead = reader.settings.prefetch_windows
        self.lock = threading.Lock()  # the planned windows: the reader and the location of the next copy
        self.windows: deque[Window] = deque()
        self.planned_to: SegmentCopy | None = None  # the copy of the last window planned
        self.located_after: SegmentCopy | None = None  # the copy whose next one is being (or was) located
        self.locating: Future[None] | None = None
        self.closed = False

    # -- planning -------------------------------------------------------------------------------
    def begin(self, copy: SegmentCopy, start: int) -> None:
        """Drop every window and plan ``copy``'s from byte ``start`` (a batch boundary)."""
        self.clear()
        self._extend(copy, windows_from(copy, start, self.width))
        self.fill()

    def plan(self, ranges: Iterable[tuple[SegmentCopy, int, int]]) -> None:
        """Drop every window and plan these byte ranges ``(copy, start, end)`` (batch boundaries), in order, and
        nothing after them: a reader of planned ranges (the Spark source's slices). The windows are those every
        reader plans, cut at each range's end, the first one as wide as the others (no first records are
        awaited); read-ahead runs on from one range into the next."""
        self.clear()
        for copy, start, end in ranges:
            planned = windows_from(copy, start, self.width, self.width)
            self._extend(copy, [WindowRange(a, min(b, end)) for a, b in planned if a < end])
        self.located_after = self.planned_to
        self.fill()

    def _extend(self, copy: SegmentCopy, ranges: list[WindowRange], after: SegmentCopy | None = None) -> bool:
        """Plan ``ranges`` of ``copy``; with ``after``, only if the windows planned last are still ``after``'s
        (not begun elsewhere or closed meanwhile; the reader may have taken and popped them all already)."""
        with self.lock:
            if after is not None and (self.closed or self.planned_to is not after):
                return False
            self.windows.extend(Window(copy, r.start, r.end) for r in ranges)
            self.planned_to = copy
            return True

    def fill(self) -> None:
        """Start downloads of the head and the next ``prefetch_windows`` windows into free pool room (in order:
        the first that does not fit stops it); once the last copy planned is all scheduled, locate the next."""
        with self.lock:
            planned = list(self.windows)[: self.ahead + 1]
            tail = self.windows[-1] if self.windows else None
        for w in planned:
            with self.pool.cond:
                if w.state != IDLE or w.error is not None or w.dropped:
                    continue
                if not self.pool.try_reserve(w.size):
                    break
                w.reserved, w.state = w.size, LOADING
                w.done.clear()
                w.future = self.reader.executor.submit(self._download, w)
        if tail is not None and tail.last and len(planned) <= self.ahead and tail.copy is not self.located_after:
            self.located_after = tail.copy  # once per copy: at the remote end there is no next one to find
            self.locating = self.reader.executor.submit(self._locate_after, tail.copy)

    def _locate_after(self, copy: SegmentCopy) -> None:
        """On a download thread: locate the copy after ``copy`` and plan its windows."""
        try:
            following = self.reader.next_copy(copy)
        except Exception as exc:  # read-ahead only: the reader meets the error itself when it gets there
            log.warning("locating the next copy ahead failed", key=copy.log_key, error=str(exc))
            return
        if following is None:
            return
        if self._extend(following, continued_in(following, copy, self.width), after=copy):
            self.fill()

    # -- downloading ----------------------------------------------------------------------------
    def _download(self, w: Window) -> None:
        """A read-ahead download (on a download thread)."""
        try:
            data, prepared, extra = self._fetch(w)
        except BaseException as exc:
            with self.pool.cond:
                w.error, w.state = exc, IDLE
                self._give_back(w)
            w.done.set()
            return
        with self.pool.cond:
            w.reserved += extra
            if w.dropped:
                w.state = IDLE
                self._give_back(w)
            else:
                w.data, w.prepared, w.state = data, prepared, READY
                self.pool.mark_evictable(id(w), w.reserved, lambda: self._evict(w))
        w.done.set()

    def _fetch(self, w: Window) -> tuple[bytes, Any, int]:
        try:
            data = self.reader.read_or_gone(w.copy, w.start, w.end, cacheable=True)
            prepared, extra = self.prepare(w.copy, data, w.start)
        except RemoteDataCorrupt as exc:
            self.reader.damaged(exc.key)  # its windows leave the disk cache: a repaired object is read again
            raise
        return data, prepared, extra

    def _evict(self, w: Window) -> bool:
        """Called by the pool (its lock held): drop a downloaded window no reader uses now."""
        if w.state != READY:
            return False
        w.data, w.prepared, w.state = None, None, IDLE
        self._give_back(w)
        return True

    def _give_back(self, w: Window) -> None:
        """Under the pool's lock: release the window's pool bytes."""
        if w.reserved:
            self.pool.release(w.reserved)
            w.reserved = 0

    # -- the reader's side ----------------------------------------------------------------------
    def head(self, block: bool = True) -> Window | None:
        """The first planned window (the next copy's first, waiting for its location ahead when this copy is
        done); None when nothing is planned: the reader locates the copy it needs and ``begin``s it. Without
        ``block``, WouldBlock where it would wait."""
        job = self.locating
        if not self.windows and job is not None and self.located_after is self.planned_to is not None:
            if not block and not job.done():
                raise WouldBlock("the next copy is being located")
            wait([job])  # its errors are the reader's to meet when it locates the copy itself
        return self.windows[0] if self.windows else None

    def ready(self, timeout: float) -> bool:
        """Whether taking the head window now would not wait for a download in flight (waits up to ``timeout``)."""
        w = self.windows[0]
        return w.state != LOADING or w.done.wait(timeout)

    def next_ready(self, copy: SegmentCopy) -> bool:
        """Whether the window after the head is ``copy``'s and downloaded (a read can go on into it at once)."""
        with self.lock:
            after = self.windows[1] if len(self.windows) > 1 else None
        return after is not None and after.copy is copy and after.state == READY

    def take(self, block: bool = True) -> Window:
        """The head window TAKEN, with its bytes and what ``prepare`` made of them: read ahead, else
        downloaded now into room the pool makes by evicting read-ahead. Raises a read-ahead download's error
        (once: taking again retries), the read's own errors, and MemoryBusy after ``memory_wait`` seconds
        without room (the window is left as it was). Without ``block``, only a window read ahead is taken:
        WouldBlock otherwise (the window is left as it was)."""
        w = self.windows[0]
        while True:
            with self.pool.cond:
                if w.state == READY:
                    self.pool.unmark(id(w))
                    w.state = TAKEN
                    return w
                if not block and w.error is None:
                    raise WouldBlock(f"bytes {w.start}-{w.end} of {w.copy.log_key} are not downloaded yet")
                self.pool.unmark(id(w))
                loading = w.state == LOADING
                error, w.error = w.error, None
            if error is not None:
                try:
                    raise error
                finally:  # this frame, in the error's traceback, must not hold the error: a reference cycle
                    del error
            if not loading:
                break
            w.done.wait()  # READY, failed, or evicted since: look again
        if not self.pool.reserve(w.size, self.memory_wait):
            raise MemoryBusy(f"no room in the memory pool for {w.size} bytes of {w.copy.log_key} within "
                             f"{self.memory_wait}s")  # fmt: skip
        with self.pool.cond:
            w.reserved, w.state = w.size, TAKEN
        try:
            w.data, w.prepared, extra = self._fetch(w)
        except BaseException:
            with self.pool.cond:
                w.state = IDLE
                self._give_back(w)
            raise
        with self.pool.cond:
            w.reserved += extra
        return w

    def park(self) -> None:
        """The taken head window is read-ahead again until ``unpark``: evictable (the cursors between two fetches)."""
        w = self.windows[0] if self.windows else None
        with self.pool.cond:
            if w is not None and w.state == TAKEN and w.data is not None:
                w.state = READY
                self.pool.mark_evictable(id(w), w.reserved, lambda: self._evict(w))

    def unpark(self) -> bool:
        """Take back the parked head window; False if the pool evicted it meanwhile (``take`` downloads it again)."""
        w = self.windows[0] if self.windows else None
        with self.pool.cond:
            if w is None:
                return False
            self.pool.unmark(id(w))
            if w.state == READY:
                w.state = TAKEN
                return True
            return False

    def pop(self) -> None:
        """Done with the head window: its pool bytes are free."""
        with self.lock:
            w = self.windows.popleft()
        self._drop(w)

    def _drop(self, w: Window) -> None:
        with self.pool.cond:
            w.dropped = True
            self.pool.unmark(id(w))
            if w.state == LOADING and (w.future is None or not w.future.cancel()):
                return  # the download gives the bytes back when it ends
            w.data, w.prepared, w.state = None, None, IDLE
            self._give_back(w)

    def clear(self) -> None:
        """Drop every window (downloads still running give their bytes back when they end)."""
        with self.lock:
            windows, self.windows = list(self.windows), deque()
            self.planned_to = self.located_after = None
        for w in windows:
            self._drop(w)

    def close(self) -> None:
        self.closed = True
        self.clear()
