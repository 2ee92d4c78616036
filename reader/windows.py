"""Where a sequential reader's windows begin and end in a copy's ``.log``: the unit of read-ahead, of the
memory pool and of the disk cache. Every remote reader plans the same ranges (the stream, the access layer,
the hot-data preloader), so a window one of them downloaded is a disk cache hit for the others."""

from __future__ import annotations

import bisect
from typing import NamedTuple

from reader.segments import SegmentCopy

FIRST_WINDOW = 256 * 1024  # a reader's first window: its records are decoded and delivered sooner


class WindowRange(NamedTuple):
    """Bytes ``[start, end)`` of a copy's ``.log``."""

    start: int
    end: int


def windows_from(copy: SegmentCopy, start: int, width: int, first: int = FIRST_WINDOW) -> list[WindowRange]:
    """The copy's windows from byte ``start`` (a batch boundary) on. Each ends at a batch start the offset
    index knows (or at the object's end), so windows hold whole batches: the first at the last one within
    ``first`` bytes (or the next one, when a batch is larger), the others at the last one before a
    multiple of ``width`` (the first such multiple past a batch start). From its third window on, a
    reader starting anywhere reads the same ranges as one starting at byte 0 (the disk cache's keys)."""
    size, positions = copy.size, copy.index_positions
    out: list[WindowRange] = []
    while start < size:
        i = bisect.bisect_right(positions, start)  # positions[i:] are the batch starts after ``start``
        if not out:
            limit = min((start // width + 1) * width, start + first)
        else:
            limit = (start // width + 1) * width
            while i < len(positions) and positions[i] > limit:
                limit += width
        j = bisect.bisect_right(positions, limit)  # positions[j - 1]: the last batch start <= limit
        if limit >= size:
            end = size
        elif j > i:
            end = positions[j - 1]
        else:  # the first window's batch is larger than ``first``: to the next batch start
            end = positions[j] if j < len(positions) else size
        out.append(WindowRange(start, min(end, size)))
        start = min(end, size)
    return out


def continued_in(following: SegmentCopy, after: SegmentCopy, width: int) -> list[WindowRange]:
    """The windows of ``following`` a sequential reader reads once it finished ``after``: from the batch holding
    the first offset after ``after`` (byte 0 unless the copies overlap, as after an unclean leader election,
    where the next copy begins below that offset and its first bytes repeat offsets already read)."""
    return windows_from(following, following.position_for(after.end_offset + 1), width)
