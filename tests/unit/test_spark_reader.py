"""The Spark data source's pure parts: Arrow decoding of slices, copy choice, options, the Parquet commit."""

from __future__ import annotations

import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reader.errors import RemoteDataCorrupt, RemoteObjectMissing
from reader.listing import choose_copies, split_topic_dir
from reader.spark.columns import _repeat_string
from reader.spark.options import parse_options, store_options
from reader.spark.parquet_commit import ParquetOutput
from reader.spark.slices import SegmentSlice, SlicePack, decode_slice, pack_slices, read_slices, slice_reader
from tests.decoders import KEY, slice_over, windows_of
from tests.kafka_encoder import encode_batch, sample_records
from tiering_core.errors import ConfigError
from tiering_core.formats import iter_batches
from tiering_core.objects import Manifest
from tiering_core.stores.config import S3StoreConfig
from tiering_core.stores.filesystem import FileSystemStore

MARKER_VALUE = b"\x00\x00\x00\x00\x00\x07"  # version 0, coordinator epoch 7


def _segment() -> tuple[bytes, set[int]]:
    """Batches of every codec, an aborted transaction (producer 77) with its marker, a committed one
    (producer 88); returns the bytes and the offsets of the aborted records and markers."""
    data = b""
    offset = 0
    dropped: set[int] = set()
    for codec in range(5):
        records = sample_records(150, seed=codec)
        data += encode_batch(offset, records, codec=codec)
        offset += len(records)
    for pid, aborted in ((77, True), (88, False)):
        records = sample_records(10, seed=pid)
        data += encode_batch(offset, records, attributes_extra=0x10, producer_id=pid)
        if aborted:
            dropped.update(range(offset, offset + 10))
        offset += 10
        marker_key = b"\x00\x00\x00\x00" if aborted else b"\x00\x00\x00\x01"  # version 0, ABORT or COMMIT
        data += encode_batch(offset, [(marker_key, MARKER_VALUE, [])], attributes_extra=0x30, producer_id=pid)
        dropped.add(offset)
        offset += 1
    data += encode_batch(offset, sample_records(40, seed=9), codec=4)
    return data, dropped


def _expected(data: bytes, dropped: set[int]) -> dict[int, tuple]:
    return {
        r.offset: (r.key, r.value, list(r.headers) or None, r.timestamp)  # no headers: null, as Spark's Kafka source
        for b in iter_batches("x", data)
        for r in b.records
        if r.offset not in dropped
    }


def _rows(batches: list[pa.RecordBatch]) -> dict[int, tuple]:
    out = {}
    for batch in batches:
        for row in batch.to_pylist():
            headers = None if row["headers"] is None else [(h["key"], h["value"]) for h in row["headers"]]
            out[row["offset"]] = (row["key"], row["value"], headers, int(row["timestamp"].timestamp() * 1000))
            assert (row["topic"], row["partition"], row["timestampType"]) == ("t", 3, 0)
    return out


@pytest.fixture
def store(tmp_path: Path) -> FileSystemStore:
    return FileSystemStore(tmp_path / "remote")


@pytest.mark.parametrize("window", [64, 1000, 16 << 20])
def test_slice_decodes_every_codec_and_drops_aborted_and_markers(window: int) -> None:
    data, dropped = _segment()
    last = max(r.offset for b in iter_batches("x", data) for r in b.records)
    part = slice_over(data, 0, last, ((77, 750, 760),))
    batches = list(decode_slice(part, windows_of(data, window), max_rows=100))
    assert _rows(batches) == _expected(data, dropped)
    assert all(b.num_rows <= 150 + 100 for b in batches)


def test_the_topic_column_names_every_row_over_batches_of_any_size() -> None:
    """The topic column's offsets are built once per name length and shared by later batches (reader.spark.columns):
    a larger batch after a smaller one, a smaller after a larger, and another name of the same length each get
    their own name on every row and no more rows."""
    for topic, n in (("orders", 3), ("orders", 70_000), ("events", 5), ("events", 0), ("o", 65_536), ("orders", 1)):
        column = _repeat_string(topic, n)
        assert len(column) == n and column.to_pylist() == [topic] * n


def _read(store: FileSystemStore, part: SegmentSlice) -> list[pa.RecordBatch]:
    """The slice read as an executor reads it: through the read core over its pack's copies."""
    with slice_reader(store, [SlicePack((part,)).remote_partition()], 64 * 1024) as reader:
        return list(read_slices(reader, [part]))


def test_slice_keeps_only_its_offset_range(store: FileSystemStore) -> None:
    data, dropped = _segment()
    store.put_bytes(KEY, data)
    rows = _rows(_read(store, slice_over(data, 140, 460, ((77, 750, 760),))))
    assert sorted(rows) == list(range(140, 461))
    assert rows == {o: v for o, v in _expected(data, dropped).items() if 140 <= o <= 460}


