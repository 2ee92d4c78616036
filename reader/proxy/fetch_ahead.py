"""Fetch ahead: the next Fetch of a client that reads on, asked of the broker before the client asks it.

A consumer keeps one Fetch per broker in flight: it asks, waits for the answer, decodes it, asks again. Straight
from the broker a cycle is the broker's answer and the client's decoding one after the other; through a proxy
every hop the proxy adds lengthens each cycle, and the consumer's rate is one answer per cycle
(docs/design.md, "Fetch ahead"). What the client asks next is known once its answer is: the same request with
each partition's fetch offset past the last whole batch of the answer (every Kafka client moves its position
to the batch's last offset + 1, and sends that batch's leader epoch as ``last_fetched_epoch``). So when an
answer shows more data waiting (a partition's high watermark, or last stable offset for read_committed,
beyond what it gave), the proxy sends that request to the broker at once, on the client's own connection (the
broker authenticates and authorises it as the client's), with ``max_wait`` 0, and holds the answer. When the
client's next Fetch arrives and is byte for byte the request predicted (the correlation id and the order of its
partitions aside, ``request_key``) and the
answer is at most ``fetch_ahead_max_age_seconds`` old, it gets the held answer under its correlation id; the
broker's reading and the client's decoding then overlap instead of taking turns. Anything else (another
request, a seek, a partition added or paused, an answer with an error, a throttle or no records, too old) drops
the held answer and the client's request goes to the broker as always: a wrong guess costs one answer the
broker read, never a wrong answer.

At most one Fetch is asked ahead per connection; its answer is held in the answer budget like any answer
received (``frames.py``), and given back when it is served or dropped.
"""

from __future__ import annotations

import asyncio
import struct
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from prometheus_client import Counter

from reader.proxy.fetch_request import FetchLayout, fetch_layout
from reader.proxy.fetch_scan import ScannedFetch
from reader.proxy.wire import ProtocolError
from tiering_core.errors import FormatError
from tiering_core.formats import TruncatedBatchError, scan_headers

_I32 = struct.Struct(">i")
_U16 = struct.Struct(">H")
_I64 = struct.Struct(">q")
READ_COMMITTED = 1


class NextFetch(NamedTuple):
    """A client's Fetch request, kept to ask its next one ahead."""

    frame: bytes
    start: int  # where its body begins
    version: int
    layout: FetchLayout  # where its fields are (walked once: the prediction and its key use the same positions)


class Given(NamedTuple):
    """What an answer gave one partition, as the prediction reads it."""

    topic: object  # the name (v4-12) or the id (v13+), as the request named it
    partition: int
    high_watermark: int
    last_stable_offset: int
    records: memoryview | None  # the records' bytes


def given_by_scan(answer: memoryview, start: int, scan: ScannedFetch, records_at: list[int]) -> list[Given] | None:
    """The partitions of a broker's answer received whole (its body at ``start``), from its scan (``scan_fetch``,
    each partition's records at ``records_at``); None for an answer not to read on from: a throttle, an error,
    node endpoints to rewrite."""
    if _I32.unpack_from(answer, start)[0]:  # throttle_time_ms: the client backs off first
        return None
    if not scan.plain:
        return None
    return [Given(p.topic, p.partition, p.high_watermark, p.last_stable_offset,
                  answer[at : at + p.records] if p.records else None)
            for p, at in zip(scan.partitions, records_at, strict=True)]  # fmt: skip


def given_by_body(body: Any, version: int) -> list[Given] | None:
    """The partitions of an answer the proxy parsed (remote partitions merged in); None as ``given_by_scan``."""
    if body.throttle_time.total_seconds() or int(getattr(body, "error_code", 0)):
        return None
    given = []
    for t in body.responses:
        topic = t.topic_id if version >= 13 else t.topic
        for p in t.partitions:
            if int(p.error_code):
                return None
            records = memoryview(p.records) if p.records else None
            given.append(Given(topic, int(p.partition_index), int(p.high_watermark), int(p.last_stable_offset),
                               records))  # fmt: skip
    return given


