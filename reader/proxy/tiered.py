"""What the proxy knows of tiered partitions: the broker's offsets (a short-lived cache) and the remote
copies (the metadata catalog), and the answers the broker can no longer give for data below its log start.

The broker's log start, high watermark and last stable offset of a partition come with every Fetch
answer passing through and are cached; a partition the proxy serves from remote storage before it saw
one asks the cluster (ListOffsets through the proxy's own admin client) and keeps the answer for
``offsets_cache_seconds``. The log start only grows, so a fetch offset below a cached log start is
below the current one too; a fetch offset at or above it goes to the broker, which answers
OFFSET_OUT_OF_RANGE if the log start moved past it since (then the proxy serves it from remote).

Answers for offsets below the log start, as Kafka's broker gives them with KIP-405:
- ListOffsets EARLIEST (-2): the remote start (Rx) when remote data is there; LATEST_TIERED (-5): the
  remote end (Ry); a timestamp: the first offset whose record timestamp is at or after it, from the
  copies' time indexes and then their batches, when that offset is below the broker's log start.
- OffsetForLeaderEpoch: from the leader-epoch checkpoints the copies carry, where a later epoch
  started inside the remote data (the broker truncated those epochs from its cache with the log).
"""

from __future__ import annotations

import base64
import bisect
import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from typing import NamedTuple

from metadata import WalError
from metadata.records import topic_id_bytes
from reader.batches import complete_prefix
from reader.catalog import MetadataCatalog
from reader.cursor import CursorCache, ServedBatches
from reader.errors import MemoryBusy, NotInRemote, OffsetOutOfRange, RemoteReadError, UnknownTopic, WouldBlock
from reader.remote import RemoteReader
from reader.segments import SegmentCopy
from tiering_core.formats import decode_batch, scan_headers
from tiering_core.kafka_cluster import KafkaCluster, KafkaClusterError, kafka_topic_id
from tiering_core.logs import get_logger

log = get_logger(__name__)
_TRACKED_PARTITIONS = 100_000  # partitions whose open transactions are remembered (a few bytes each)


class BrokerOffsets(NamedTuple):
    log_start: int
    high_watermark: int
    last_stable: int
    seen: float  # time.monotonic() of the answer


class TopicKey(NamedTuple):
    """One incarnation of a topic: its name and Kafka's id. A topic deleted and created again under its name
    is another key; every cache and decision of the access layer is keyed by it (docs/design.md, "Deleted and
    re-created topics")."""

    name: str
    id: uuid.UUID

    @property
    def kafka_id(self) -> str:
        """The id as Kafka prints it (the catalog's and the object keys' form)."""
        return kafka_topic_id(base64.b64encode(self.id.bytes).decode())


