"""Which local segment to copy next (KIP-405's eligibility, copy in offset order).

A segment may be copied when it is not the active segment and every offset in it is below the last
stable offset: with ``next_base`` the base offset of the following segment, ``next_base <= Ly``.
Copying continues after the remote end ``Ry``: the next segment is the first one whose last offset
is above ``Ry``. After a leader change the new leader's segment boundaries differ from the old
leader's, so that segment may start at or below ``Ry``; it is copied whole and its offsets overlap the
previous copy (the metadata allows overlaps, readers pick one copy).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from tiering.policy.offsets import PartitionOffsets


@dataclass(frozen=True, slots=True)
class LocalSegmentInfo:
    """One segment of the broker's local log: its base offset and ``.log`` size in bytes."""

    base_offset: int
    size: int
    max_timestamp: int = -1


@dataclass(frozen=True, slots=True)
class CopyDecision:
    """Copy ``segment`` whose offsets are ``segment.base_offset .. end_offset`` (inclusive).

    ``after_hole`` is true when the segment starts above ``Ry + 1``: the offsets in between were
    deleted locally by Kafka's own retention before they could be uploaded.
    """

    segment: LocalSegmentInfo
    end_offset: int
    after_hole: bool


def next_segment_to_copy(segments: Sequence[LocalSegmentInfo], offsets: PartitionOffsets) -> CopyDecision | None:
    """The next segment to copy, or None when nothing is eligible yet.

    ``segments`` are the partition's local segments sorted by base offset; the last one is the
    active segment and is never copied. Segments below the log start offset ``Lx`` (being deleted by
    Kafka) are never chosen.
    """
    for current, following in itertools.pairwise(segments):
        end_offset = following.base_offset - 1
        if following.base_offset <= offsets.lx:
            continue  # entirely below the log start offset: Kafka deletes it
        if offsets.ry is not None and end_offset <= offsets.ry:
            continue  # already remote
        if following.base_offset > offsets.ly:
            return None  # holds offsets not yet stable; later ones even less so
        after_hole = offsets.ry is not None and max(current.base_offset, offsets.lx) > offsets.ry + 1
        return CopyDecision(segment=current, end_offset=end_offset, after_hole=after_hole)
    return None


def copy_lag(segments: Sequence[LocalSegmentInfo], offsets: PartitionOffsets) -> tuple[int, int]:
    """Bytes and number of the segments that are eligible for copying but not copied yet (Kafka's
    RemoteCopyLagBytes and RemoteCopyLagSegments): rolled, every offset below ``Ly``, not below the log
    start ``Lx``, and not wholly at or below the remote end ``Ry``. ``segments`` as for
    ``next_segment_to_copy``."""
    lag_bytes = lag_segments = 0
    for current, following in itertools.pairwise(segments):
        done = offsets.ry is not None and following.base_offset - 1 <= offsets.ry
        if not done and offsets.lx < following.base_offset <= offsets.ly:
            lag_bytes += current.size
            lag_segments += 1
    return lag_bytes, lag_segments
