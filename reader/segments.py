"""A remote copy's manifest and indexes, fetched once and cached.

The manifest (JSON, written last by the copier) says where each index lives inside the copy's
``.indexes`` object (``tiering_core/objects.py``). The whole ``.indexes`` object is read (it is small:
a sparse offset index, the aborted transactions, a producer snapshot and leader epochs), checked
against the manifest's size and CRC-32C, and parsed; only the parsed offset index, aborted
transactions and open transactions are kept, for at most ``index_cache_segments`` copies.
"""

from __future__ import annotations

import bisect
import threading
from array import array
from collections import OrderedDict
from dataclasses import dataclass

import crc32c

from reader.errors import RemoteDataCorrupt
from reader.fetcher import RangeFetcher
from tiering_core.errors import FormatError
from tiering_core.formats import (
    AbortedTxn,
    EpochEntry,
    parse_leader_epoch_checkpoint,
    parse_offset_index,
    parse_producer_snapshot,
    parse_time_index,
    parse_txn_index,
)
from tiering_core.objects import MANIFEST_MAX_BYTES, Manifest, ManifestError, SegmentRef


@dataclass(frozen=True, slots=True)
class SegmentCopy:
    """One finished remote copy, ready to read: keys, manifest and parsed indexes (offsets inclusive).

    ``open_txns`` maps a producer id to the first offset of its transaction still open at the end of
    the copy (from the producer snapshot Kafka took when the segment rolled); None when the copy has
    no producer snapshot. ``time_timestamps``/``time_offsets`` are the time index (ListOffsets by
    timestamp); ``epochs`` the partition's leader-epoch checkpoint as it was when the copy was made
    (OffsetForLeaderEpoch).
    """

    ref: SegmentRef
    manifest: Manifest
    log_key: str
    index_offsets: array
    index_positions: array
    aborted: tuple[AbortedTxn, ...]
    open_txns: dict[int, int] | None
    time_timestamps: array
    time_offsets: array
    epochs: tuple[EpochEntry, ...]

    @property
    def base_offset(self) -> int:
        return self.manifest.base_offset

    @property
    def end_offset(self) -> int:
        return self.manifest.end_offset

    @property
    def size(self) -> int:
        return self.manifest.log_size

    def position_for(self, offset: int) -> int:
        """Byte position of the batch to start reading at for ``offset`` (the offset index's floor entry).

        The batch there may start before ``offset``: the caller skips records below it.
        """
        i = bisect.bisect_right(self.index_offsets, offset) - 1
        return self.index_positions[i] if i >= 0 else 0


def _part(manifest: Manifest, data: bytes, name: str) -> bytes:
    position, length = manifest.index_parts.get(name, (0, 0))
    return data[position : position + length]


class SegmentIndexCache:
    """Loads and caches ``SegmentCopy`` values (least recently used dropped first)."""

    def __init__(self, fetcher: RangeFetcher, capacity: int) -> None:
        self.fetcher = fetcher
        self.capacity = capacity
        self.lock = threading.Lock()
        self.entries: OrderedDict[SegmentRef, SegmentCopy] = OrderedDict()

    def get(self, ref: SegmentRef, manifest: Manifest | None = None) -> SegmentCopy:
        """The copy's manifest and indexes; ``manifest``: the copy's, already read (an object listing's), so only
        the indexes are fetched. Raises RemoteObjectMissing, RemoteDataCorrupt, RemoteUnavailable."""
        with self.lock:
            found = self.entries.get(ref)
            if found is not None:
                self.entries.move_to_end(ref)
                return found
        copy = self._load(ref, manifest)
        with self.lock:
            self.entries[ref] = copy
            while len(self.entries) > self.capacity:
                self.entries.popitem(last=False)
        return copy

    def _load(self, ref: SegmentRef, manifest: Manifest | None) -> SegmentCopy:
        manifest_key = ref.key("manifest")
        if manifest is None:
            try:
                manifest = Manifest.decode(self.fetcher.get_object(manifest_key, MANIFEST_MAX_BYTES), manifest_key)
            except ManifestError as exc:
                raise RemoteDataCorrupt(manifest_key, 0, str(exc)) from exc
        if (manifest.topic_id, manifest.partition, manifest.base_offset, manifest.segment_id) != (
            ref.topic_id, ref.partition, ref.base_offset, ref.segment_id,
        ):  # fmt: skip
            raise RemoteDataCorrupt(manifest_key, 0, f"the manifest describes another copy: {manifest.ref}")
        index_key = ref.key("indexes")
        data = b""
        if manifest.indexes_size:
            data = self.fetcher.get(index_key, 0, manifest.indexes_size)  # one byte more: a longer object shows
        if len(data) != manifest.indexes_size:
            raise RemoteDataCorrupt(index_key, len(data), f"object has {len(data)}+ bytes, the manifest says "
                                    f"{manifest.indexes_size}")  # fmt: skip
        if crc32c.crc32c(data) != manifest.indexes_crc32c:
            raise RemoteDataCorrupt(index_key, 0, "CRC-32C does not match the manifest")
        try:
            entries = [
                e for e in parse_offset_index(_part(manifest, data, "offset"), manifest.base_offset)
                if e.position < manifest.log_size
            ]  # fmt: skip
            aborted = tuple(parse_txn_index(_part(manifest, data, "txn"), index_key))
            times = [e for e in parse_time_index(_part(manifest, data, "time"), manifest.base_offset)
                     if e.offset <= manifest.end_offset]  # fmt: skip
            epochs = tuple(parse_leader_epoch_checkpoint(_part(manifest, data, "leader_epoch").decode(), index_key))
            snapshot = _part(manifest, data, "producer_snapshot")
            producers = parse_producer_snapshot(snapshot, index_key) if snapshot else None
        except (FormatError, UnicodeDecodeError) as exc:
            raise RemoteDataCorrupt(index_key, getattr(exc, "position", 0), getattr(exc, "reason", str(exc))) from exc
        open_txns = None
        if producers is not None:
            open_txns = {
                p.producer_id: p.current_txn_first_offset for p in producers if p.current_txn_first_offset >= 0
            }
        return SegmentCopy(
            ref=ref,
            manifest=manifest,
            log_key=ref.key("log"),
            index_offsets=array("q", (e.offset for e in entries)),
            index_positions=array("q", (e.position for e in entries)),
            aborted=aborted,
            open_txns=open_txns,
            time_timestamps=array("q", (e.timestamp for e in times)),
            time_offsets=array("q", (e.offset for e in times)),
            epochs=epochs,
        )
