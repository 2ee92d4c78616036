"""The timestamp retention judges a segment by: Kafka's largestTimestamp, with the file's modification
time when the time index holds none (issue 7.5: such copies once expired at once)."""

from __future__ import annotations

import os
import struct
import time
import uuid
from pathlib import Path

import pytest

from tests.kafka_encoder import encode_batch, sample_records
from tiering.copier import LocalSegment, SegmentCopier
from tiering.policy import LocalSegmentInfo, PartitionOffsets, RetentionSettings, local_retention_target
from tiering_core.formats import SegmentFiles
from tiering_core.objects import SegmentRef
from tiering_core.stores.filesystem import FileSystemStore

TWO_HOURS_AGO_NS = time.time_ns() - 2 * 3600 * 10**9


def segment(tmp_path: Path, timeindex: bytes | None, base_timestamp: int = 1_700_000_000_000) -> SegmentFiles:
    files = SegmentFiles(tmp_path / "orders-0", 0)
    files.partition_dir.mkdir(exist_ok=True)
    files.log.write_bytes(encode_batch(0, sample_records(1), base_timestamp=base_timestamp))
    os.utime(files.log, ns=(TWO_HOURS_AGO_NS, TWO_HOURS_AGO_NS))
    if timeindex is not None:
        files.timeindex.write_bytes(timeindex)
    return files


def test_largest_timestamp_is_the_last_time_index_entry(tmp_path: Path) -> None:
    files = segment(tmp_path, struct.pack(">qiqi", 1_000, 3, 2_000, 9))
    assert files.largest_timestamp() == 2_000


@pytest.mark.parametrize("timeindex", [b"", None, bytes(10485756)], ids=["empty", "missing", "preallocated-zeros"])
def test_largest_timestamp_without_an_index_entry_is_the_file_time(tmp_path: Path, timeindex: bytes | None) -> None:
    files = segment(tmp_path, timeindex)
    assert files.max_timestamp() in (-1, 0)
    assert files.largest_timestamp() == TWO_HOURS_AGO_NS // 1_000_000


def test_local_retention_by_time_uses_the_file_time(tmp_path: Path) -> None:
    now = time.time_ns() // 1_000_000
    files = segment(tmp_path, b"")
    segments = [LocalSegmentInfo(0, 100, files.largest_timestamp()), LocalSegmentInfo(10, 100, now)]
    offsets = PartitionOffsets(0, 20, 20, rx=0, ry=9)
    hour = RetentionSettings(retention_ms=-1, local_retention_ms=3600 * 1000)
    assert local_retention_target(segments, offsets, hour, now) == 10  # two hours old by its file time
    three_hours = RetentionSettings(retention_ms=-1, local_retention_ms=3 * 3600 * 1000)
    assert local_retention_target(segments, offsets, three_hours, now) is None


def test_manifest_of_batches_without_timestamps_carries_the_file_time(tmp_path: Path) -> None:
    files = segment(tmp_path, b"", base_timestamp=-1)  # one record: maxTimestamp -1 (NO_TIMESTAMP)
    copier = SegmentCopier(FileSystemStore(tmp_path / "remote"))
    ref = SegmentRef("orders", "mXjDWYvGQ3SdP7gQi3DrqA", 0, 0, uuid.uuid4())
    manifest = copier.copy(ref, LocalSegment(files, 1))
    assert manifest.max_timestamp == TWO_HOURS_AGO_NS // 1_000_000
    with_ts = segment(tmp_path, b"", base_timestamp=1_700_000_000_000)
    assert copier.copy(ref, LocalSegment(with_ts, 1)).max_timestamp == 1_700_000_000_000  # the records' own
