"""Parsing .index, .timeindex, .txnindex, producer snapshots, checkpoints and partition dirs."""

from __future__ import annotations

import struct
from pathlib import Path

import crc32c
import pytest

from tiering_core.errors import FormatError
from tiering_core.formats import (
    list_segments,
    parse_leader_epoch_checkpoint,
    parse_offset_index,
    parse_partition_dir,
    parse_producer_snapshot,
    parse_time_index,
    parse_txn_index,
    read_topic_id,
)
from tiering_core.formats.indexes import last_time_index_entry


def test_offset_index_stops_at_preallocated_zeros() -> None:
    data = struct.pack(">iiiiii", 0, 0, 10, 4200, 25, 9000) + b"\x00" * 800 + b"\x01\x02\x03"
    assert parse_offset_index(data, 1000) == [(1000, 0), (1010, 4200), (1025, 9000)]


def test_time_index_stops_at_preallocated_zeros() -> None:
    data = struct.pack(">qiqi", 1_000, 3, 2_000, 9) + b"\x00" * 120
    assert parse_time_index(data, 50) == [(1_000, 53), (2_000, 59)]


@pytest.mark.parametrize("entries", [0, 1, 2, 3, 7, 64, 1000])
@pytest.mark.parametrize("tail", [0, 1, 5, 4096])
def test_last_time_index_entry_is_the_parsed_last(tmp_path: Path, entries: int, tail: int) -> None:
    """The binary search over the file finds what parsing it whole finds, whatever the zero tail's length (a
    trimmed rolled index has none, a preallocated active one a long one) and a torn last entry."""
    rows = [(1_000 + 10 * i, 0 if i == 0 else 3 * i + 1) for i in range(entries)]
    data = b"".join(struct.pack(">qi", *r) for r in rows) + b"\x00" * (12 * tail) + b"\x07" * (tail % 2)
    path = tmp_path / "00000000000000000050.timeindex"
    path.write_bytes(data)
    parsed = parse_time_index(data, 50)
    assert last_time_index_entry(path, 50) == (parsed[-1] if parsed else None)


def test_last_time_index_entry_of_a_missing_file(tmp_path: Path) -> None:
    assert last_time_index_entry(tmp_path / "gone.timeindex", 0) is None


def test_txn_index_entries_and_partial_tail() -> None:
    data = struct.pack(">hqqqq", 0, 7, 100, 140, 90) + b"\x00" * 10
    (entry,) = parse_txn_index(data)
    assert (entry.producer_id, entry.first_offset, entry.last_offset, entry.last_stable_offset) == (
        7,
        100,
        140,
        90,
    )
    with pytest.raises(FormatError, match="version 3"):
        parse_txn_index(struct.pack(">hqqqq", 3, 7, 100, 140, 90), "x.txnindex")


def test_producer_snapshot_crc_is_checked() -> None:
    body = struct.pack(">i", 1) + struct.pack(">qhiqiqiq", 42, 1, 99, 500, 4, 1_700_000_000_000, 0, -1)
    data = struct.pack(">hI", 1, crc32c.crc32c(body)) + body
    (entry,) = parse_producer_snapshot(data)
    assert (entry.producer_id, entry.last_sequence, entry.last_offset) == (42, 99, 500)
    broken = bytearray(data)
    broken[-1] ^= 1
    with pytest.raises(FormatError, match="CRC-32C mismatch"):
        parse_producer_snapshot(bytes(broken), "1.snapshot")


def test_leader_epoch_checkpoint() -> None:
    assert parse_leader_epoch_checkpoint("0\n2\n0 0\n3 1200\n") == [(0, 0), (3, 1200)]
    assert parse_leader_epoch_checkpoint("") == []
    with pytest.raises(FormatError, match="declares 3 entries but has 1"):
        parse_leader_epoch_checkpoint("0\n3\n0 0\n")


def test_partition_dirs_and_segments(tmp_path: Path) -> None:
    assert parse_partition_dir("orders-eu-12") == ("orders-eu", 12)
    assert parse_partition_dir("orders-3.abcdef0123456789abcdef0123456789-delete") is None
    assert parse_partition_dir("orders-3-future") is None
    assert parse_partition_dir("meta.properties") is None
    d = tmp_path / "orders-3"
    d.mkdir()
    for name in [
        "00000000000000000000.log",
        "00000000000000000100.log",
        "00000000000000000050.log.deleted",
        "00000000000000000200.log.swap",
        "00000000000000000100.index",
        "leader-epoch-checkpoint",
    ]:
        (d / name).write_bytes(b"")
    assert [s.base_offset for s in list_segments(d)] == [0, 100]
    (d / "partition.metadata").write_text("version: 0\ntopic_id: mXjDWYvGQ3SdP7gQi3DrqA")
    assert read_topic_id(d) == "mXjDWYvGQ3SdP7gQi3DrqA"
