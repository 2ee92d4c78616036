"""The remote lane: a connection's Fetch cycle from remote storage run by the compiled module, off the event loop.

A consumer catching up through the proxy from remote storage repeats one cycle: its Fetch, the probe the proxy sends
the broker for it, the answer built from the read core's batches, its next Fetch. On the event loop that cycle cost
about 1.6-1.9 ms of CPU per answer, most of it the interpreter around the steps (docs/design.md, "The remote
lane"). When a client's Fetch claims an answer asked ahead whose partitions all came from remote storage
(``RemoteHeld``: every probe allowed, nothing throttled, no partition waiting for the broker's word on an open
transaction), the connection lends both sockets to a
``RemoteLane`` (``native/src/remote_lane.rs``) and hands it, ahead, the batches of the answers the client will ask
next: for each, every partition's batches read from the read core exactly as ``FetchPlan.read_remote`` reads them
(the first partition with data may bring one batch beyond the room, the others what fits in the request's
``max_bytes``), from what read-ahead holds in memory. The lane sends the probe before each answer, builds the
answer from the batches handed and the probe's offsets while the broker allows every partition and the client asks
the request predicted, and gives the connection back at anything else, so the broker still decides every answer:
a refused probe (an ACL revoked, a leader moved) sends the client's Fetch through the Fetch handler, which answers
with the broker's error.

Not on the lane: read_committed partitions waiting for the broker's word on a transaction the remote data leaves
open (read_committed answers otherwise carry the aborted transactions the read core found), a client with a fetch
quota of the proxy's own (its answers are counted and throttled on the event loop), TLS on either side. Memory: the
batches handed are views of read-ahead windows; they are taken from the answer budget's free room while handed
(``Chain``), at most ``HANDED_BYTES`` ahead, and given back as they are served or when the lane ends.
"""

from __future__ import annotations

import struct
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any

from reader.errors import WouldBlock
from reader.proxy.fetch_ahead import Given, NextFetch, last_batch_end
from reader.proxy.lane import RUN_SECONDS, LaneRuns
from reader.proxy.tiered import TieredView, TopicKey
from tiering_core.formats.native import NATIVE
from tiering_core.logs import get_logger

log = get_logger(__name__)
HANDED_BYTES = 32 << 20  # batches handed to a lane ahead of the client, at most (and within the answer budget)
_REMOTE_LANE = getattr(NATIVE, "RemoteLane", None)
_I64 = struct.Struct(">q")


def available() -> bool:
    """Whether the compiled module has the remote lane."""
    return _REMOTE_LANE is not None


@dataclass(frozen=True, slots=True)
class RemotePartition:
    """A partition of a remote answer: the topic's key in the request (name, or id from v13), the incarnation
    read, the index, its ``partition_max_bytes``, and the remote start (the answers' log start)."""

    key: Any
    topic: TopicKey
    index: int
    max_bytes: int
    log_start: int


@dataclass(frozen=True, slots=True)
class RemoteHeld:
    """What a remote answer asked ahead needs to go on a lane: its partitions in answer order, the request's
    ``max_bytes`` as the plan read it and its isolation, and the probe the Fetch handler sent the broker for it (no
    size prefix)."""

    partitions: tuple[RemotePartition, ...]
    max_bytes: int
    read_committed: bool
    probe: bytes


class RemoteLane(LaneRuns):
    """One connection's remote lane (made at its first use)."""

    def __init__(self, client_fd: int, broker_fd: int, version: int, max_request: int, max_answer: int,
                 max_age: float, frame_timeout: float, idle_timeout: float) -> None:  # fmt: skip
        assert _REMOTE_LANE is not None
        super().__init__(version)
        self.lane = _REMOTE_LANE(client_fd, broker_fd, self.stop_r, version, max_request, max_answer, max_age,
                                 frame_timeout, idle_timeout, RUN_SECONDS)  # fmt: skip

    def start(self, request: NextFetch, pieces: list[bytes | memoryview], held: RemoteHeld, given: list[Given]
              ) -> bool:  # fmt: skip
        """The client's Fetch, its answer's pieces (size prefix first) and what that answer gave: False where the
        lane cannot take it (``RemoteLane.start``)."""
        by_key = {(g.topic, g.partition): g for g in given}
        if len(given) != len(held.partitions) or any((p.key, p.index) not in by_key for p in held.partitions):
            return False
        parts = [(_topic_bytes(p.key), p.index, p.log_start) for p in held.partitions]
        records = [_records(by_key[(p.key, p.index)]) for p in held.partitions]
        probe = struct.pack(">i", len(held.probe)) + held.probe
        started: bool = self.lane.start(request.frame, pieces, probe, parts, records)
        return started


