"""Hot-data pre-download: while the reader is idle, warm the disk cache for what consumer groups read next.

Every ``hot_data_interval_seconds``, if nothing but this preloader downloaded since the last round, it
asks the cluster (AdminClient) for the consumer groups and their committed offsets on the tiered
topics this reader knows; every committed offset below the broker's log start (and not below the
remote start) is where a catch-up read will begin, so the copy's indexes are loaded and its first
``hot_data_windows`` windows from that offset are downloaded into the disk cache: the same ranges a
``PartitionStream`` starting there asks for. Without a disk cache only the indexes are warmed. The
download rate limit and concurrency cap apply as to any read; at most ``hot_data_max_groups`` groups
are looked at per round. It never holds memory beyond the window being written.
"""

from __future__ import annotations

import threading
from typing import Protocol

from confluent_kafka import ConsumerGroupTopicPartitions
from confluent_kafka.admin import AdminClient

from reader.catalog import MetadataCatalog
from reader.config import ReaderSettings
from reader.errors import RemoteReadError
from reader.fetcher import RangeFetcher
from reader.segments import SegmentCopy
from reader.windows import windows_from
from tiering_core.kafka_client import client_properties
from tiering_core.kafka_logs import admin_client
from tiering_core.logs import get_logger

log = get_logger(__name__)


class WarmedReader(Protocol):
    """What the preloader reads through: ``reader.remote.RemoteReader``, which owns and starts it."""

    settings: ReaderSettings
    catalog: MetadataCatalog
    fetcher: RangeFetcher

    def locate(self, topic: str, partition: int, offset: int) -> SegmentCopy: ...

    def is_cached(self, copy: SegmentCopy, start: int, end: int) -> bool: ...

    def read_range(self, copy: SegmentCopy, start: int, end: int, *, cacheable: bool = False) -> bytes: ...


class HotDataPreloader:
    """Started by ``start()``, stopped by ``close()`` (idempotent). ``warmed`` counts windows downloaded."""

    def __init__(self, reader: WarmedReader, interval: float) -> None:
        self.reader = reader
        self.interval = interval
        self.settings = reader.settings
        self.admin: AdminClient | None = admin_client({"bootstrap.servers": reader.settings.bootstrap_servers,
                                   **client_properties(reader.settings.kafka_client)})  # fmt: skip
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="hot-data", daemon=True)
        self.warmed = 0
        self.rounds = 0
        self._own_bytes = 0

    def start(self) -> HotDataPreloader:
        self.thread.start()
        return self

    def close(self) -> None:
        """Stop the thread and drop the admin client (AdminClient has no ``close()``: dropping the last
        reference destroys its librdkafka handle)."""
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join(30)
        self.admin = None

    def _loop(self) -> None:
        seen = self.reader.fetcher.bytes_fetched
        while not self.stop.wait(self.interval):
            fetched = self.reader.fetcher.bytes_fetched
            busy = fetched - seen > self._own_bytes
            seen, self._own_bytes = fetched, 0
            if busy:
                continue
            try:
                self.run_once()
            except Exception as exc:  # a warm-up is best effort: log, try again next round
                log.warning("hot-data pre-download failed", error=str(exc))
            seen = self.reader.fetcher.bytes_fetched

    def committed_offsets(self) -> dict[tuple[str, int], set[int]]:
        """Committed offsets of every consumer group on the tiered topics this reader knows."""
        topics = self.reader.catalog.tiered_topics()
        admin = self.admin
        if admin is None:  # closed
            return {}
        listed = admin.list_consumer_groups(request_timeout=10).result(15)
        wanted: dict[tuple[str, int], set[int]] = {}
        for group in listed.valid[: self.settings.hot_data_max_groups]:
            futures = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group.group_id)])
            for future in futures.values():
                for tp in future.result(15).topic_partitions or []:
                    if tp.topic in topics and tp.offset >= 0 and tp.error is None:
                        wanted.setdefault((tp.topic, tp.partition), set()).add(tp.offset)
        return wanted

    def run_once(self) -> int:
        """One round; returns how many windows it downloaded."""
        self.rounds += 1
        wanted = self.committed_offsets()
        if not wanted:
            return 0
        starts = self.reader.catalog.cluster.log_start_offsets(list(wanted))
        cache = self.reader.fetcher.cache
        width = self.settings.fetch_window_bytes
        done = 0
        for (topic, partition), offsets in wanted.items():
            for offset in sorted(offsets):
                if offset >= starts[(topic, partition)] or self.stop.is_set():
                    continue
                try:
                    copy = self.reader.locate(topic, partition, offset)
                    if cache is None:
                        continue
                    for w in windows_from(copy, copy.position_for(offset), width)[: self.settings.hot_data_windows]:
                        if not self.reader.is_cached(copy, w.start, w.end):
                            data = self.reader.read_range(copy, w.start, w.end, cacheable=True)
                            self._own_bytes += len(data)
                            done += 1
                except RemoteReadError as exc:
                    log.warning("hot-data pre-download skipped a partition", topic=topic, partition=partition,
                                offset=offset, error=str(exc))  # fmt: skip
        self.warmed += done
        if done:
            log.info("hot-data pre-download warmed the cache", windows=done)
        return done
