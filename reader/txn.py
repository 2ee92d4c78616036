"""read_committed: which transactional batches to drop, exactly as Kafka's consumer drops them.

Kafka's broker sends a fetch's aborted transactions (producer id, first offset) from the transaction
indexes (``.txnindex``) of the segments from the fetched one onward; the consumer walks the batches in
order, adds a producer to the aborted set once a batch reaches that first offset, drops that
producer's transactional batches while it is there, removes it at its ABORT marker, and never
delivers control batches. ``AbortFilter`` is that walk.

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
from tiering_core.formats import AbortedTxn, BatchHeader, control_marker, decode_batch
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


class AbortFilter:
    """Decides batch by batch, in offset order, from ``start`` offset on (Kafka's consumer logic)."""

    __slots__ = ("aborted", "aborting", "next", "unresolved")

    def __init__(self, view: TxnView, start: int) -> None:
        self.aborted = [a for a in view.aborted if a.last_offset >= start]
        self.next = 0
        self.aborting: set[int] = set()
        self.unresolved = view.unresolved

    def keep(self, name: str, buf: bytes | memoryview, header: BatchHeader) -> bool:
        """Whether the batch's records are delivered. Control batches never are."""
        if header.producer_id >= 0:
            aborted, i = self.aborted, self.next
            while i < len(aborted) and aborted[i].first_offset <= header.last_offset:
                self.aborting.add(aborted[i].producer_id)
                i += 1
            self.next = i
        if header.is_control:
            if header.producer_id in self.aborting:
                records = decode_batch(name, buf, header).records
                if records and control_marker(records[0]).kind == "ABORT":
                    self.aborting.discard(header.producer_id)
            return False
        return not (header.is_transactional and header.producer_id in self.aborting)

    def unresolved_at(self, header: BatchHeader) -> bool:
        """The batch belongs to a transaction whose outcome is beyond the remote data."""
        if not header.is_transactional:
            return False
        first = self.unresolved.get(header.producer_id)
        return first is not None and header.last_offset >= first