class Chain:
    """The answers handed to a lane ahead of the client: where each partition's next read begins, and the answer
    budget each answer handed holds until it is served."""

    def __init__(self, held: RemoteHeld, request: NextFetch, given: list[Given], view: TieredView,
                 budget: Any) -> None:  # fmt: skip
        self.held, self.view, self.budget = held, view, budget
        self.offsets: dict[tuple[Any, int], int] = {}
        for partitions in request.layout.topics:
            for at in partitions:
                self.offsets[(at.topic, at.partition)] = _I64.unpack_from(request.frame, at.offset)[0]
        for g in given:
            end = None if g.records is None else last_batch_end(g.records, 0, len(g.records))
            if end is not None:
                self.offsets[(g.topic, g.partition)] = end[0]
        self.charges: deque[int] = deque()
        self.ended = False  # the remote end reached, a read failed: nothing more to hand
        self.closed = False  # the lane ended (a hand still running on a remote thread gives its answer back)
        self._lock = threading.Lock()

    def hand(self, lane: RemoteLane, block: bool) -> int:
        """Hand the lane the answers read-ahead holds now (``block``: at least the next one, waiting for the store);
        how many were handed."""
        handed = 0
        while not self.ended and sum(self.charges) < HANDED_BYTES:
            answer = self._next(block and handed == 0)
            if answer is None:
                break
            lane.lane.extend(*answer)
            handed += 1
        return handed

    def _next(self, block: bool) -> tuple[list[Any], list[list[tuple[int, int]]] | None] | None:
        """The next answer's batches and aborted transactions (None: read_uncommitted) per partition, read by
        ``FetchPlan.read_remote``'s rule and taken from the budget; None where read-ahead does not hold them now
        (without ``block``), at the remote end or on any error. Batches stopped at a transaction the remote data
        leaves open end the chain after this answer (the broker is asked its outcome on the event loop's path)."""
        held, view, used = self.held, self.view, 0
        moved: dict[tuple[Any, int], int] = {}  # where each partition's next read begins once this one is handed
        records: list[Any] = []
        aborted: list[list[tuple[int, int]]] = []
        for part in held.partitions:
            offset = self.offsets[(part.key, part.index)]
            room = min(part.max_bytes, held.max_bytes - used)
            if room <= 0 and used:
                records.append(None)
                aborted.append([])
                continue
            try:
                served = view.read(part.topic, part.index, offset, max(room, 0), held.read_committed, used == 0, block)
            except WouldBlock:
                return None
            except Exception as exc:  # the remote end (the broker has the rest), an error: the event loop's path
                log.debug("the remote lane stops handing answers", topic=part.topic.name, partition=part.index,
                          offset=offset, reason=str(exc))  # fmt: skip
                self.ended = True
                return None
            if served.undecided:
                view.note_undecided(part.topic, part.index, served.undecided)
                self.ended = True
            records.append(served.data if served.data else None)
            aborted.append([(a.producer_id, a.first_offset) for a in served.aborted])
            used += len(served.data)
            moved[(part.key, part.index)] = served.next_offset
        if not used or not self._take(used):
            self.ended = True
            return None
        with self._lock:
            if self.closed:
                self.budget.release(used)
                return None
            self.charges.append(used)
        self.offsets.update(moved)
        return records, aborted if held.read_committed else None

    def _take(self, n: int) -> bool:
        """``n`` bytes of the answer budget if they fit in it now (small answers too: ``take_now`` lets those
        through, which for answers held ahead would let many lanes of small answers grow past the budget)."""
        granted = self.budget.take_upto(n)
        if granted < n:
            self.budget.release(granted)
            return False
        return True

    def served(self, answers: int) -> None:
        """``answers`` handed were served: their budget goes back."""
        with self._lock:
            for _ in range(min(answers, len(self.charges))):
                self.budget.release(self.charges.popleft())

    def close(self) -> None:
        """The lane ended: what it did not serve goes back, and a hand still running gives its answer back too."""
        with self._lock:
            self.closed = self.ended = True
            self.budget.release(sum(self.charges))
            self.charges.clear()


def _records(given: Given) -> memoryview | bytes | None:
    return given.records if given.records is not None and len(given.records) else None


def _topic_bytes(key: Any) -> bytes:
    return key.bytes if hasattr(key, "bytes") else str(key).encode()


def remote_held(plan: Any, body: Any, probe: bytes | None) -> RemoteHeld | None:
    """A remote answer the Fetch handler built that may go on a lane: every partition of the request served from
    remote storage, none waiting for the broker's word on transactions the remote data leaves open, no error
    anywhere. None otherwise."""
    if probe is None or not plan.remote or not plan.probes_only or int(body.error_code):
        return None
    if any(part.settle for part in plan.remote):
        return None
    if body.throttle_time.total_seconds():
        return None
    parts = {(part.key, part.partition): part for part in plan.remote}
    out = []
    for t in body.responses:
        key = t.topic_id if plan.version >= 13 else t.topic
        for p in t.partitions:
            part = parts.get((key, int(p.partition_index)))
            if part is None or int(p.error_code) or (key, part.partition) not in plan.served_remote:
                return None
            out.append(RemotePartition(key, part.topic, part.partition, part.max_bytes, int(p.log_start_offset)))
    if len(out) != len(parts):
        return None
    return RemoteHeld(tuple(out), plan.max_bytes, plan.read_committed, probe)
