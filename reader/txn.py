"""read_committed: which transactional batches to drop, exactly as Kafka's consumer drops them.

Kafka's broker sends a fetch's aborted transactions (producer id, first offset) from the transaction
indexes (``.txnindex``) of the segments from the fetched one onward; the consumer walks the batches in
order, adds a producer to the aborted set once a batch reaches that first offset, drops that
producer's transactional batches while it is there, removes it at its ABORT marker, and never
delivers control batches. The index entry's last offset is that marker's offset, so the walk drops
exactly the transactional batches of producer P whose base offset lies in an aborted transaction's
[first offset, last offset] of P: ``AbortedRanges`` is that rule, the one every reader applies (the
TieredConsumer, HTTP service and access layer through ``AbortFilter``, the Spark source's Python loop
directly, and its compiled decoder the same comparison in ``native/src/columns.rs``). No marker
needs decoding.

The index entry of an aborted transaction sits in the segment holding its ABORT marker, which may be
after the segment being read, so ``transactions_for`` scans forward through the later copies until
the producer snapshot (Kafka's producer state when the segment rolled) shows no transaction touching
the segment still open. A transaction still open at the end of the last remote copy has its outcome
beyond the remote data: its producer is *unresolved* from its first offset on, and the reader stops
there (the broker serves it if it still has that offset; else the reader waits for the next upload).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import NamedTuple

from reader.segments import SegmentCopy
from tiering_core.formats import AbortedTxn, BatchHeader
from tiering_core.logs import get_logger

log = get_logger(__name__)


class TxnView(NamedTuple):
    """Aborted transactions touching a copy, and producers whose transaction outcome is not remote yet."""

    aborted: list[AbortedTxn]
    unresolved: dict[int, int]  # producer id -> first offset of its transaction with an unknown outcome


def transactions_for(copy: SegmentCopy, following: Iterable[SegmentCopy]) -> TxnView:
    """The transactions view of ``copy``; ``following`` yields the later remote copies in offset order
    (loaded lazily: usually the scan stops at ``copy`` itself)."""
    aborted: list[AbortedTxn] = []
    open_txns: dict[int, int] = {}
    known = False
    for c in itertools.chain((copy,), following):
        aborted += [a for a in c.aborted if a.last_offset >= copy.base_offset and a.first_offset <= copy.end_offset]
        if c.open_txns is None:
            known = False
            continue
        known = True
        open_txns = {pid: first for pid, first in c.open_txns.items() if first <= copy.end_offset}
        if not open_txns:
            return TxnView(sorted(aborted, key=lambda a: a.first_offset), {})
    if not known:
        log.warning("no producer snapshot in the last remote copy; transactions treated as resolved",
                    key=copy.log_key)  # fmt: skip
        open_txns = {}
    return TxnView(sorted(aborted, key=lambda a: a.first_offset), open_txns)


class AbortedRanges:
    """Whether a transactional batch is aborted, batch by batch in offset order (amortised O(1)).
    ``ranges``: (producer id, first offset, last offset) of aborted transactions."""

    __slots__ = ("_next", "_open", "_ranges")

    def __init__(self, ranges: Iterable[tuple[int, int, int]]) -> None:
        self._ranges = sorted(ranges, key=lambda r: r[1])
        self._next = 0
        self._open: dict[int, int] = {}  # producer id -> last offset of its aborted transaction begun so far

    def aborts(self, producer_id: int, base_offset: int) -> bool:
        """A transactional batch of ``producer_id`` at ``base_offset`` is one of an aborted transaction."""
        ranges, i = self._ranges, self._next
        while i < len(ranges) and ranges[i][1] <= base_offset:
            self._open[ranges[i][0]] = ranges[i][2]
            i += 1
        self._next = i
        last = self._open.get(producer_id)
        return last is not None and base_offset <= last


class AbortFilter:
    """Decides batch by batch, in offset order, from ``start`` offset on (Kafka's consumer logic)."""

    __slots__ = ("ranges", "unresolved")

    def __init__(self, view: TxnView, start: int) -> None:
        self.ranges = AbortedRanges((a.producer_id, a.first_offset, a.last_offset)
                                    for a in view.aborted if a.last_offset >= start)  # fmt: skip
        self.unresolved = view.unresolved

    def keep(self, header: BatchHeader) -> bool:
        """Whether the batch's records are delivered. Control batches never are."""
        if header.is_control:
            return False
        return not (header.is_transactional and self.ranges.aborts(header.producer_id, header.base_offset))

    def unresolved_at(self, header: BatchHeader) -> bool:
        """The batch belongs to a transaction whose outcome is beyond the remote data."""
        if not header.is_transactional:
            return False
        first = self.unresolved.get(header.producer_id)
        return first is not None and header.last_offset >= first
