"""Driver-side planning: offset ranges per partition, then input slices of at most ``max_slice_bytes``.

Reads copies' indexes through the read core (``RemoteReader.indexes``: the whole ``.indexes`` object, checked
against its manifest's size and CRC-32C, parsed once, as the executors read them): the offset index to find
batch boundaries, the transaction index for aborted transactions, the last copy's producer snapshot for the
transactions still open at the end of the remote data, and the time index to turn a timestamp into an offset.
A copy read whole, without transactions, needs none of it. Ranges are inclusive ``[first, last]``.

The remote data ends at its *stable* end: records of a transaction that was still open when the last
copied segment rolled are left for a later run, since whether it commits is not yet in the remote
data (the broker's last stable offset, for the remote copy).
"""

from __future__ import annotations

import bisect
import itertools
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from reader.listing import Copy, ListingCatalog, RemotePartition
from reader.remote import RemoteReader
from reader.segments import SegmentCopy
from reader.spark.slices import SegmentSlice, read_slices, slice_reader
from tiering_core.errors import TieringError
from tiering_core.stores.base import RemoteStore

EARLIEST = -2
LATEST = -1
_GETS = 16  # the planning's GETs at a time (indexes only; an executor reads records with two)
_TIME_SCAN_WINDOW = 4 << 20  # the scan for a timestamp's offset stops at the first record at or after it


class OffsetOutOfRange(TieringError):
    """A requested starting offset is below the remote start: retention deleted it. Start later, or set
    failOnDataLoss=false to start at the remote start."""


@dataclass(frozen=True)
class PartitionRange:
    """What a read covers of one partition: offsets ``[first, last]``, or nothing (``last < first``)."""

    topic: str
    topic_id: str
    partition: int
    first: int
    last: int
    remote_start: int
    stable_end: int


def plan_reader(store: RemoteStore, partitions: list[RemotePartition]) -> RemoteReader[ListingCatalog]:
    """The read core the planning of these partitions reads indexes (and a timestamp scan's records) through;
    ``close()`` it (a context manager)."""
    return slice_reader(store, partitions, _TIME_SCAN_WINDOW, gets=_GETS)


def _indexes(reader: RemoteReader, copy: Copy) -> SegmentCopy:
    """The copy's parsed indexes (its manifest came with the listing). Raises RemoteObjectMissing,
    RemoteDataCorrupt (naming the ``.indexes`` key) or RemoteUnavailable."""
    return reader.indexes.get(copy.manifest.ref, copy.manifest)


def stable_end(reader: RemoteReader, rp: RemotePartition) -> int:
    """The last remote offset below every transaction still open at the end of the remote data."""
    last = rp.copies[-1]
    if not last.manifest.index_parts.get("producer_snapshot", (0, 0))[1]:
        return rp.end
    open_txns = _indexes(reader, last).open_txns or {}
    return min([rp.end, *(first - 1 for first in open_txns.values())])


def resolve_range(
    reader: RemoteReader, rp: RemotePartition, start: int | None, end_exclusive: int | None,
    start_ts: int | None = None, end_ts: int | None = None, *, fail_on_data_loss: bool = True,
) -> PartitionRange:  # fmt: skip
    """Turn Spark-style offsets (-2 earliest, -1 latest, end exclusive) or timestamps into a range."""
    stable = stable_end(reader, rp)
    first = rp.start if start is None or start == EARLIEST else start
    if start_ts is not None:
        first = max(first, offset_for_timestamp(reader, rp, start_ts, stable))
    if first < rp.start:
        if fail_on_data_loss:
            raise OffsetOutOfRange(
                f"{rp.topic}-{rp.partition}: starting offset {first} is below the remote start {rp.start} "
                "(deleted by retention or delete_records)"
            )
        first = rp.start
    last = stable if end_exclusive is None or end_exclusive == LATEST else min(stable, end_exclusive - 1)
    if end_ts is not None:
        last = min(last, offset_for_timestamp(reader, rp, end_ts, stable) - 1)
    return PartitionRange(rp.topic, rp.topic_id, rp.partition, first, last, rp.start, stable)


