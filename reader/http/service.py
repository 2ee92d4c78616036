"""What one HTTP request serves, without HTTP: a bounded remote fetch, filtered by the isolation level.

``FetchService`` is the whole state of a service instance: a ``RemoteReader`` (catalog, caches,
memory pool), the remote-read cursors (a cache of read-ahead) and the metrics. Nothing about a client is
kept between requests that another instance would need (the next offset travels in the response), so any
number of instances can serve behind a load balancer.

read_committed is the broker's and the consumer's rule together: the broker would send the batches
and the aborted transactions, the consumer drops the aborted batches and every control batch. Here
the service drops them itself, so a client needs no transaction logic: the body holds only whole
batches as Kafka wrote them. A transaction whose outcome is not in the remote data yet ends the
pages before its first offset: the page that reaches it is empty with ``last_stable_offset`` (as the
broker's LSO) and ``next_offset`` there.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal

from reader.cursor import CursorCache, ServedBatches
from reader.errors import MemoryBusy, NotInRemote, OffsetOutOfRange, RemoteReadError, UnknownTopic
from reader.http.metrics import FetchMetrics
from reader.remote import RemoteReader
from reader.txn import AbortFilter, TxnView
from tiering_core.errors import TieringError
from tiering_core.formats import AbortedTxn, BatchHeader, scan_headers
from tiering_core.logs import get_logger

log = get_logger(__name__)

IsolationLevel = Literal["read_uncommitted", "read_committed"]


@dataclass(frozen=True, slots=True)
class Page:
    """The batches one request serves (positions in ``headers`` are relative to ``data``).

    ``next_offset`` is where the next request continues. ``last_stable_offset`` is set when
    read_committed stopped before a transaction whose outcome is not remote yet.
    """

    topic: str
    partition: int
    offset: int
    data: bytes
    headers: list[BatchHeader]
    next_offset: int
    remote_start: int | None
    remote_end: int | None
    last_stable_offset: int | None
    key: str


@dataclass(frozen=True, slots=True)
class PartitionOffsets:
    """Where a partition's data is: remote start/end (inclusive) and the broker's log start/end."""

    topic: str
    partition: int
    remote_start: int | None
    remote_end: int | None
    log_start: int | None
    log_end: int | None


class DownloadPaused(RemoteReadError):
    """``tiering topic pause-download`` is in force for the topic: no remote reads until it is resumed."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        super().__init__(f"downloads of topic {topic!r} are paused (tiering topic resume-download {topic})")


