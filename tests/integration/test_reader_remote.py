"""The reader core on the real stack: a topic tiered by the sidecar, read back from S3 without a sidecar."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import pytest
from confluent_kafka import Consumer, TopicPartition

from deploy.stack import Endpoints
from metadata.records import topic_id_bytes
from reader import (
    NotInRemote,
    PartitionStream,
    RemoteDataCorrupt,
    RemoteObjectMissing,
    RemoteReader,
    RemoteUnavailable,
)
from reader.cursor import CursorCache, ServedBatches
from reader.windows import windows_from
from segment_fsm import SegmentState
from tests.fault_proxy import TcpProxy
from tests.reader_harness import TieredTopic, tiered_topic
from tests.sidecar_harness import wait_for
from tiering_core.formats import iter_batches, scan_headers

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def tiered(stack: Endpoints, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TieredTopic]:
    with tiered_topic(stack, tmp_path_factory.mktemp("reader-remote")) as t:
        yield t


def fetch(cursors: CursorCache, topic: str, offset: int, max_bytes: int) -> ServedBatches:
    """One read of partition 0 through the remote-read cursors (what the proxy and the HTTP service use)."""
    return cursors.read(topic, cursors.reader.catalog.topic_id(topic), 0, offset, max_bytes, False)


def read_all(cursors: CursorCache, topic: str, max_bytes: int) -> tuple[dict[int, tuple], dict[str, bytes]]:
    """Every record from offset 0 through the cursors, and the raw bytes served per object key."""
    records: dict[int, tuple] = {}
    raw: dict[str, bytes] = {}
    offset = 0
    while True:
        try:
            fetched = fetch(cursors, topic, offset, max_bytes)
        except NotInRemote:
            return records, raw
        raw[fetched.key] = raw.get(fetched.key, b"") + fetched.data
        for batch in iter_batches(fetched.key, fetched.data):
            for r in batch.records:
                if r.offset >= offset:
                    assert r.offset not in records, f"offset {r.offset} served twice"
                    records[r.offset] = (r.key, r.value, list(r.headers), batch.header.is_control)
        assert fetched.next_offset > offset
        offset = fetched.next_offset


def test_catalog_follows_only_the_topics_wal_partitions(tiered: TieredTopic) -> None:
    settings = tiered.reader_settings()
    with RemoteReader.open(settings, [tiered.topic]) as reader:
        catalog = reader.catalog
        topic_id = tiered.ctx.cluster.topics([tiered.topic])[tiered.topic].topic_id
        assert catalog.topic_id(tiered.topic) == topic_id
        wal = catalog.wal
        expected = {wal.partition_of(topic_id_bytes(topic_id), None), wal.partition_of(topic_id_bytes(topic_id), 0)}
        assert catalog.manager.wal_partitions == expected
        assert catalog.manager.read_only
        copies = catalog.copies(tiered.topic, 0)
        finished = tiered.ctx.manager.segments(topic_id, 0, [SegmentState.COPY_SEGMENT_FINISHED])
        assert [c.segment_id for c in copies] == [s.segment_id for s in finished]
        rx, ry = catalog.remote_offsets(tiered.topic, 0)
        assert rx == 0 and ry is not None and ry >= tiered.log_start() - 1
        assert copies[-1].end_offset == ry and catalog.copy_for_offset(tiered.topic, 0, ry) == copies[-1]
        assert [c.base_offset for c in copies] == [rx] + [c.end_offset + 1 for c in copies[:-1]], "a gap or overlap"
        assert not catalog.download_paused(tiered.topic)


@pytest.mark.parametrize("max_bytes", [1, 10_000, 1 << 20])
def test_fetch_serves_every_tiered_record_verbatim(tiered: TieredTopic, max_bytes: int) -> None:
    with RemoteReader.open(tiered.reader_settings(), [tiered.topic]) as reader:
        records, raw = read_all(CursorCache(reader, 16, 5.0), tiered.topic, max_bytes)
        _, ry = reader.catalog.remote_offsets(tiered.topic, 0)
        store = reader.fetcher.store
        for key, served in raw.items():
            assert served == store.get_bytes(key), f"bytes served from {key} differ from the object"
    assert sorted(records) == list(range(ry + 1)), "offsets missing or extra"
    for offset, value in records.items():
        if offset in tiered.produced:
            assert value[:3] == tiered.produced[offset], f"offset {offset} differs from what was produced"
        else:
            assert value[3], f"offset {offset} is neither produced nor a transaction marker"


def test_fetch_from_the_middle_of_a_batch_starts_with_that_batch(tiered: TieredTopic) -> None:
    with RemoteReader.open(tiered.reader_settings(), [tiered.topic]) as reader:
        cursors = CursorCache(reader, 16, 5.0)
        copy = reader.locate(tiered.topic, 0, reader.catalog.copies(tiered.topic, 0)[1].base_offset)
        offset = copy.base_offset + 7
        fetched = fetch(cursors, tiered.topic, offset, 4096)
        first = next(scan_headers(fetched.key, fetched.data))
        assert first.base_offset <= offset <= first.last_offset
        assert fetched.key == copy.log_key


def test_store_unreachable_retries_then_fails_then_resumes(tiered: TieredTopic, stack: Endpoints) -> None:
    target = urlparse(stack.s3.endpoint_url)
    proxy = TcpProxy(target.hostname or "127.0.0.1", target.port or 80)
    try:
        base = tiered.reader_settings()
        storage = base.remote_storage.model_copy(update={"endpoint_url": f"http://127.0.0.1:{proxy.port}"})
        settings = tiered.reader_settings(remote_storage=storage.model_dump(), read_attempts=3,
                                          read_retry_backoff_seconds=0.1)  # fmt: skip
        with RemoteReader.open(settings, [tiered.topic]) as reader:
            cursors = CursorCache(reader, 16, 5.0)
            proxy.cut()
            with pytest.raises(RemoteUnavailable) as failed:
                fetch(cursors, tiered.topic, 0, 65536)
            assert failed.value.attempts == 3 and ".manifest" in failed.value.key
            proxy.restore()
            fetched = fetch(cursors, tiered.topic, 0, 65536)
            assert next(scan_headers(fetched.key, fetched.data)).base_offset == 0
    finally:
        proxy.close()


def test_corrupted_or_deleted_object_is_an_error_naming_the_key(tiered: TieredTopic) -> None:
    with RemoteReader.open(tiered.reader_settings(), [tiered.topic]) as reader:
        cursors = CursorCache(reader, 16, 5.0)
        store = reader.fetcher.store
        copies = reader.catalog.copies(tiered.topic, 0)
        damaged = reader.locate(tiered.topic, 0, copies[2].base_offset)
        body = bytearray(store.get_bytes(damaged.log_key))
        body[len(body) // 2] ^= 0xFF  # one flipped bit pattern inside some record
        store.put_bytes(damaged.log_key, bytes(body))
        with pytest.raises(RemoteDataCorrupt) as corrupt:
            read_from(cursors, tiered.topic, damaged.base_offset, damaged.end_offset)
        assert damaged.log_key in str(corrupt.value)

        longer = reader.locate(tiered.topic, 0, copies[3].base_offset)
        store.put_bytes(longer.log_key, store.get_bytes(longer.log_key) + b"\0" * 10)
        with pytest.raises(RemoteDataCorrupt, match="the manifest says"):
            fetch(cursors, tiered.topic, longer.base_offset, 1 << 30)

        gone = reader.locate(tiered.topic, 0, copies[4].base_offset)
        store.delete([gone.log_key])
        with pytest.raises(RemoteObjectMissing) as missing:
            fetch(cursors, tiered.topic, gone.base_offset, 65536)
        assert missing.value.key == gone.log_key
        # the message names the store's whole key, the cluster's prefix included (what an operator looks up)
        assert f"{tiered.reader_settings().remote_storage.prefix}/{gone.log_key}" in str(missing.value)


def read_from(cursors: CursorCache, topic: str, offset: int, last: int) -> None:
    while offset <= last:
        offset = fetch(cursors, topic, offset, 16384).next_offset


def test_reader_settings_accept_the_sidecar_file(tiered: TieredTopic, tmp_path: Path) -> None:
    settings = tiered.reader_settings()
    assert settings.bootstrap_servers == tiered.ctx.settings.bootstrap_servers
    assert settings.prefetch_pool_bytes == 256 << 20


def test_disk_cache_serves_a_second_read_without_store_requests(tiered: TieredTopic, tmp_path: Path) -> None:
    settings = tiered.reader_settings(disk_cache_dir=str(tmp_path / "cache"), fetch_window_bytes=64 * 1024,
                                      prefetch_windows=0)  # fmt: skip
    first_pass: list[tuple] = []
    for attempt in range(2):
        with RemoteReader.open(settings, [tiered.topic]) as reader:
            stream = PartitionStream(reader, tiered.topic, 0, 0)
            records = []
            copies = reader.catalog.copies(tiered.topic, 0)[:2]  # copies 2.. are damaged by another test
            while stream.position <= copies[-1].end_offset:
                for batch in stream.read(5.0):
                    records.extend(batch.records)
            stream.close()
            log_requests = reader.fetcher.requests - 2 * len(copies)  # minus manifests and indexes
            if attempt == 0:
                assert log_requests >= len(copies)
                offsets = [r.offset for r in records]
                assert offsets == list(range(len(records))) and offsets[-1] >= copies[-1].end_offset, "a gap or twice"
                for r in records:
                    if r.offset in tiered.produced:
                        assert (r.key, r.value, list(r.headers)) == tiered.produced[r.offset], f"offset {r.offset}"
                first_pass = records
            else:
                assert log_requests == 0, "windows were downloaded again instead of read from the disk cache"
                assert records == first_pass


def test_hot_data_preloader_warms_committed_offsets_below_the_log_start(tiered: TieredTopic, tmp_path: Path) -> None:
    with RemoteReader.open(tiered.reader_settings(), [tiered.topic]) as plain:
        target = plain.catalog.copies(tiered.topic, 0)[1]  # copies 2.. are damaged by another test
    group = f"g-{uuid.uuid4().hex[:6]}"
    committer = Consumer({"bootstrap.servers": tiered.ctx.settings.bootstrap_servers, "group.id": group})
    committer.commit(offsets=[TopicPartition(tiered.topic, 0, target.base_offset + 3)], asynchronous=False)
    committer.close()
    settings = tiered.reader_settings(disk_cache_dir=str(tmp_path / "cache"), fetch_window_bytes=64 * 1024,
                                      hot_data_interval_seconds=0.5, hot_data_windows=2)  # fmt: skip
    with RemoteReader.open(settings, [tiered.topic]) as reader:
        assert reader.preloader is not None
        wait_for(lambda: reader.preloader.warmed > 0, 60, "the preloader to warm the cache")
        copy = reader.locate(tiered.topic, 0, target.base_offset + 3)
        first = windows_from(copy, copy.position_for(target.base_offset + 3), 64 * 1024)[0]
        assert reader.is_cached(copy, first.start, first.end), "the window a group member starts with is not cached"


def test_stream_checks_the_whole_objects_crc_where_batch_crcs_cannot_see(tiered: TieredTopic, tmp_path: Path) -> None:
    """The leader epoch in a batch header is outside the batch CRC: only the object's CRC-32C catches it. The
    damaged object's windows leave the disk cache: once the object is repaired, it is read whole again."""
    settings = tiered.reader_settings(disk_cache_dir=str(tmp_path / "cache"), fetch_window_bytes=64 * 1024)
    with RemoteReader.open(settings, [tiered.topic]) as reader:
        copy = reader.locate(tiered.topic, 0, reader.catalog.copies(tiered.topic, 0)[5].base_offset)
        store = reader.fetcher.store
        original = store.get_bytes(copy.log_key)
        damaged = bytearray(original)
        damaged[12] ^= 0x01  # the first batch's partitionLeaderEpoch
        store.put_bytes(copy.log_key, bytes(damaged))
        try:
            stream = PartitionStream(reader, tiered.topic, 0, copy.base_offset)
            delivered = []
            with pytest.raises(RemoteDataCorrupt, match="CRC-32C of the object does not match the manifest"):
                while stream.position <= copy.end_offset:
                    delivered += stream.read(5.0)
            assert not delivered, "records of a copy that fails its manifest were delivered"
            stream.close()
        finally:
            store.put_bytes(copy.log_key, original)
        stream = PartitionStream(reader, tiered.topic, 0, copy.base_offset)
        offsets = []
        while stream.position <= copy.end_offset:
            offsets += [r.offset for batch in stream.read(5.0) for r in batch.records]
        stream.close()
        assert [o for o in offsets if o <= copy.end_offset] == list(range(copy.base_offset, copy.end_offset + 1))
