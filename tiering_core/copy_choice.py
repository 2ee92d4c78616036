"""Which remote copy holds an offset where copies overlap: one rule, for the metadata's rows and the listing's
manifests alike.

Copies overlap after a leader change (the new leader's segment boundaries differ from the old one's), after an
unclean election (the new leader's log is the partition's from where the two diverge), and, until the sweeper
deletes one, when a segment was copied twice. Each copy has a rank: the leader epoch it was made under, then its
base offset, then the order it was made in (``Manifest.preference``; the metadata's rows rank the same way,
``PartitionSegments.rank``). ``holder`` answers a point query: the highest-ranked copy holding an offset.
``walk`` is what a sequential reader reads: from where it enters a copy to that copy's end, then on from the
next offset (over holes: offsets no copy holds, deleted before their upload).

Point query and walk can differ inside an overlap: with copies A [0, 100] of epoch 1 and B [50, 150] of
epoch 2, a reader starting at 60 reads B, a reader walking from 0 reads A to 100, then B. Every reader (the
stream, the cursors, the access layer, the Spark source) does the same, over either catalog; what it means
after an unclean election is in docs/design.md ("One copy-choice rule", "Known limits").
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator, Sequence
from typing import Any


def holder(
    offset: int, order: Sequence[int], base: Sequence[int], end: Sequence[int], rank: Callable[[int], Any],
    max_span: int,
) -> int | None:  # fmt: skip
    """The highest-ranked row holding ``offset``, or None. ``order``: the rows by base offset; ``base`` and
    ``end``: per row, inclusive; ``rank(row)``: comparable, None for a row that holds nothing (an unfinished
    copy); ``max_span``: no row ends more than this past its base (it bounds the scan back from ``offset``)."""
    i = bisect.bisect_right(order, offset, key=base.__getitem__) - 1
    best, best_rank = None, None
    while i >= 0:
        row = order[i]
        if base[row] < offset - max_span:
            break
        if end[row] >= offset:
            row_rank = rank(row)
            if row_rank is not None and (best_rank is None or row_rank > best_rank):
                best, best_rank = row, row_rank
        i -= 1
    return best


def walk(
    order: Sequence[int], base: Sequence[int], end: Sequence[int], rank: Callable[[int], Any], max_span: int
) -> Iterator[tuple[int, int, int]]:
    """(row, first, last) for each copy a reader walking the rows from the lowest offset reads, in order: the
    holder of each offset it reaches, from there to that copy's end."""
    offset = min((base[r] for r in order if rank(r) is not None), default=None)
    starts = [base[r] for r in order]
    while offset is not None:
        row = holder(offset, order, base, end, rank, max_span)
        if row is not None:
            yield row, offset, end[row]
            offset = end[row] + 1
            continue
        i = bisect.bisect_right(starts, offset)
        offset = next((base[r] for r in order[i:] if rank(r) is not None), None)  # over a hole