class TieredView:
    """Thread-safe. ``close()`` frees the cursors (the reader is closed by its owner)."""

    def __init__(self, reader: RemoteReader, cluster: KafkaCluster, cache_seconds: float, cursors: int,
                 memory_wait: float) -> None:  # fmt: skip
        self.reader = reader
        self.closed = False  # ``close``: the proxy stops
        self.catalog: MetadataCatalog = reader.catalog
        self.cluster = cluster
        self.cache_seconds = cache_seconds
        self.cursors = CursorCache(reader, cursors, memory_wait)
        self._offsets: dict[tuple[uuid.UUID, int], BrokerOffsets] = {}
        self._names: dict[uuid.UUID, str] = {}
        self._ids: dict[str, uuid.UUID] = {}  # a name's live id, as last learned
        # read_committed: transactions the remote data leaves open (their markers are the broker's only), by
        # partition: those a read stopped at, and the outcomes the broker gave (``learn_outcomes``)
        self._undecided: dict[tuple[uuid.UUID, int], Mapping[int, int]] = {}
        self._decided: dict[tuple[uuid.UUID, int], dict[tuple[int, int], bool]] = {}
        self._lock = threading.Lock()

    def close(self) -> None:
        """The proxy stops: remote reads still running in its threads may fail from here on (``closed``)."""
        self.closed = True
        self.cursors.close()

    # -- names and ids --------------------------------------------------------------------------
    def learn_name(self, topic_id: uuid.UUID | None, name: str | None) -> None:
        """The live id of a name, from a Metadata answer passing through or from the cluster. When it is not
        the id learned before, the name was deleted and created again: every cache entry of the old
        incarnation is dropped (offsets, cursors, the catalog's description)."""
        if topic_id is None or not name or not topic_id.int:
            return
        with self._lock:
            old = self._ids.get(name)
            self._ids[name], self._names[topic_id] = topic_id, name
            if old is None or old == topic_id:
                return
            self._names.pop(old, None)
            for stale in [k for k in self._offsets if k[0] == old]:
                del self._offsets[stale]
        gone = TopicKey(name, old)
        self.cursors.drop(gone.kafka_id)
        self.catalog.forget(name)
        log.info("topic deleted and created again: the old incarnation is forgotten", topic=name,
                 old_id=gone.kafka_id, new_id=TopicKey(name, topic_id).kafka_id)  # fmt: skip

    def topic_name(self, topic_id: uuid.UUID | None) -> str | None:
        """A topic id's name, from the Metadata answers seen, else the tiering metadata (tiered topics)."""
        if topic_id is None or not topic_id.int:
            return None
        with self._lock:
            found = self._names.get(topic_id)
        return found if found is not None else self.catalog.topic_name(topic_id.bytes)

    def tiered_names(self) -> set[str]:
        """Names of the topics the tiering metadata knows (the catalog follows them all): any other topic has
        no remote data, and answers about it need nothing from the copies or the cluster."""
        return self.catalog.tiered_topics()

    def known_key(self, name: str) -> TopicKey | None:
        """The name's incarnation as last learned (cheap; it may have been deleted since: ``live_key``)."""
        with self._lock:
            found = self._ids.get(name)
        return None if found is None else TopicKey(name, found)

    def live_key(self, name: str) -> TopicKey | None:
        """The name's live incarnation, asked of the cluster now (one Metadata request); None when the
        cluster has no such topic. Raises KafkaClusterError when it did not say (a timeout, no Describe)."""
        ids = self.cluster.topic_ids([name])
        if name not in ids:
            raise KafkaClusterError(f"the cluster did not tell the id of topic {name!r}")
        live = ids[name]
        if live is None:
            return None
        key = TopicKey(name, uuid.UUID(bytes=topic_id_bytes(live)))
        self.learn_name(key.id, name)
        return key

    # -- the broker's offsets -------------------------------------------------------------------
    def observe(self, answered: Iterable[tuple[TopicKey, int, int, int, int]]) -> None:
        """A broker's answer for partitions (a Fetch without error): (topic, partition, log start, high watermark,
        last stable offset) each; the newest values win. One answer's partitions under one hold of the lock."""
        seen = time.monotonic()
        with self._lock:
            offsets = self._offsets
            for topic, partition, log_start, high_watermark, last_stable in answered:
                if log_start < 0 or high_watermark < 0:
                    continue
                old = offsets.get((topic.id, partition))
                if old is not None and old.log_start > log_start and old.high_watermark >= high_watermark:
                    continue  # an older answer arriving late (log start only grows)
                offsets[(topic.id, partition)] = BrokerOffsets(log_start, high_watermark, last_stable, seen)

    def known_offsets(self, topic: TopicKey, partition: int) -> BrokerOffsets | None:
        """The broker's offsets as last seen (never asks)."""
        with self._lock:
            return self._offsets.get((topic.id, partition))

    def known_log_start(self, topic: TopicKey, partition: int) -> int | None:
        found = self.known_offsets(topic, partition)
        return None if found is None else found.log_start

    def probe_offset(self, topic: TopicKey, partition: int, settle: bool = False) -> int:
        """Where the broker is asked about a partition served from remote (``fetch.py``'s probe): its cached
        high watermark, where it has no record to send; the broker authorises a fetch whatever its offset.
        With ``settle``, its log start: a read_committed answer there lists the aborted transactions whose
        markers lie at or after it, which includes those begun in the remote part (``learn_outcomes``)."""
        found = self.known_offsets(topic, partition)
        if found is None:
            return 0
        return found.log_start if settle and found.log_start >= 0 else found.high_watermark

    # -- transactions the remote data leaves open ---------------------------------------------------
    def note_undecided(self, topic: TopicKey, partition: int, undecided: Mapping[int, int]) -> None:
        """A read_committed read stopped at these transactions (producer id -> first offset)."""
        with self._lock:
            self._undecided[(topic.id, partition)] = undecided
            while len(self._undecided) > _TRACKED_PARTITIONS:
                del self._undecided[next(iter(self._undecided))]

    def wants_outcomes(self, topic: TopicKey, partition: int) -> bool:
        """Whether a read of the partition waits for the broker to say how transactions ended."""
        with self._lock:
            return (topic.id, partition) in self._undecided

    def learn_outcomes(self, topic: TopicKey, partition: int, log_start: int, aborted: Iterable[tuple[int, int]]
                       ) -> None:  # fmt: skip
        """The broker's read_committed answer at ``log_start`` listed ``aborted`` (producer id, first offset).
        Kafka lists there every aborted transaction whose marker lies at or after the fetch offset, from the
        transaction index of the segment holding the marker, with the transaction's first offset. A transaction
        left open by the remote data began below the log start, and it was decided before its first segment
        was copied (a segment is copied only below the last stable offset): its marker is after the remote
        data, so at or after ``log_start`` unless the broker deleted it (a hole), and it is aborted exactly
        when listed."""
        listed = set(aborted)
        with self._lock:
            undecided = self._undecided.pop((topic.id, partition), None)
            if not undecided:
                return
            outcomes = self._decided.setdefault((topic.id, partition), {})
            for producer_id, first in undecided.items():
                if first < log_start:
                    outcomes[(producer_id, first)] = (producer_id, first) in listed
            while len(self._decided) > _TRACKED_PARTITIONS:
                del self._decided[next(iter(self._decided))]

    def broker_offsets(self, topic: TopicKey, partition: int, *, fresh: bool = False,
                       block: bool = True) -> BrokerOffsets:  # fmt: skip
        """The cached answer if young enough (or ``fresh`` is not asked), else asked of the cluster now
        (without ``block``: WouldBlock instead). Raises KafkaClusterError."""
        return self.refresh_offsets([(topic, partition)], fresh=fresh, block=block)[(topic.id, partition)]

    def refresh_offsets(self, partitions: Iterable[tuple[TopicKey, int]], *, fresh: bool = False,
                        block: bool = True) -> dict[tuple[uuid.UUID, int], BrokerOffsets]:  # fmt: skip
        """``broker_offsets`` of several partitions, those not cached young enough (all with ``fresh``) asked of
        the cluster together: one ListOffsets per leader and kind, not a round trip per partition (without
        ``block``: WouldBlock instead of asking). Raises KafkaClusterError."""
        now = time.monotonic()
        out: dict[tuple[uuid.UUID, int], BrokerOffsets] = {}
        ask: dict[tuple[str, int], tuple[uuid.UUID, int]] = {}
        with self._lock:
            for topic, partition in partitions:
                found = self._offsets.get((topic.id, partition))
                if found is not None and not fresh and now - found.seen < self.cache_seconds:
                    out[(topic.id, partition)] = found
                else:
                    ask[(topic.name, partition)] = (topic.id, partition)
        if ask and not block:
            raise WouldBlock(f"the broker's offsets of {len(ask)} partitions are not cached")
        if ask:
            got = self.cluster.local_offsets(list(ask))
            seen = time.monotonic()
            with self._lock:
                for key, local in got.items():
                    self._offsets[ask[key]] = out[ask[key]] = BrokerOffsets(local.lx, local.lz, local.ly, seen)
        return out

    # -- remote ---------------------------------------------------------------------------------
    def remote_range(self, topic: TopicKey, partition: int, *, current: bool = False) -> tuple[int, int] | None:
        """(Rx, Ry) when the partition has readable remote data, else None. ``current``: first wait until the
        metadata WAL's records written so far are applied (before concluding that an offset has no copy:
        the sidecar records a copy before the broker deletes the data, but the catalog follows it with a lag)."""
        if not self.catalog.recheck(0.0 if current else 10.0):  # a sidecar may have started since
            return None
        if current:
            try:
                self.catalog.catch_up()
            except WalError as exc:
                log.warning("the tiering metadata could not catch up", error=str(exc))
        try:
            rx, ry = self.catalog.remote_offsets(topic.name, partition, topic.kafka_id)
        except (UnknownTopic, KafkaClusterError):
            return None
        if rx is None or ry is None or rx > ry:
            return None
        return rx, ry

    def routes_remote(self, topic: TopicKey, partition: int, offset: int) -> bool:
        """A fetch at ``offset`` is for the remote copies: below the broker's (cached) log start, and
        within the remote data. Cheap when the partition is not below its log start."""
        log_start = self.known_log_start(topic, partition)
        if log_start is None or offset >= log_start:
            return False
        found = self.remote_range(topic, partition)
        return found is not None and found[0] <= offset <= found[1]

    def maybe_hole(self, topic: TopicKey, partition: int, offset: int) -> bool:
        """``offset`` is between the remote end the catalog knows and the broker's (cached) log start: a hole,
        unless the catalog is behind (``hole_end`` tells, waiting for the catalog to catch up). Cheap."""
        log_start = self.known_log_start(topic, partition)
        if log_start is None or offset >= log_start:
            return False
        found = self.remote_range(topic, partition)
        return found is not None and offset > found[1]

    def hole_end(self, topic: TopicKey, partition: int, offset: int) -> int | None:
        """The broker's log start when ``offset`` lies in a hole between the remote end and it (segments the
        broker's retention deleted before they were copied): the fetch continues there. None otherwise.
        Blocks until the catalog has caught up with the metadata WAL."""
        if not self.maybe_hole(topic, partition, offset):
            return None
        log_start = self.known_log_start(topic, partition)
        assert log_start is not None
        found = self.remote_range(topic, partition, current=True)  # a copy recorded since?
        if found is None or offset <= found[1]:
            return None
        log.warning("offsets deleted by the broker before they were copied are skipped", topic=topic.name,
                    partition=partition, offset=offset, remote_end=found[1], log_start=log_start)  # fmt: skip
        return log_start

    def read(self, topic: TopicKey, partition: int, offset: int, max_bytes: int, read_committed: bool,
             min_one: bool = True, block: bool = True) -> ServedBatches:  # fmt: skip
        """Whole batches from ``offset`` (``BatchCursor.read``); none when the memory pool has no room in time
        (the client asks again, as after an empty answer). Raises NotInRemote, OffsetOutOfRange and the read
        errors; without ``block``, WouldBlock where the read would wait."""
        if self.catalog.download_paused(topic.name, topic.kafka_id):
            return ServedBatches(b"", [], offset)
        try:
            with self._lock:
                decided = self._decided.get((topic.id, partition)) if read_committed else None
            return self.cursors.read(topic.name, topic.kafka_id, partition, offset, max_bytes, read_committed,
                                     min_one, decided, block)  # fmt: skip
        except MemoryBusy as exc:
            log.info("remote partition answered without records: the memory pool is full", topic=topic.name,
                     partition=partition, offset=offset, error=str(exc))  # fmt: skip
            return ServedBatches(b"", [], offset)

    # -- offsets answers ------------------------------------------------------------------------
    def earliest(self, topic: TopicKey, partition: int) -> tuple[int, int] | None:
        """(remote start, its leader epoch) for ListOffsets EARLIEST, None without remote data."""
        return self._bound(topic, partition, 0)

    def latest_tiered(self, topic: TopicKey, partition: int) -> tuple[int, int] | None:
        """(remote end, its leader epoch) for ListOffsets LATEST_TIERED (-5), None without remote data."""
        return self._bound(topic, partition, 1)

    def _bound(self, topic: TopicKey, partition: int, which: int) -> tuple[int, int] | None:
        found = self.remote_range(topic, partition, current=True)  # a client resets to it: no stale answer
        if found is None:
            return None
        copy = self._locate(topic, partition, found[which])
        return found[which], _epoch_at(copy, found[which]) if copy is not None else -1

    def offset_for_time(
        self, topic: TopicKey, partition: int, timestamp: int, below: int
    ) -> tuple[int, int, int] | None:
        """(offset, record timestamp, leader epoch) of the first record at or after ``timestamp`` among the
        remote offsets below ``below`` (the broker's log start), as Kafka's broker finds it: the first
        segment whose max timestamp reaches it, then the first batch, then the first record."""
        found = self.remote_range(topic, partition)
        if found is None:
            return None
        for segment in self.catalog.copies(topic.name, partition, topic.kafka_id):
            if segment.end_offset < found[0] or segment.max_timestamp < timestamp:
                continue
            if segment.base_offset >= below:
                return None
            copy = self.reader.indexes.get(self.catalog.ref(topic.name, partition, segment, topic.kafka_id))
            hit = self._scan_for_time(copy, timestamp, max(found[0], copy.base_offset))
            if hit is not None:
                return hit if hit[0] < below else None
        return None

    def _scan_for_time(self, copy: SegmentCopy, timestamp: int, start: int) -> tuple[int, int, int] | None:
        i = bisect.bisect_left(copy.time_timestamps, timestamp)  # the entry whose max timestamp reaches it
        from_offset = copy.time_offsets[i - 1] + 1 if i > 0 else start
        position = copy.position_for(max(from_offset, start))
        width = self.reader.settings.fetch_window_bytes
        while position < copy.size:
            end = min(copy.size, position + width)
            data = self.reader.read_range(copy, position, end)
            last_whole = position
            for h in scan_headers(copy.log_key, data[: complete_prefix(copy.log_key, data, position)]):
                last_whole = position + h.position + h.size
                if h.last_offset < start or h.max_timestamp < timestamp or h.is_control:
                    continue
                for record in decode_batch(copy.log_key, data, h).records:
                    if record.offset >= start and record.timestamp >= timestamp:
                        return record.offset, record.timestamp, h.partition_leader_epoch
            if last_whole == position:  # one batch larger than a window
                width *= 2
            position = last_whole
        return None

    def end_offset_for_epoch(self, topic: TopicKey, partition: int, epoch: int) -> tuple[int, int] | None:
        """(epoch, end offset) for OffsetForLeaderEpoch where a later epoch starts inside the remote data
        (Kafka's LeaderEpochFileCache.endOffsetFor over the copies' checkpoints); None where the broker's
        own answer stands (no remote data, or no later epoch known remotely)."""
        found = self.remote_range(topic, partition)
        if found is None:
            return None
        entries: dict[int, int] = {}
        for offset in (found[0], found[1]):  # the oldest and the newest copy's checkpoints
            copy = self._locate(topic, partition, offset)
            if copy is not None:
                for e in copy.epochs:
                    entries.setdefault(e.epoch, e.start_offset)
        epochs = sorted(entries)
        i = bisect.bisect_right(epochs, epoch)  # epochs[i]: the first one after ``epoch``
        if i >= len(epochs) or entries[epochs[i]] > found[1]:
            return None
        floor = epochs[i - 1] if i > 0 else epoch
        return floor, entries[epochs[i]]

    def _locate(self, topic: TopicKey, partition: int, offset: int) -> SegmentCopy | None:
        try:
            return self.reader.locate(topic.name, partition, offset, topic.kafka_id)
        except (NotInRemote, OffsetOutOfRange):
            return None
        except RemoteReadError as exc:
            log.warning("reading a remote copy's indexes failed", topic=topic.name, partition=partition,
                        error=str(exc))  # fmt: skip
            return None


def _epoch_at(copy: SegmentCopy, offset: int) -> int:
    """The leader epoch in force at ``offset`` by the copy's checkpoint (-1 when it has none)."""
    epoch = -1
    for e in copy.epochs:
        if e.start_offset <= offset:
            epoch = e.epoch
    return epoch
