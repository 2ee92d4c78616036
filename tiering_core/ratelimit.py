"""A thread-safe token bucket that caps upload (or download) bytes per second."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class RateLimiter:
    """``acquire(n)`` blocks until ``n`` bytes may pass at ``rate`` bytes/s, with bursts up to ``burst``.

    ``rate=None`` means unlimited. ``clock`` and ``sleep`` are injectable for tests.
    """

    def __init__(
        self, rate: float | None, burst: float | None = None, *,
        clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
    ) -> None:  # fmt: skip
        self.rate = rate
        self.burst = burst if burst is not None else (rate or 0)
        self.tokens = self.burst
        self.clock = clock
        self.sleep = sleep
        self.last = clock()
        self.lock = threading.Lock()

    def acquire(self, n: int) -> None:
        if self.rate is None or n <= 0:
            return
        with self.lock:
            now = self.clock()
            self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rate)
            self.last = now
            self.tokens -= n
            wait = -self.tokens / self.rate if self.tokens < 0 else 0.0
        if wait > 0:
            self.sleep(wait)