def next_fetch(request: NextFetch, given: list[Given]) -> bytes | None:
    """The Fetch frame the client sends next if it reads on from the answer that gave ``given`` to ``request``:
    ``request`` with each partition that got records at the end of its last whole batch (and that batch's
    leader epoch as ``last_fetched_epoch`` where the client sends one). None when there is no reason to ask
    ahead: no records, or no partition with more data waiting (the broker would hold the request for
    ``max_wait``). The prediction differs from ``request`` only in fields of fixed size: ``request.layout`` is
    its layout too."""
    layout = request.layout
    read_committed = request.frame[layout.max_wait + 12] == READ_COMMITTED
    ends: dict[tuple[object, int], tuple[int, int]] = {}
    more = False
    for part in given:
        end = None if part.records is None else last_batch_end(part.records, 0, len(part.records))
        if end is None:
            continue
        ends[(part.topic, part.partition)] = end
        bound = part.last_stable_offset if read_committed and part.last_stable_offset >= 0 else part.high_watermark
        more = more or bound > end[0]
    if not more:
        return None
    out = bytearray(request.frame)
    for partitions in layout.topics:
        for at in partitions:
            end = ends.get((at.topic, at.partition))
            if end is None:
                continue
            _I64.pack_into(out, at.offset, end[0])
            if at.epoch >= 0 and _I32.unpack_from(out, at.epoch)[0] >= 0:  # a client that sends none keeps -1
                _I32.pack_into(out, at.epoch, end[1])
    return bytes(out)


def last_batch_end(buf: memoryview, pos: int, size: int) -> tuple[int, int] | None:
    """(the offset after the last whole record batch, its leader epoch) of the ``size`` bytes of records at
    ``pos``; None without a whole batch (a partial batch at the end is one the client skips too) or with a
    message set older than magic 2 (``tiering_core.formats.scan_headers`` reads the headers)."""
    last = None
    try:
        for header in scan_headers("a Fetch answer", buf, pos, pos + size):
            last = header
    except FormatError as exc:  # a batch cut short at the end of the answer is one the client skips too
        if not isinstance(exc, TruncatedBatchError):
            return None
    return None if last is None else (last.last_offset + 1, last.partition_leader_epoch)


def _future() -> asyncio.Future[Held | None]:
    return asyncio.get_running_loop().create_future()


def client_layout(frame: bytes, start: int, version: int) -> FetchLayout | None:
    """Where a client's Fetch request's fields are, walked once for its claim and its next prediction; None for a
    request that does not read (it is parsed in full next, which names what is wrong)."""
    try:
        return fetch_layout(frame, start, version)
    except ProtocolError:
        return None


def request_key(frame: bytes, layout: FetchLayout) -> bytes:
    """A Fetch request's bytes as the match of a prediction compares them (``layout``: where its fields are):
    without its correlation id, and with its partitions in a fixed order (librdkafka starts each Fetch one
    partition further round its list, so its next request is the one predicted in another order; every client
    finds a partition of an answer by its topic and index, and Java's checks the set)."""
    entries = []
    for partitions in layout.topics:
        for at in partitions:
            topic = at.topic.bytes if isinstance(at.topic, uuid.UUID) else at.topic.encode()
            entries.append(_U16.pack(len(topic)) + topic + frame[at.start : at.end])
    entries.sort()
    return b"".join((frame[:4], frame[8 : layout.topics_at], *entries, frame[layout.topics_end :]))


class Held(NamedTuple):
    """The answer of a Fetch asked ahead: the frame as pieces to write (size prefix first) and what it gave."""

    pieces: list[bytes | memoryview]
    given: list[Given]
    local: bool = False  # the broker's answer as it gave it, every partition of its request the broker's (lane.py)
    remote: Any = None  # a remote answer that may go on a remote lane: its ``remote_lane.RemoteHeld``