def offset_for_timestamp(reader: RemoteReader, rp: RemotePartition, timestamp: int, stable: int) -> int:
    """The earliest offset whose record timestamp is >= ``timestamp`` (Kafka's ListOffsets by time);
    ``stable + 1`` if there is none. Reads windows of records (``plan_reader``): memory stays bounded."""
    threshold = pa.scalar(timestamp * 1000, pa.timestamp("us", tz="UTC"))
    for copy in rp.copies:
        if copy.manifest.max_timestamp < timestamp:
            continue
        indexed = _indexes(reader, copy)
        # Time index entries (T, O): T is the largest timestamp up to the batch ending at O, so every record
        # up to the last entry with T < timestamp is too old; scan batches from there.
        below = [o for t, o in zip(indexed.time_timestamps, indexed.time_offsets, strict=True) if t < timestamp]
        start_at = max(copy.first, below[-1] + 1 if below else copy.first)
        part = SegmentSlice(rp.topic, rp.partition, copy, indexed.position_for(start_at), copy.manifest.log_size,
                            start_at, copy.last)  # fmt: skip
        for batch in read_slices(reader, [part]):
            late = pc.greater_equal(batch.column("timestamp"), threshold)
            index = pc.index(late, True).as_py()
            if index >= 0:
                return min(batch.column("offset")[index].as_py(), stable + 1)
    return stable + 1


def plan_slices(
    reader: RemoteReader, partitions: list[RemotePartition], ranges: list[PartitionRange], max_slice_bytes: int
) -> list[SegmentSlice]:
    """Input slices for the ranges: one per copy, large copies split at batch boundaries (``plan_reader``)."""
    with ThreadPoolExecutor(_GETS) as pool:
        aborts = list(pool.map(lambda job: _aborted(reader, *job), zip(partitions, ranges, strict=True)))
        jobs = [
            (copy, rng, aborted)
            for rp, rng, aborted in zip(partitions, ranges, aborts, strict=True)
            for copy in rp.copies
            if copy.last >= rng.first and copy.first <= rng.last
        ]
        nested = list(pool.map(lambda job: _copy_slices(reader, *job, max_slice_bytes), jobs))
    return [s for group in nested for s in group]


def _aborted(reader: RemoteReader, rp: RemotePartition, rng: PartitionRange) -> list[tuple[int, int, int]]:
    """(producer id, first, last offset) of the aborted transactions that meet the range.

    A transaction's entry is in the transaction index of the copy holding its ABORT marker, which can be
    after the range's end, so every copy from the range's start on is consulted (most have none).
    """
    out = []
    for copy in rp.copies:
        if copy.last < rng.first or rng.last < rng.first or not copy.manifest.index_parts["txn"][1]:
            continue
        for t in _indexes(reader, copy).aborted:
            if t.last_offset >= rng.first and t.first_offset <= rng.last:
                out.append((t.producer_id, t.first_offset, t.last_offset))
    return out


def _copy_slices(
    reader: RemoteReader, copy: Copy, rng: PartitionRange, aborted: list[tuple[int, int, int]], max_slice_bytes: int
) -> list[SegmentSlice]:
    m = copy.manifest
    first = max(copy.first, rng.first)
    last = min(copy.last, rng.last)
    mine = tuple(t for t in aborted if t[2] >= first and t[1] <= last)
    whole = first == m.base_offset and last >= m.end_offset
    if whole and m.log_size <= max_slice_bytes:
        return [SegmentSlice(rng.topic, rng.partition, copy, 0, m.log_size, first, last, mine)]
    indexed = _indexes(reader, copy)
    offsets, positions = indexed.index_offsets, indexed.index_positions
    i = bisect.bisect_right(offsets, first) - 1
    start = positions[i] if i >= 0 else 0
    j = bisect.bisect_left(offsets, last)
    end = positions[j + 1] if j + 1 < len(positions) else m.log_size
    bounds = [start]
    for p in positions:
        if bounds[-1] + max_slice_bytes <= p < end:
            bounds.append(p)
    bounds.append(end)
    return [
        SegmentSlice(rng.topic, rng.partition, copy, a, b, first, last, mine) for a, b in itertools.pairwise(bounds)
    ]
