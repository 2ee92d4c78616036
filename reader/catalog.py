"""A read-only metadata catalog for readers that run without a sidecar.

It recovers the tiering metadata exactly as a sidecar does (the newest valid snapshot, local if
``state_dir`` is given, else from the remote store; then the WAL tail) and keeps following the WAL,
but only the WAL partitions that the watched topics hash to (``MetadataWal.partition_of``), so
start-up costs what those topics cost. It never creates the WAL topic, never writes and never takes
snapshots (``MetadataManager(read_only=True)``).

Topic ids come from the Kafka cluster (the live incarnation of the name), else from the metadata. The
questions about a topic take its name and, optionally, the id of the incarnation meant (``topic_id``,
Kafka's base64 form): a reader that knows the id (the access layer, from the client's request or the
cluster) asks by it, so a topic deleted and created again under its name is never answered with the other
incarnation's copies.
Offsets are inclusive. Where copies overlap (after a leader change) the choice is the metadata's own
``segment_for_offset`` (``tiering_core.copy_choice``: the copy of the higher leader epoch, then the higher
base offset, then the later one); every reader makes the same choice.
"""

from __future__ import annotations

import tempfile
import threading
import time
import uuid
from collections.abc import Iterable
from pathlib import Path

from metadata import MetadataManager, MetadataWal, RemoteSegment, StoreSnapshots, WalError, snapshot_prefix
from metadata.records import topic_id_bytes
from reader.config import ReaderSettings
from reader.errors import UnknownTopic
from segment_fsm import SegmentState, TopicTiering
from tiering_core.kafka_client import client_properties
from tiering_core.kafka_cluster import KafkaCluster, KafkaClusterError, TopicInfo
from tiering_core.logs import get_logger
from tiering_core.objects import SegmentRef
from tiering_core.stores.base import RemoteStore

_FINISHED = (SegmentState.COPY_SEGMENT_FINISHED,)
log = get_logger(__name__)


