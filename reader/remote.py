"""The remote partition reader: offset -> finished copy -> offset index -> ranged GETs of just the bytes needed.

``RemoteReader`` owns what every remote read shares: the catalog (either ``CopyCatalog``: the metadata WAL's
or the object listing's), the fetcher (retries, rate limit, concurrency cap, disk cache), the index cache, the
memory pool and the download threads.
The cursors of reader/cursor.py read whole batches with read-ahead for the access layer and the HTTP
service; ``stream(...)`` (reader/stream.py) decodes records sequentially with read-ahead (the consumer's).

What it serves is verified: each batch's CRC-32C, offsets inside the copy and growing, the object's
size against the manifest (a GET asks for one byte more than the manifest's size, so a longer
object shows), and the whole object's CRC-32C when a read covers all of it. A missing object or a
mismatch raises an error naming the key; nothing of a damaged range is returned.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Generic, TypeVar

import crc32c

from reader.catalog import MetadataCatalog
from reader.config import ReaderSettings
from reader.copy_catalog import CopyCatalog
from reader.errors import NotInRemote, OffsetOutOfRange, RemoteDataCorrupt, RemoteObjectMissing
from reader.fetcher import RangeFetcher
from reader.hotdata import HotDataPreloader
from reader.pool import MemoryPool
from reader.segments import SegmentCopy, SegmentIndexCache
from reader.txn import TxnView, transactions_for
from tiering_core.kafka_client import client_properties
from tiering_core.kafka_cluster import KafkaCluster
from tiering_core.logs import get_logger
from tiering_core.stores.base import RemoteStore
from tiering_core.stores.factory import open_store

log = get_logger(__name__)
C = TypeVar("C", bound=CopyCatalog)


class RemoteReader(Generic[C]):
    """Remote reads for one cluster. Thread-safe. ``close()`` stops the download threads and the catalog."""

    def __init__(self, settings: ReaderSettings, catalog: C, store: RemoteStore) -> None:
        self.settings = settings
        self.catalog = catalog
        self.fetcher = RangeFetcher(store, settings)
        self.indexes = SegmentIndexCache(self.fetcher, settings.index_cache_segments)
        self.pool = MemoryPool(settings.prefetch_pool_bytes)
        self.executor = ThreadPoolExecutor(settings.download_max_concurrency + 1, thread_name_prefix="remote-read")
        self.preloader = None
        if settings.hot_data_interval_seconds:
            self.preloader = HotDataPreloader(self, settings.hot_data_interval_seconds).start()

    @classmethod
    def open(cls, settings: ReaderSettings, topics: list[str] | None = None) -> RemoteReader[MetadataCatalog]:
        """A reader with its own store, cluster client and started catalog (following ``topics``' metadata)."""
        store = open_store(settings.remote_storage)
        cluster = KafkaCluster(settings.bootstrap_servers, client_config=client_properties(settings.kafka_client))
        catalog = MetadataCatalog(settings, store, cluster, topics).start()
        return cls(settings, catalog, store)

    def close(self) -> None:
        if self.preloader is not None:
            self.preloader.close()
        self.executor.shutdown(wait=True, cancel_futures=True)
        self.catalog.close()

    def __enter__(self) -> RemoteReader[C]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- locating -------------------------------------------------------------------------------
    def locate(self, topic: str, partition: int, offset: int, topic_id: str | None = None) -> SegmentCopy:
        """The finished copy holding ``offset``, with its indexes; where copies leave a hole, the next copy
        above ``offset`` (the records in between are gone, as in the broker's log). ``topic_id``: of that
        incarnation of the topic (else the one the catalog has for the name).

        Raises OffsetOutOfRange below the remote start, NotInRemote above the remote end; before concluding
        either, waits until the metadata WAL's current records are applied.
        """
        for attempt in (0, 1):
            rx, ry = self.catalog.remote_offsets(topic, partition, topic_id)
            below = rx is not None and offset < rx  # also inside a copy, below a user's delete_records
            found = None if below else self.catalog.copy_for_offset(topic, partition, offset, topic_id)
            if found is None and not below:
                copies = self.catalog.copies(topic, partition, topic_id)
                found = next((c for c in copies if c.base_offset > offset), None)
                if found is not None:
                    log.warning("offsets without a remote copy skipped", topic=topic, partition=partition,
                                offset=offset, next_copy=found.base_offset)  # fmt: skip
            if found is None:
                if attempt == 0:
                    self.catalog.catch_up()
                    continue
                if below:
                    raise OffsetOutOfRange(topic, partition, offset, rx, None)
                raise NotInRemote(topic, partition, offset, ry)
            return self.indexes.get(self.catalog.ref(topic, partition, found, topic_id))
        raise AssertionError("unreachable")

    def next_copy(self, copy: SegmentCopy) -> SegmentCopy | None:
        """The copy a sequential reader continues with after ``copy`` (None when ``copy`` is the last), of
        the same incarnation of the topic."""
        ref = copy.ref
        try:
            return self.locate(ref.topic, ref.partition, copy.end_offset + 1, ref.topic_id)
        except (NotInRemote, OffsetOutOfRange):
            return None

    def following(self, copy: SegmentCopy):
        """The copies after ``copy``, in offset order, loaded lazily."""
        current = self.next_copy(copy)
        while current is not None:
            yield current
            current = self.next_copy(current)

    def transactions(self, copy: SegmentCopy) -> TxnView:
        """Aborted and unresolved transactions touching ``copy`` (reader/txn.py)."""
        return transactions_for(copy, self.following(copy))

    # -- reading --------------------------------------------------------------------------------
    def read_range(self, copy: SegmentCopy, start: int, end: int, *, cacheable: bool = False) -> bytes:
        """Bytes ``[start, end)`` of the copy's ``.log``; RemoteDataCorrupt if the object is shorter or
        longer than its manifest says; at a whole-object read, its CRC-32C is checked too."""
        size = copy.size
        data = self.fetcher.get(copy.log_key, start, _last_byte(copy, end), cacheable=cacheable)
        problem = None
        if end >= size:
            if len(data) != size - start:
                longer = "+" if len(data) > size - start else ""
                problem = (start + len(data), f"object has {start + len(data)}{longer} bytes, the manifest says {size}")
            elif start == 0 and crc32c.crc32c(data) != copy.manifest.log_crc32c:
                problem = (0, "CRC-32C of the object does not match the manifest")
        elif len(data) != end - start:
            problem = (start + len(data), f"object ends before the manifest's size {size}")
        if problem is not None:
            self.damaged(copy.log_key)
            raise RemoteDataCorrupt(copy.log_key, *problem)
        return data

    def damaged(self, key: str) -> None:
        """A read found the object ``key`` damaged: its windows leave the disk cache (every reader calls this
        where it finds damage, so a repaired object is read from the store again)."""
        self.fetcher.forget(key)

    def is_cached(self, copy: SegmentCopy, start: int, end: int) -> bool:
        """Whether ``[start, end)`` of the copy's ``.log`` is in the disk cache (False without one)."""
        cache = self.fetcher.cache
        return cache is not None and cache.contains(copy.log_key, start, _last_byte(copy, end))

    def read_or_gone(self, copy: SegmentCopy, start: int, end: int, *, cacheable: bool = False) -> bytes:
        """``read_range``; a missing object whose copy retention deleted meanwhile is OffsetOutOfRange (what
        the broker answers for an offset below its log start), not a read error."""
        try:
            return self.read_range(copy, start, end, cacheable=cacheable)
        except RemoteObjectMissing:
            ref = copy.ref
            self.catalog.catch_up()
            still = self.catalog.copy_for_offset(ref.topic, ref.partition, copy.base_offset, ref.topic_id)
            if still is None or self.catalog.ref(ref.topic, ref.partition, still, ref.topic_id) != ref:
                rx, _ = self.catalog.remote_offsets(ref.topic, ref.partition, ref.topic_id)
                raise OffsetOutOfRange(ref.topic, ref.partition, copy.base_offset, rx, None) from None
            raise


def _last_byte(copy: SegmentCopy, end: int) -> int:
    """The inclusive end of the GET for ``[start, end)``: one byte past the manifest's size at the object's end."""
    return end if end >= copy.size else end - 1
