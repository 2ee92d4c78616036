"""Turns on the event loop for the Python work of Fetch requests.

A consumer group catching up sends hundreds of Fetch requests at once, each planned, merged and encoded in
Python on the one event loop (milliseconds each for dozens of partitions). Run as they arrive, the work of
all the requests read in one loop iteration runs back to back in that iteration, and a ListOffsets or
Metadata request that arrived meanwhile waits for all of it: seconds in a burst of 800 (measured,
docs/design.md). A lock does not help: the work is synchronous, so each holder releases before the next
reader task even asks. ``FetchTurns`` hands out one turn per loop iteration, in arrival order, so a burst
costs every other request at most one Fetch's work per step.
"""

from __future__ import annotations

import asyncio
from collections import deque
from types import TracebackType


class FetchTurns:
    """``async with turns:`` waits for a turn of its own (at least until the next loop iteration), then runs
    its synchronous work; one holder starts per iteration."""

    def __init__(self) -> None:
        self._waiting: deque[asyncio.Future[None]] = deque()
        self._scheduled = False

    async def __aenter__(self) -> None:
        waiter = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        self._schedule()
        await waiter

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:  # fmt: skip
        return None

    def _schedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._next)

    def _next(self) -> None:
        """Wake the first waiter still waiting (a cancelled one is skipped); come back next iteration."""
        self._scheduled = False
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)
                break
        if self._waiting:
            self._schedule()
