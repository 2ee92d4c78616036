"""One user partition's remote segments, stored column by column.

A million segments as Python objects would take well over 500 bytes each; here a segment costs its
columns: a 16-byte id, six int64, one int32, one state byte and its int64 slot in ``order``, about
80 bytes. Rows are append-only; ``order`` lists rows by base offset, so a segment is found by
bisecting on the base offset every record carries and comparing ids (no per-segment dict: loading a
snapshot is a handful of ``frombytes`` calls). Rows of finished deletions are dropped by ``compact``.
"""

from __future__ import annotations

import bisect
from array import array
from typing import NamedTuple

from segment_fsm import Fence, LogStarts, PartitionDeleteState, SegmentState
from tiering_core.copy_choice import holder

STARTED = int(SegmentState.COPY_SEGMENT_STARTED)
FINISHED = int(SegmentState.COPY_SEGMENT_FINISHED)
DELETE_STARTED = int(SegmentState.DELETE_SEGMENT_STARTED)
DELETE_FINISHED = int(SegmentState.DELETE_SEGMENT_FINISHED)
COLUMNS_Q = ("base", "end", "first_ts", "max_ts", "size", "event_time")


class RemoteSegment(NamedTuple):
    """A remote segment copy as the state knows it (offsets inclusive)."""

    segment_id: bytes
    state: SegmentState
    base_offset: int
    end_offset: int
    first_timestamp: int
    max_timestamp: int
    size: int
    leader_epoch: int
    event_time: int


class RemotePartitionState(NamedTuple):
    """A partition's remote log at one moment. Offsets are inclusive; the bounds are None while no
    copy has finished. ``remote_size`` is the size of the remote log (Kafka's RemoteLogSizeBytes): the
    bytes of finished copies with every offset counted once (see ``PartitionSegments.counted_sizes``);
    ``stored_size`` is what the finished copies take in the store, overlaps included."""

    topic: str
    remote_start_offset: int | None
    remote_end_offset: int | None
    remote_size: int
    segment_counts: dict[str, int]
    fence: Fence
    delete_state: PartitionDeleteState | None
    stored_size: int
    log_starts: LogStarts = LogStarts()


