"""Kafka's consumer as the reference for what a read_committed client keeps of fetched batches."""

from __future__ import annotations

from tiering_core.formats import AbortedTxn, RecordBatch, iter_batches


def consumer_kept(key: str, data: bytes | memoryview, aborted: list[AbortedTxn]) -> list[RecordBatch]:
    """The data batches Java's consumer delivers from one fetched partition (``CompletedFetch.nextFetchedBatch``):
    a producer joins the aborted set when a batch reaches its aborted transaction's first offset and leaves it
    at its ABORT marker (decoded, not looked up); control batches are never delivered."""
    pending = sorted(aborted, key=lambda a: a.first_offset)
    aborting: set[int] = set()
    kept = []
    for batch in iter_batches(key, data):
        h = batch.header
        while pending and pending[0].first_offset <= h.last_offset:
            aborting.add(pending.pop(0).producer_id)
        if h.is_control:
            if batch.records and batch.records[0].key[2:4] == b"\x00\x00":  # ABORT
                aborting.discard(h.producer_id)
        elif not (h.is_transactional and h.producer_id in aborting):
            kept.append(batch)
    return kept