@dataclass(slots=True)
class Ahead:
    """A Fetch asked ahead: the request the client is expected to send, and the broker's answer once it came."""

    key: bytes
    sent: float  # monotonic
    answer: asyncio.Future[Held | None] = field(default_factory=_future)
    release: Callable[[], None] | None = None  # gives the answer's bytes back to the budget
    dropped: bool = False

    def arrived(self, answer: Held | None, release: Callable[[], None]) -> None:
        """The broker's answer (None: not one to serve), held until it is served or dropped."""
        self.release = release
        if self.dropped or answer is None:
            self.free()
        if not self.answer.done():
            self.answer.set_result(None if self.dropped else answer)

    def free(self) -> None:
        self.dropped = True
        if self.release is not None:
            self.release()
            self.release = None


class FetchAhead:
    """One connection's Fetch asked ahead (at most one at a time)."""

    def __init__(self, max_age: float, outcomes: Counter) -> None:
        self.max_age = max_age
        self.outcomes = outcomes
        self.held: Ahead | None = None
        self.routed = 0  # the client's Fetch requests so far: a prediction made before the last one is old
        self.answered = 0.0  # monotonic time the client's last Fetch answer went out
        self.slow = False  # the client's last Fetch came late after its answer: an answer held for it would age

    def ask(self, frame: bytes, request: NextFetch, routed: int) -> tuple[Ahead, bytes] | None:
        """An ``Ahead`` for the predicted ``frame`` (``request``'s next) and the frame to send for it
        (``max_wait`` 0: asked only where data waits, so the broker answers at once), or None where the
        client's next Fetch was routed since the prediction (``routed`` was ``self.routed`` then) or one is
        held already."""
        if routed != self.routed or self.held is not None:
            return None
        send = bytearray(frame)
        _I32.pack_into(send, request.layout.max_wait, 0)  # the prediction's layout is its request's (next_fetch)
        return Ahead(request_key(frame, request.layout), time.monotonic()), bytes(send)

    async def claim(self, frame: bytes, layout: FetchLayout | None) -> Ahead | None:
        """The held Fetch whose answer this client Fetch (its fields at ``layout``; None for a request that does
        not read, which is parsed in full next and named there) gets, once that answer came; None (the held one
        dropped) when ``frame`` is not the request predicted, or the answer is not one to serve or too old.
        The caller frees it once the answer is out."""
        self.routed += 1
        self.slow = self.answered > 0 and time.monotonic() - self.answered > self.max_age / 2
        held, self.held = self.held, None
        if held is None:
            return None
        key = b"" if layout is None else request_key(frame, layout)
        if key != held.key:
            held.free()
            self.outcomes.labels("missed").inc()
            return None
        if await held.answer is None:
            self.outcomes.labels("unusable").inc()
            return None
        if time.monotonic() - held.sent > self.max_age:
            held.free()
            self.outcomes.labels("stale").inc()
            return None
        self.outcomes.labels("served").inc()
        return held

    def wanted(self) -> bool:
        """Whether to ask ahead after the answer going out now: not for a client whose last Fetch came later
        than half the max age after its answer (one that decodes or processes slowly, or stopped fetching
        because its queue is full: what it would be given would be old, and dropped); the answer's time noted."""
        self.answered = time.monotonic()
        return not self.slow

    def close(self) -> None:
        """The connection ends: a held answer goes back to the budget."""
        if self.held is not None:
            self.held.free()
            self.held = None


def served(held: Held, correlation_id: int) -> list[bytes | memoryview]:
    """A held answer's pieces under the client's correlation id (after the size prefix)."""
    first = held.pieces[0]
    if not isinstance(first, memoryview) or first.readonly:
        first = memoryview(bytearray(first))
    _I32.pack_into(first, 4, correlation_id)
    return [first, *held.pieces[1:]]