class FetchService:
    """One service instance's state: the remote reader, its cursors and the metrics. Thread-safe.

    The batches come from the remote-read cursors the access layer uses too (``reader/cursor.py``), kept by
    the offset each continues at: a client's next request finds its read-ahead ready. They are a cache, not
    client state: any instance serves any request, the first one from a cold cursor."""

    def __init__(self, reader: RemoteReader, cursors: int, memory_wait: float,
                 metrics: FetchMetrics | None = None) -> None:  # fmt: skip
        """``cursors`` and ``memory_wait``: ``http.cursors`` and ``http.memory_wait_seconds``."""
        self.reader = reader
        self.catalog = reader.catalog
        self.metrics = metrics or FetchMetrics(reader)
        self.cursors = CursorCache(reader, cursors, memory_wait)

    def close(self) -> None:
        self.cursors.close()
        self.reader.close()

    # -- partitions ------------------------------------------------------------------------------
    def check_partition(self, topic: str, partition: int) -> str:
        """The id of the topic's live incarnation, confirmed with the cluster for this request (a topic
        deleted and created again under its name is another topic: its copies are not the deleted one's).
        Raises UnknownTopic when the cluster has no such topic or the topic no such partition."""
        info = self.catalog.live_topic(topic)
        if not any(p.partition == partition for p in info.partitions):
            raise UnknownTopic(f"topic {topic!r} has no partition {partition} (it has {len(info.partitions)})")
        return info.topic_id

    def offsets(self, topic: str, partition: int) -> PartitionOffsets:
        """Remote start/end from the metadata, the broker's log start/end from ListOffsets (None if the
        broker does not answer: the remote part is served anyway)."""
        topic_id = self.check_partition(topic, partition)
        rx, ry = self.catalog.remote_offsets(topic, partition, topic_id)
        lx, lz = self.broker_offsets(topic, partition)
        return PartitionOffsets(topic, partition, rx, ry, lx, lz)

    def broker_offsets(self, topic: str, partition: int) -> tuple[int | None, int | None]:
        try:
            local = self.catalog.cluster.local_offsets([(topic, partition)])[(topic, partition)]
        except TieringError as exc:
            log.warning("broker offsets unavailable", topic=topic, partition=partition, error=str(exc))
            return None, None
        return local.lx, local.lz

    # -- fetching --------------------------------------------------------------------------------
    def fetch(self, topic: str, partition: int, offset: int, max_bytes: int, isolation: IsolationLevel) -> Page:
        """Whole batches from the one holding ``offset``, about ``max_bytes`` of them (at least one).

        Raises UnknownTopic, DownloadPaused, OffsetOutOfRange (below the remote start), NotInRemote (above
        the remote end: the broker serves it), RemoteObjectMissing, RemoteDataCorrupt, RemoteUnavailable.
        """
        topic_id = self.check_partition(topic, partition)
        if self.catalog.download_paused(topic, topic_id):
            raise DownloadPaused(topic)
        started = time.monotonic()
        try:
            served = self._read(topic, topic_id, partition, offset, max_bytes, isolation == "read_committed")
        except (OffsetOutOfRange, NotInRemote, MemoryBusy):
            raise
        except RemoteReadError as exc:
            self.metrics.fetch_failed(topic, partition)
            log.error("remote fetch failed", topic=topic, partition=partition, offset=offset, error=str(exc))
            raise
        self.metrics.fetched(topic, partition, len(served.data), time.monotonic() - started)
        rx, ry = self.catalog.remote_offsets(topic, partition, topic_id)
        data = bytes(served.data)
        headers = list(scan_headers(served.key, data))
        lso = served.next_offset if served.undecided else None
        if isolation == "read_committed":
            data, headers = _committed(data, headers, served.aborted, offset)
        return Page(topic, partition, offset, data, headers, served.next_offset, rx, ry, lso, served.key)

    def _read(self, topic: str, topic_id: str, partition: int, offset: int, max_bytes: int,
              read_committed: bool) -> ServedBatches:  # fmt: skip
        """Batches from ``offset``, about ``max_bytes`` of them (at least one), over the cursor's windows."""
        parts: list[bytes | memoryview] = []
        aborted: list[AbortedTxn] = []
        position, left, key, undecided = offset, max_bytes, "", None
        while left > 0 and undecided is None:
            try:
                served = self.cursors.read(topic, topic_id, partition, position, left, read_committed, not parts)
            except NotInRemote:
                if parts:
                    break  # the rest is the broker's: the next request says so
                raise
            if not served.data and not served.undecided:
                break  # the next batch is larger than what is left
            parts.append(served.data)
            aborted += [a for a in served.aborted if a not in aborted]
            position, left, undecided = served.next_offset, left - len(served.data), served.undecided
            key = served.key or key
        return ServedBatches(b"".join(parts), aborted, position, undecided, key)

    # -- health ----------------------------------------------------------------------------------
    def ready(self, timeout: float) -> None:
        """Raises (WalError, KafkaClusterError) unless the metadata is followed and caught up now."""
        self.catalog.catch_up(timeout)


def _committed(data: bytes, headers: list[BatchHeader], aborted: list[AbortedTxn], offset: int
               ) -> tuple[bytes, list[BatchHeader]]:  # fmt: skip
    """The batches read_committed delivers: no aborted batch and no control batch (the cursor stopped before
    any transaction whose outcome is not remote yet)."""
    filt = AbortFilter(TxnView(aborted, {}), offset)
    kept = [h for h in headers if filt.keep(h)]
    if len(kept) == len(headers):
        return data, kept
    parts, out, position = [], [], 0
    for h in kept:
        parts.append(data[h.position : h.position + h.size])
        out.append(h._replace(position=position))
        position += h.size
    return b"".join(parts), out
