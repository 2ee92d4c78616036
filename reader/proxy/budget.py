"""Byte budgets shared by every connection of the proxy: requests being read and answers held for clients.

A client that stops reading its answers must cost a bounded number of bytes, and so must a thousand of
them. Each connection already holds at most one answer being written and one more received from its broker
(``FrameProtocol`` stops reading from the broker while it has an answer the client has not taken); the
budgets bound the sum over all connections. Bytes are taken when the proxy starts holding them (a frame's
size as it arrives, a remote answer before it is read) and given back when they are handed to the kernel
(the client's transport drained, the request forwarded to the broker).

Waits are first come, first served: a large frame is not starved by a stream of small ones. Frames of at
most ``SMALL_FRAME`` bytes never wait (ApiVersions, Metadata, ListOffsets, heartbeats, the broker's answers
to remote partitions' probes): what a connection holds of them is bounded per connection, and a full budget
must not stop every client's offsets and group traffic. Runs on the proxy's event loop only (no locks).
"""

from __future__ import annotations

import asyncio
import collections

SMALL_FRAME = 64 * 1024


class ByteBudget:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        self.peak = 0
        self.waiters: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()

    def take_now(self, n: int) -> bool:
        """Take ``n`` bytes if they may be held now (small, or room and nobody waiting before)."""
        if n <= SMALL_FRAME or (not self.waiters and self._fits(n)):
            self._take(n)
            return True
        return False

    async def take(self, n: int) -> None:
        """Take ``n`` bytes, waiting in turn for room. A frame larger than the whole budget waits until
        nothing else is held (then it alone exceeds the capacity: the settings keep Fetch answers below it)."""
        if self.take_now(n):
            return
        waiter = asyncio.get_running_loop().create_future()
        self.waiters.append((n, waiter))
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release(n)  # granted as the waiting task was cancelled
            else:
                self.waiters.remove((n, waiter))
                self._wake()
            raise

    def take_upto(self, n: int) -> int:
        """Take what is free of ``n`` bytes now (nothing while others wait in turn): a remote answer is built
        within it instead of waiting, smaller when room is short."""
        granted = 0 if self.waiters else max(0, min(n, self.capacity - self.used))
        self._take(granted)
        return granted

    def force(self, n: int) -> None:
        """Count ``n`` bytes already held (one batch beyond the room, Kafka's rule): later takers wait for them."""
        self._take(n)

    def release(self, n: int) -> None:
        self.used -= n
        self._wake()

    def _fits(self, n: int) -> bool:
        return self.used + n <= self.capacity or self.used == 0

    def _take(self, n: int) -> None:
        self.used += n
        self.peak = max(self.peak, self.used)

    def _wake(self) -> None:
        while self.waiters and self._fits(self.waiters[0][0]):
            n, waiter = self.waiters.popleft()
            if waiter.done():
                continue
            self._take(n)
            waiter.set_result(None)
