"""The memory pool: a hard cap on downloaded bytes held in memory (read-ahead and data being decoded).

Every window is paid for *before* its GET is sent. Read-ahead only takes room that is free
(``try_reserve``) and registers what it holds as evictable; a reader that needs a window now
(``reserve``) may evict read-ahead windows (least recently fetched first) and otherwise waits for room.
So read-ahead never blocks a demand read, and paused or abandoned partitions cannot pin the pool.
Peak memory from downloads is at most ``capacity`` bytes (plus the one batch that straddles two
windows while it is decoded).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable


class MemoryPool:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        self.peak = 0
        self.cond = threading.Condition()
        self.evictable: OrderedDict[int, tuple[int, Callable[[], bool]]] = OrderedDict()  # id -> (bytes, evict)

    def try_reserve(self, n: int) -> bool:
        """Take ``n`` bytes if they are free now (for read-ahead)."""
        with self.cond:
            if self.used + n > self.capacity:
                return False
            self._take(n)
            return True

    def reserve(self, n: int, timeout: float | None = None) -> bool:
        """Take ``n`` bytes for a read needed now: evict read-ahead, else wait. False after ``timeout``."""
        if n > self.capacity:
            raise ValueError(f"a read of {n} bytes does not fit the memory pool of {self.capacity} bytes")
        with self.cond:
            while self.used + n > self.capacity:
                if self.evictable:
                    _, (_, evict) = self.evictable.popitem(last=False)
                    evict()  # the holder drops its data and calls release() (re-entrant lock)
                    continue
                if not self.cond.wait(timeout):
                    return False
            self._take(n)
            return True

    def _take(self, n: int) -> None:
        self.used += n
        self.peak = max(self.peak, self.used)

    def release(self, n: int) -> None:
        with self.cond:
            self.used -= n
            self.cond.notify_all()

    def mark_evictable(self, ident: int, n: int, evict: Callable[[], bool]) -> None:
        """Read-ahead data that may be dropped; ``evict`` drops it (and releases its bytes) if still unused."""
        with self.cond:
            self.evictable[ident] = (n, evict)

    def unmark(self, ident: int) -> None:
        with self.cond:
            self.evictable.pop(ident, None)
