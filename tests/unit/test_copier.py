"""The copier copies a rolled segment whole or not at all (filesystem store; the S3 path is integration-tested)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from tests.kafka_encoder import encode_batch, sample_records
from tiering.copier import LocalSegment, SegmentCopier
from tiering_core.errors import FormatError
from tiering_core.formats import SegmentFiles, segment_file_name
from tiering_core.objects import SegmentRef
from tiering_core.stores.filesystem import FileSystemStore
from tiering_core.stores.prefixed import PrefixedStore


def write_segment(partition_dir: Path, base: int, batches: int, per_batch: int = 10) -> bytes:
    data = b"".join(
        encode_batch(base + i * per_batch, sample_records(per_batch, i), codec=i % 5) for i in range(batches)
    )
    partition_dir.mkdir(parents=True, exist_ok=True)
    (partition_dir / segment_file_name(base, ".log")).write_bytes(data)
    return data


def copier_and_ref(tmp_path: Path, part_size: int = 1024) -> tuple[SegmentCopier, SegmentRef, FileSystemStore]:
    """Parts of ``part_size`` bytes: the copy validates (and uploads) the segment in many windows."""
    store = FileSystemStore(tmp_path / "remote", part_size=part_size)
    ref = SegmentRef("orders", "mXjDWYvGQ3SdP7gQi3DrqA", 0, 100, uuid.uuid4())
    return SegmentCopier(PrefixedStore(store, "p")), ref, store


def test_copy_covers_the_segment_exactly(tmp_path: Path) -> None:
    data = write_segment(tmp_path / "orders-0", 100, 30)
    copier, ref, store = copier_and_ref(tmp_path)
    manifest = copier.copy(ref, LocalSegment(SegmentFiles(tmp_path / "orders-0", 100), 400))
    assert (manifest.base_offset, manifest.end_offset, manifest.log_size) == (100, 399, len(data))
    assert manifest.mismatch(399, len(data)) is None
    assert store.get_bytes("p/" + ref.key("log")) == data
    assert copier.manifest(ref) == manifest


@pytest.mark.parametrize("next_base", [399, 401, 1000])
def test_segment_not_ending_just_below_the_next_base_is_not_uploaded(tmp_path: Path, next_base: int) -> None:
    write_segment(tmp_path / "orders-0", 100, 30)
    copier, ref, store = copier_and_ref(tmp_path)
    with pytest.raises(FormatError, match=f"next segment starts at {next_base}"):
        copier.copy(ref, LocalSegment(SegmentFiles(tmp_path / "orders-0", 100), next_base))
    assert store.list_keys("p/") == []


def test_zero_filled_tail_is_not_uploaded(tmp_path: Path) -> None:
    data = write_segment(tmp_path / "orders-0", 100, 30)
    log = tmp_path / "orders-0" / segment_file_name(100, ".log")
    log.write_bytes(data + bytes(5000))
    copier, ref, store = copier_and_ref(tmp_path)
    with pytest.raises(FormatError, match="zero-filled"):
        copier.copy(ref, LocalSegment(SegmentFiles(tmp_path / "orders-0", 100), 400))
    assert store.list_keys("p/") == []


def test_manifest_mismatch_names_both_extents(tmp_path: Path) -> None:
    data = write_segment(tmp_path / "orders-0", 100, 30)
    copier, ref, _ = copier_and_ref(tmp_path)
    manifest = copier.copy(ref, LocalSegment(SegmentFiles(tmp_path / "orders-0", 100), 400))
    assert "offsets 100..399 in" in (manifest.mismatch(450, len(data)) or "")
    assert "100..450" in (manifest.mismatch(450, len(data)) or "")
    assert manifest.mismatch(399, len(data) + 1) is not None