def test_corrupt_truncated_or_missing_object_is_an_error_naming_the_key(store: FileSystemStore) -> None:
    data, _ = _segment()
    part = slice_over(data, 0, 10_000)
    corrupt = bytearray(data)
    corrupt[len(data) // 2] ^= 0xFF
    store.put_bytes(KEY, bytes(corrupt))
    with pytest.raises(RemoteDataCorrupt, match=f"{KEY} at byte .*(CRC-32C|malformed)"):
        _read(store, part)
    store.put_bytes(KEY, data + b"\x00" * 10)
    with pytest.raises(RemoteDataCorrupt, match=f"{KEY} at byte .*the manifest says {len(data)}"):
        _read(store, part)
    moved = bytearray(data)
    moved[6] ^= 0x40  # the first batch's base offset: not covered by its CRC
    store.put_bytes(KEY, bytes(moved))
    with pytest.raises(RemoteDataCorrupt, match=f"{KEY} at byte 0: batch offsets 16384-"):
        _read(store, slice_over(bytes(moved), 0, 10_000, copy_offsets=(0, 1000)))
    store.put_bytes(KEY, data[:-100])
    with pytest.raises(RemoteDataCorrupt, match=f"{KEY} at byte .*the manifest says {len(data)}"):
        _read(store, part)
    store.put_bytes(KEY, data)
    assert len(_rows(_read(store, part))) == len(_expected(data, set())) - 2  # the markers (no abort named here)
    store.delete([KEY])
    with pytest.raises(RemoteObjectMissing, match=KEY):
        _read(store, part)


def _manifest(base: int, end: int, epoch: int, created: int = 0) -> Manifest:
    return Manifest(topic="t", topic_id="A" * 22, partition=0, segment_id=uuid.uuid4(), base_offset=base,
                    end_offset=end, max_timestamp=0, leader_epochs=[(epoch, base)], log_size=1, log_crc32c=0,
                    indexes_size=0, indexes_crc32c=0, index_parts={}, created_ms=created)  # fmt: skip


def test_overlapping_copies_are_chosen_once_preferring_the_higher_epoch() -> None:
    old = [_manifest(0, 99, 1), _manifest(100, 199, 1), _manifest(300, 399, 2)]
    newer = _manifest(150, 249, 2)  # a new leader's copy overlapping the old one
    copies = choose_copies([*old, newer])
    spans = [(c.first, c.last, c.epoch) for c in copies]
    assert spans == [(0, 99, 1), (100, 199, 1), (200, 249, 2), (300, 399, 2)]  # the hole 250-299 stays a hole
    retried = [_manifest(0, 99, 1, created=1), _manifest(0, 99, 1, created=2)]
    assert [c.manifest for c in choose_copies(retried)] == [retried[1]]


def test_topic_directories_split_on_the_topic_id() -> None:
    assert split_topic_dir("orders-eu-" + "B" * 22) == ("orders-eu", "B" * 22)
    assert split_topic_dir("orders") is None


def test_options_are_checked_with_clear_errors() -> None:
    store = store_options(S3StoreConfig(bucket="b", prefix="p"))
    parsed = parse_options({"subscribe": "a,b", "startingOffsets": '{"a": {"0": 5}}', **store})
    assert parsed.topics == ["a", "b"] and parsed.starting == {"a": {0: 5}} and parsed.store.prefix == "p"
    flat = parse_options(
        {"subscribe": "a", "store.bucket": "b", "store.endpointUrl": "http://x", "store.pathStyle": "true"}
    )
    assert (flat.store.endpoint_url, flat.store.path_style) == ("http://x", True)
    for bad, message in [
        ({"subscribe": "a", "bogus": "1", **store}, "unknown option"),
        ({**store}, "exactly one of"),
        ({"subscribe": "a", "assign": "{}", **store}, "exactly one of"),
        ({"subscribe": "a", "startingOffsets": "{nope", **store}, "not valid JSON"),
        ({"subscribe": "a", "startingOffsets": "latest", **store}, "not supported"),
        ({"subscribe": "a", "maxSliceBytes": "-1", **store}, "must be positive"),
        ({"subscribe": "a"}, "store.bucket"),
        ({"subscribe": "a", "store.buckett": "b"}, "unknown store option"),
    ]:
        with pytest.raises(ConfigError, match=message):
            parse_options(bad)


def test_parquet_commit_marker_last_and_uncommitted_files_removed(tmp_path: Path) -> None:
    out = ParquetOutput(str(tmp_path / "out"), "t")
    staged = Path(out.staging("run1")) / "partition=0" / "date=2026-01-01"
    staged.mkdir(parents=True)
    pq.write_table(pa.table({"offset": [1, 2, 3]}), staged / "part-00000-x.c000.snappy.parquet")
    assert out.committed_ends() == {}
    marker = out.commit("run1", "A" * 22, {0: (1, 3)})
    assert marker.rows == 3 and marker.files == ["partition=0/date=2026-01-01/run1-part-00000-x.c000.snappy.parquet"]
    assert out.committed_ends() == {0: 3}
    # a run that died after moving a file but before its marker: its file goes, committed ones stay
    orphan = tmp_path / "out" / "partition=0" / "date=2026-01-01" / "run2-part-00000-y.c000.snappy.parquet"
    pq.write_table(pa.table({"offset": [4]}), orphan)
    assert out.remove_uncommitted() == ["partition=0/date=2026-01-01/run2-part-00000-y.c000.snappy.parquet"]
    assert not orphan.exists() and (tmp_path / "out" / marker.files[0]).exists()


def test_small_consecutive_slices_of_a_partition_are_packed() -> None:
    def piece(partition: int, size: int) -> SegmentSlice:
        return slice_over(bytes(size), partition=partition)

    slices = [piece(0, 40), piece(0, 50), piece(0, 30), piece(1, 10), piece(1, 500), piece(1, 5)]
    packs = pack_slices(slices, 100)
    assert [[s.partition for s in p.slices] for p in packs] == [[0, 0], [0], [1], [1], [1]]
    assert [sum(s.end - s.start for s in p.slices) for p in packs] == [90, 30, 10, 500, 5]
