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
    """``async with turns:`` waits for a turn of its own, then runs its synchronous work; one holder starts per
    iteration. With nobody waiting and no turn begun in this iteration it goes at once: a Fetch alone (one
    consumer reading) pays no loop iteration per turn (two per turn otherwise; four turns per Fetch)."""

    def __init__(self) -> None:
        self._waiting: deque[asyncio.Future[None]] = deque()
        self._scheduled = False
        self._holds = 0  # a turn began in this loop iteration (or was handed out to begin in the next)

    async def __aenter__(self) -> None:
        if not self._waiting and not self._holds:  # nobody ahead and no turn begins in this iteration: go
            self._hold(1)
            return
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
                self._hold(2)  # its task resumes in the next iteration: none other begins there
                break
        if self._waiting:
            self._schedule()

    def _hold(self, iterations: int) -> None:
        """No turn begins at once for ``iterations`` loop iterations (this one included)."""
        self._holds += 1
        asyncio.get_running_loop().call_soon(self._release, iterations)

    def _release(self, left: int) -> None:
        """One more loop iteration of a hold has passed. A method, not a closure that schedules itself: such a
        closure refers to itself, a reference cycle per turn that only the garbage collector frees."""
        if left > 1:
            asyncio.get_running_loop().call_soon(self._release, left - 1)
        else:
            self._holds -= 1