class MetadataCatalog:
    """Which remote copies exist, for the topics being read. Thread-safe; ``close()`` is idempotent."""

    def __init__(self, settings: ReaderSettings, store: RemoteStore, cluster: KafkaCluster,
                 topics: Iterable[str] | None = None) -> None:  # fmt: skip
        self.settings = settings
        self.cluster = cluster
        self.wal = MetadataWal(settings.bootstrap_servers, settings.metadata_topic,
                               client_config=client_properties(settings.kafka_client))  # fmt: skip
        self._watched: set[str] = set(topics) if topics is not None else set()
        self._all = topics is None
        self._infos: dict[str, TopicInfo] = {}
        self._lock = threading.Lock()
        self.absent = False  # the cluster has no WAL topic: no sidecar ever ran
        self._checked = 0.0
        snapshots = settings.state_dir / "snapshots" if settings.state_dir else Path(tempfile.gettempdir()) / "-none-"
        self.manager = MetadataManager(
            self.wal, snapshots, remote=StoreSnapshots(store),
            remote_prefix=snapshot_prefix(settings.metadata_topic), read_only=True,
        )  # fmt: skip

    # -- life cycle ---------------------------------------------------------------------------
    def start(self) -> MetadataCatalog:
        """Recover and start following. Where no sidecar ever ran (no WAL topic), nothing is remote: the
        catalog stays empty (and a TieredConsumer is a plain consumer) until ``recheck`` finds the topic."""
        try:
            self.wal.ensure_topic(create=False)
        except WalError as exc:
            log.info("no tiering metadata in this cluster: nothing is read from remote storage", reason=str(exc))
            self.absent = True
            self._checked = time.monotonic()
            return self
        self.absent = False
        if not self._all:
            self.manager.wal_partitions = self._wal_partitions(self._watched)
        self.manager.start()
        return self

    def recheck(self, interval: float = 10.0) -> bool:
        """For a long-running reader (the proxy, the HTTP service) started before any sidecar: look for the
        WAL topic again, at most every ``interval`` seconds, and start following it once it exists.
        Returns whether the catalog follows the metadata now."""
        if not self.absent:
            return True
        with self._lock:
            if time.monotonic() - self._checked < interval:
                return False
            self._checked = time.monotonic()
        try:
            self.wal.ensure_topic(create=False)
        except WalError:
            return False
        log.info("tiering metadata found: following it", topic=self.settings.metadata_topic)
        self.start()
        return not self.absent

    def close(self) -> None:
        """Stop following and release the Kafka clients: the WAL's and ``cluster``'s (the catalog owns the
        cluster it is given)."""
        try:
            if self.absent:
                self.wal.close()
            else:
                self.manager.close()
        finally:
            self.cluster.close()

    def __enter__(self) -> MetadataCatalog:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def watch(self, topics: Iterable[str]) -> None:
        """Make sure the metadata of these topics' live incarnations is recovered and followed. Each topic's id
        is confirmed with the cluster (``live_topic``): a topic deleted and created again under its name is
        another topic, whose id hashes to other WAL partitions, and no read may go to the deleted one's copies."""
        names = set(topics)
        if self.absent:
            return
        wanted = self._wal_partitions(names, live=True)
        self._watched |= names
        if not self._all:
            self.manager.follow_more(wanted)

    def _wal_partitions(self, topics: Iterable[str], *, live: bool = False) -> set[int]:
        wanted: set[int] = set()
        for name in topics:
            info = self.live_topic(name) if live else self.topic_info(name)
            tid = topic_id_bytes(info.topic_id)
            wanted.add(self.wal.partition_of(tid, None))
            wanted.update(self.wal.partition_of(tid, p.partition) for p in info.partitions)
        return wanted

    def catch_up(self, timeout: float = 30.0) -> None:
        """Wait until the WAL records written so far are applied (before concluding an offset is not remote)."""
        if not self.absent:
            self.manager.catch_up(timeout)

    # -- topics -------------------------------------------------------------------------------
    def topic_info(self, topic: str, *, fresh: bool = False) -> TopicInfo:
        """The topic as the Kafka cluster describes it (id, partitions), cached; ``fresh``: described now,
        replacing the cached incarnation (dropped when the cluster has no such topic). Raises UnknownTopic."""
        with self._lock:
            info = None if fresh else self._infos.get(topic)
        if info is None:
            try:
                info = self.cluster.topics([topic])[topic]
            except KafkaClusterError as exc:
                self.forget(topic)
                raise UnknownTopic(
                    f"topic {topic!r} is unknown to the cluster at {self.cluster.bootstrap}: {exc}"
                ) from exc
            with self._lock:
                self._infos[topic] = info
        return info

    def live_topic(self, topic: str) -> TopicInfo:
        """``topic_info`` with the cached id confirmed by the cluster now (one Metadata request): a topic
        deleted since, or deleted and created again under its name (another id), is described afresh.
        Raises UnknownTopic."""
        try:
            live = self.cluster.topic_ids([topic])
        except KafkaClusterError:
            live = {}
        with self._lock:
            cached = self._infos.get(topic)
        if cached is not None and topic in live and live[topic] == cached.topic_id:
            return cached
        return self.topic_info(topic, fresh=True)

    def forget(self, topic: str) -> None:
        """Drop the cached description of the topic (its incarnation is not the live one any more)."""
        with self._lock:
            self._infos.pop(topic, None)

    def topic_id(self, topic: str) -> str:
        """Kafka's id of the live topic with this name; for a deleted topic, the newest one in the metadata."""
        try:
            return self.topic_info(topic).topic_id
        except UnknownTopic:
            found = self.manager.topic_state(topic)
            if found is None:
                raise
            return found[0]

    def user_log_starts(self, topic: str) -> dict[str, dict[int, int]]:
        """``{topic id: {partition: offset}}``: the log start offsets users set with ``delete_records`` on the
        topic's partitions, as the sidecars recorded them (partitions without one left out; empty for a
        topic the metadata does not know)."""
        if self.absent:
            return {}
        try:
            topic_id = self.topic_id(topic)
        except UnknownTopic:
            return {}
        tid = topic_id_bytes(topic_id)
        with self.manager.lock:
            found = {n: p.log_starts.log_start for (t, n), p in self.manager.state.partitions.items() if t == tid}
        starts = {n: offset for n, offset in sorted(found.items()) if offset >= 0}
        return {topic_id: starts} if starts else {}

    def tiering(self, topic: str, topic_id: str | None = None) -> TopicTiering | None:
        """The topic's tiering state (enabled, download paused...), None if it was never tiered."""
        return self.manager.tiering(topic_id or self.topic_id(topic))

    def topic_name(self, topic_id: bytes) -> str | None:
        """The name of the topic with this id (16 raw bytes) in the tiering metadata, None if unknown."""
        with self.manager.lock:
            found = self.manager.state.topics.get(topic_id)
        return None if found is None else found[0]

    def tiered_topics(self) -> set[str]:
        """Names of the topics whose tiering metadata this catalog holds (enabled or rolled back)."""
        with self.manager.lock:
            return {name for name, _ in self.manager.state.topics.values()}

    def download_paused(self, topic: str, topic_id: str | None = None) -> bool:
        """``tiering topic pause-download`` is in force for the topic."""
        tiering = self.tiering(topic, topic_id)
        return tiering is not None and tiering.download_paused

    # -- segments -----------------------------------------------------------------------------
    def copies(self, topic: str, partition: int, topic_id: str | None = None) -> list[RemoteSegment]:
        """The partition's COPY_SEGMENT_FINISHED copies in base-offset order (overlaps included)."""
        return self.manager.segments(topic_id or self.topic_id(topic), partition, _FINISHED)

    def copy_for_offset(
        self, topic: str, partition: int, offset: int, topic_id: str | None = None
    ) -> RemoteSegment | None:
        """The finished copy holding ``offset`` (deterministic among overlapping copies), or None."""
        return self.manager.segment_for_offset(topic_id or self.topic_id(topic), partition, offset)

    def remote_offsets(self, topic: str, partition: int, topic_id: str | None = None) -> tuple[int | None, int | None]:
        """(Rx, Ry): remote start and end offsets (inclusive), (None, None) while nothing is remote.

        Rx is never below the log start offset a user set with ``delete_records`` (as the sidecar recorded
        it): the records below are deleted for every reader, as in the broker, even while a copy that
        straddles that offset still holds them. Rx may then exceed Ry: nothing remote is readable."""
        found = self.manager.remote_bounds(topic_id or self.topic_id(topic), partition)
        if found is None or found[0] is None:
            return None, None
        rx, ry, log_start = found
        return max(rx, log_start), ry

    def ref(self, topic: str, partition: int, segment: RemoteSegment, topic_id: str | None = None) -> SegmentRef:
        """The object keys' identity of a copy."""
        return SegmentRef(topic, topic_id or self.topic_id(topic), partition, segment.base_offset,
                          uuid.UUID(bytes=segment.segment_id))  # fmt: skip
