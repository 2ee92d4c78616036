"""The native lane: a connection's pass-through Fetch cycle run by the compiled module, off the event loop.

A consumer reading local data through the proxy repeats one cycle: its Fetch, the broker's answer, its next Fetch.
With fetch ahead (``fetch_ahead.py``) nearly every answer is one the proxy asked ahead and held; the Python around
each (the request read and keyed, the prediction, the Fetch asked ahead planned and forwarded, the answer received,
scanned and held, the asyncio tasks and callbacks between) cost about as much CPU as the kernel's moving of the bytes
(docs/design.md, "The native lane"). When a client's Fetch claims an answer asked ahead for a request whose
partitions are all the broker's (``Held.local``), the connection lends both sockets to a ``FetchLane``
(``native/src/fetch_lane.rs``), which runs that cycle on a thread of its own with the GIL released: it writes the
answer, asks the broker for the predicted next Fetch, reads its answer and the client's next request, and serves the
one to the other while they match, exactly as the Python path would. At the first thing it does not do itself (any
other request, an answer with an error, node endpoints or a throttle, an answer too old, a client that came late)
it gives the connection back, with the client's frame for the handlers where there is one. Every second it also
comes back for a moment at an answer about to be served, so the metrics and the view of the broker's offsets follow.

While the lane has the sockets, the event loop reads neither (both transports paused, nothing buffered in either,
nothing queued to write), and a connection that closes stops its lane and waits for it before a socket is closed.
Memory: the lane's two answer buffers are taken from the answer budget (twice the most an answer of the request can
hold) for as long as it runs; a lane starts only when that room is free now and a lane thread is free
(``proxy.native_lanes``). It reads client frames of up to ``SMALL_FRAME`` (within the connection's own bytes, whose
stream buffer it leaves empty); a larger one is left in the socket for the event loop and its request budget.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from prometheus_client import Counter

from reader.proxy.fetch import FETCH
from reader.proxy.fetch_ahead import FetchAhead
from reader.proxy.metrics import ProxyMetrics
from reader.proxy.tiered import TieredView, TopicKey
from tiering_core.formats.native import NATIVE

RUN_SECONDS = 1.0  # a lane comes back this often at an answer about to be served (metrics, the broker's offsets)
_NATIVE_LANE = getattr(NATIVE, "FetchLane", None)


def available() -> bool:
    """Whether the compiled module has the lane (built without it, or TIERING_NATIVE_DECODER=0: never a lane)."""
    return _NATIVE_LANE is not None


class LaneThreads:
    """The threads lanes run on, one per lane for as long as it runs; a connection that finds none keeps the Python
    path."""

    def __init__(self, threads: int) -> None:
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="proxy-lane")
        self.free = threads
        self._lock = threading.Lock()

    def acquire(self) -> bool:
        with self._lock:
            if self.free == 0:
                return False
            self.free -= 1
            return True

    def release(self) -> None:
        with self._lock:
            self.free += 1

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


class LaneRuns:
    """What both lanes share: the compiled lane (``lane``, made by the subclass), its runs on a lane thread, and the
    stop pipe that ends a run at once."""

    lane: Any

    def __init__(self, version: int) -> None:
        self.version = version
        self.stop_r, self.stop_w = os.pipe()
        os.set_blocking(self.stop_w, False)
        self.running: asyncio.Future[Any] | None = None

    async def run(self, threads: LaneThreads) -> tuple[Any, ...]:
        """One run on a lane thread; a caller cancelled meanwhile stops it and waits for it (the sockets stay open
        until the lane let go of them)."""
        loop = asyncio.get_running_loop()
        self.running = loop.run_in_executor(threads.pool, self.lane.run)
        try:
            return await asyncio.shield(self.running)
        except asyncio.CancelledError:
            await self.stop()
            raise
        finally:
            self.running = None

    async def stop(self) -> None:
        """End a run at once and wait until it let go of the sockets."""
        running = self.running
        if running is None:
            return
        with contextlib.suppress(BlockingIOError):
            os.write(self.stop_w, b"x")
        with contextlib.suppress(BaseException):
            await asyncio.wait([running])

    def close(self) -> None:
        for fd in (self.stop_r, self.stop_w):
            with contextlib.suppress(OSError):
                os.close(fd)


class Lane(LaneRuns):
    """One connection's lane (made at its first use)."""

    def __init__(self, client_fd: int, broker_fd: int, version: int, max_request: int, max_answer: int,
                 fetch_max_bytes: int, max_age: float, frame_timeout: float, idle_timeout: float) -> None:  # fmt: skip
        assert _NATIVE_LANE is not None
        super().__init__(version)
        self.lane = _NATIVE_LANE(client_fd, broker_fd, self.stop_r, version, max_request, max_answer, fetch_max_bytes,
                                 max_age, frame_timeout, idle_timeout, RUN_SECONDS)  # fmt: skip

    def start(self, request: bytes, answer: bytes | memoryview) -> int | None:
        """Given the client's Fetch and its answer (size prefix first): the most an answer of it can hold, or None
        (not one for a lane: ``FetchLane.start``)."""
        bound: int | None = self.lane.start(request, answer)
        return bound


def account(result: tuple[Any, ...], version: int, runs: Counter, source: str, metrics: ProxyMetrics,
            ahead: FetchAhead, view: TieredView, count_partitions: Callable[[int], None]) -> None:  # fmt: skip
    """A run's answers in the metrics (``runs``: the lane's runs by outcome; ``source``: where its answers' records
    came from), its answers asked ahead in fetch ahead's outcomes, and the broker's offsets it saw in the view (as
    ``FetchPlan.observe`` learns them from the answers passing through)."""
    outcome, detail, _, served, answers, offsets, partitions = result
    runs.labels(outcome).inc()
    for size, seconds in answers:
        metrics.answered(FETCH, source, size, seconds)
    if served:
        ahead.outcomes.labels("served").inc(served)
    if outcome in ("request", "done") and detail in ("missed", "unusable", "stale"):
        ahead.outcomes.labels(detail).inc()
    ahead.routed += served
    count_partitions(partitions)
    learned = []
    for topic, partition, log_start, high, stable in offsets:
        key = _topic_key(view, topic, version)
        if key is not None:
            learned.append((key, partition, log_start, high, stable))
    if learned:
        view.observe(learned)


def _topic_key(view: TieredView, topic: bytes | str, version: int) -> TopicKey | None:
    if version >= 13:
        assert isinstance(topic, bytes)
        topic_id = uuid.UUID(bytes=topic)
        name = view.topic_name(topic_id)
        return None if name is None else TopicKey(name, topic_id)
    assert isinstance(topic, str)
    return view.known_key(topic)