class PartitionSegments:
    __slots__ = (
        "base", "bounds_at", "changed", "delete_state", "end", "epoch", "event_time", "fence", "first_ts", "ids",
        "log_starts", "max_span", "max_ts", "order", "size", "state", "topic",
    )  # fmt: skip

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.ids = bytearray()
        self.base = array("q")
        self.end = array("q")
        self.first_ts = array("q")
        self.max_ts = array("q")
        self.size = array("q")
        self.event_time = array("q")
        self.epoch = array("i")
        self.state = bytearray()
        self.order = array("q")
        self.fence = Fence(-1, 0)
        self.max_span = 0
        self.delete_state: PartitionDeleteState | None = None
        self.log_starts = LogStarts()
        self.changed = 0  # MetadataState.changes when a record about this partition was last applied
        self.bounds_at: tuple[int, int | None, int | None] | None = None  # (changed, Rx, Ry): ``bounds``

    def __len__(self) -> int:
        return len(self.state)

    def find(self, segment_id: bytes, base_offset: int) -> int | None:
        """The row of the segment with this id and base offset, or None."""
        order, base, ids = self.order, self.base, self.ids
        i = len(order) - 1
        if i < 0 or base[order[i]] < base_offset:
            return None  # beyond the newest: a new segment (the common case)
        if base[order[i]] != base_offset:
            i = bisect.bisect_right(order, base_offset, key=base.__getitem__) - 1
        while i >= 0:
            r = order[i]
            if base[r] != base_offset:
                return None
            if ids[r * 16 : r * 16 + 16] == segment_id:
                return r
            i -= 1
        return None

    def state_of(self, segment_id: bytes, base_offset: int) -> int | None:
        row = self.find(segment_id, base_offset)
        return None if row is None else self.state[row]

    def add(self, segment_id: bytes, state: int, epoch: int, event_time: int, base: int, end: int,
            first_ts: int, max_ts: int, size: int) -> None:  # fmt: skip
        row = len(self.state)
        self.ids += segment_id
        self.state.append(state)
        self.epoch.append(epoch)
        self.base.append(base)
        self.end.append(end)
        self.first_ts.append(first_ts)
        self.max_ts.append(max_ts)
        self.size.append(size)
        self.event_time.append(event_time)
        base_col = self.base
        if not self.order or base_col[self.order[-1]] <= base:
            self.order.append(row)
        else:
            self.order.insert(bisect.bisect_right(self.order, base, key=base_col.__getitem__), row)
        self.max_span = max(self.max_span, end - base)

    def update(self, row: int, state: int, event_time: int) -> None:
        self.state[row] = state
        self.event_time[row] = event_time

    def segment(self, row: int) -> RemoteSegment:
        return RemoteSegment(
            bytes(self.ids[row * 16 : row * 16 + 16]), SegmentState(self.state[row]), self.base[row],
            self.end[row], self.first_ts[row], self.max_ts[row], self.size[row], self.epoch[row], self.event_time[row],
        )  # fmt: skip

    def segments(self, states: frozenset[int] | None = None) -> list[RemoteSegment]:
        """Segments in base-offset order, optionally only those in ``states``."""
        st = self.state
        return [self.segment(r) for r in self.order if states is None or st[r] in states]

    def remote_bounds(self) -> tuple[int | None, int | None]:
        """(Rx, Ry): the lowest base and highest end offset over finished copies, or (None, None)."""
        st, base, end = self.state, self.base, self.end
        rx = ry = None
        for r in self.order:
            if st[r] == FINISHED:
                if rx is None:
                    rx = base[r]
                if ry is None or end[r] > ry:
                    ry = end[r]
        return rx, ry

    def bounds(self) -> tuple[int | None, int | None]:
        """``remote_bounds`` computed once per change of the partition: every fetch a reader routes asks them
        (the access layer, per partition of every Fetch), and the walk is over all the partition's copies."""
        if self.bounds_at is None or self.bounds_at[0] != self.changed:
            self.bounds_at = (self.changed, *self.remote_bounds())
        return self.bounds_at[1], self.bounds_at[2]

    def stored_size(self) -> int:
        """Bytes of every finished copy, overlapping ones included: what the store holds."""
        st, size = self.state, self.size
        return sum(size[r] for r in range(len(st)) if st[r] == FINISHED)

    def counted_sizes(self) -> dict[int, int]:
        """Per finished row, the bytes it adds to the remote log's size, so that no offset counts twice.

        Copies overlap after a leader change (the new leader's segment boundaries differ) and, until the
        sweeper deletes one, when the same segment was finished twice. Each offset belongs to the copy
        reads use for it (``segment_for_offset``: the highest-ranked copy, ``rank``); a copy
        counts its size in proportion to the offsets that belong to it (integer division), so a copy
        entirely covered by a preferred one counts 0. Copies that overlap nothing count their size.
        """
        st, base, end = self.state, self.base, self.end
        out: dict[int, int] = {}
        cluster: list[tuple[int, int]] = []  # (position in order, row) of copies overlapping one another
        reach = -1
        for position, r in enumerate(self.order):
            if st[r] != FINISHED:
                continue
            if cluster and base[r] > reach:
                self._count_cluster(cluster, out)
                cluster = []
            cluster.append((position, r))
            reach = max(reach, end[r]) if len(cluster) > 1 else end[r]
        if cluster:
            self._count_cluster(cluster, out)
        return out

    def _count_cluster(self, cluster: list[tuple[int, int]], out: dict[int, int]) -> None:
        base, end, size = self.base, self.end, self.size
        if len(cluster) == 1:
            out[cluster[0][1]] = size[cluster[0][1]]
            return
        claimed: list[tuple[int, int]] = []  # offset ranges (inclusive) taken by preferred copies
        for _, r in sorted(cluster, key=lambda pr: self.rank(pr[1]), reverse=True):
            lo, hi = base[r], end[r]
            taken = sum(max(0, min(hi, b) - max(lo, a) + 1) for a, b in claimed)
            out[r] = size[r] * (hi - lo + 1 - taken) // (hi - lo + 1)
            claimed = _merge([*claimed, (lo, hi)])

    def remote_size(self) -> int:
        """RemoteLogSizeBytes: finished copies' bytes with every offset counted once."""
        return sum(self.counted_sizes().values())

    def duplicates(self) -> list[RemoteSegment]:
        """Finished copies that hold exactly the offsets of another finished copy ranked higher (``rank``):
        redundant, to be deleted. Which one stays is the same on every replica (the rows' order is the WAL's)."""
        st, base, end, order = self.state, self.base, self.end, self.order
        keep: dict[tuple[int, int], int] = {}
        for r in order:
            if st[r] == FINISHED:
                key = (base[r], end[r])
                if key not in keep or self.rank(r) > self.rank(keep[key]):  # type: ignore[operator]
                    keep[key] = r
        return [self.segment(r) for r in order if st[r] == FINISHED and keep[(base[r], end[r])] != r]

    def counts(self) -> dict[str, int]:
        out = {s.name: 0 for s in SegmentState}
        for value in self.state:
            out[SegmentState(value).name] += 1
        return out

    def summary(self) -> RemotePartitionState:
        """Rx, Ry, remote size and counts: one pass over the partition's segments."""
        rx, ry = self.remote_bounds()
        return RemotePartitionState(
            self.topic,
            rx,
            ry,
            self.remote_size(),
            self.counts(),
            self.fence,
            self.delete_state,
            self.stored_size(),
            self.log_starts,
        )

    def rank(self, row: int) -> tuple[int, int, int] | None:
        """Where finished copies overlap, the highest-ranked one holds an offset (``tiering_core.copy_choice``):
        the leader epoch the copy was made under, then its base offset, then the later row (the WAL's order; the
        manifests' ``created_ms`` follows it, so ``Manifest.preference`` ranks the same). None if not finished."""
        return (self.epoch[row], self.base[row], row) if self.state[row] == FINISHED else None

    def segment_for_offset(self, offset: int) -> RemoteSegment | None:
        """The finished copy holding ``offset``, the highest-ranked where copies overlap; None if none does."""
        row = holder(offset, self.order, self.base, self.end, self.rank, self.max_span)
        return None if row is None else self.segment(row)

    def compact(self) -> int:
        """Drop rows whose deletion finished; returns how many. Idempotent."""
        keep = [r for r in range(len(self.state)) if self.state[r] != DELETE_FINISHED]
        dropped = len(self.state) - len(keep)
        if dropped == 0:
            return 0
        fresh = PartitionSegments(self.topic)
        for r in sorted(keep, key=self.base.__getitem__):
            fresh.add(bytes(self.ids[r * 16 : r * 16 + 16]), self.state[r], self.epoch[r], self.event_time[r],
                      self.base[r], self.end[r], self.first_ts[r], self.max_ts[r], self.size[r])  # fmt: skip
        for name in self.__slots__:
            if name not in ("bounds_at", "changed", "fence", "delete_state", "log_starts", "topic"):
                setattr(self, name, getattr(fresh, name))
        return dropped


def _merge(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Inclusive offset ranges, sorted and merged where they overlap or touch."""
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out
