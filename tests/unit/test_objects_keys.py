"""Object keys fit every store for every legal Kafka topic name; copies under the old layout stay readable."""

from __future__ import annotations

import io
import os
import uuid
from collections.abc import Iterable
from typing import BinaryIO

import pytest

from tiering.copier import SegmentCopier
from tiering_core.objects import (
    TOPIC_DIR_MAX_BYTES,
    Manifest,
    SegmentRef,
    parse_key,
    partition_prefix,
    partition_prefixes,
    topic_dir,
)
from tiering_core.stores import ObjectNotFound
from tiering_core.stores.base import Part, consecutive_parts

TOPIC_ID = "mXjDWYvGQ3SdP7gQi3DrqA"


@pytest.mark.parametrize("length", range(1, 250))
def test_every_legal_topic_name_fits_and_short_names_keep_their_keys(length: int) -> None:
    topic = ("orders.v2_" * 25)[:length]
    component = topic_dir(topic, TOPIC_ID)
    assert len(component.encode()) <= TOPIC_DIR_MAX_BYTES
    assert component.endswith(f"-{TOPIC_ID}") and topic.startswith(component.removesuffix(f"-{TOPIC_ID}"))
    ref = SegmentRef(topic, TOPIC_ID, 7, 1234, uuid.uuid4())
    key = ref.key("log")
    assert parse_key(key) == (1234, ref.segment_id, "log")
    assert all(len(part) <= TOPIC_DIR_MAX_BYTES for part in key.split("/"))
    old_layout = f"{topic}-{TOPIC_ID}/7/{1234:020d}-{ref.segment_id.hex}.log"
    if length <= TOPIC_DIR_MAX_BYTES - len(TOPIC_ID) - 1:
        assert key == old_layout and ref.legacy_key("log") is None
        assert partition_prefixes(topic, TOPIC_ID, 7) == [component + "/7"]
    else:
        assert ref.legacy_key("log") == old_layout
        assert partition_prefixes(topic, TOPIC_ID, 7) == [
            partition_prefix(topic, TOPIC_ID, 7),
            f"{topic}-{TOPIC_ID}/7",
        ]


class DictStore:
    """An in-memory store without key limits (AWS S3 allows 1024-byte keys), for the layout logic."""

    endpoint = "memory://"
    part_size = 8

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}

    def put_file(self, key: str, fileobj: BinaryIO, length: int) -> None:
        self.objects[key] = fileobj.read(length)

    def put_parts(self, key: str, fd: int, length: int, parts: Iterable[Part]) -> None:
        self.objects[key] = b"".join(os.pread(fd, p.size, p.offset) for p in consecutive_parts(key, parts, length, 8))

    def put_bytes(self, key: str, data: bytes) -> None:
        self.put_file(key, io.BytesIO(data), len(data))

    def get_range(self, key: str, start: int, end: int) -> bytes:
        return self.get_bytes(key)[start : end + 1]

    def get_bytes(self, key: str) -> bytes:
        if key not in self.objects:
            raise ObjectNotFound(key)
        return self.objects[key]

    def head(self, key: str) -> int | None:
        return len(self.objects[key]) if key in self.objects else None

    def list_keys(self, prefix: str) -> list[str]:
        return sorted(k for k in self.objects if k.startswith(prefix))

    def delete(self, keys: Iterable[str]) -> None:
        for key in keys:
            self.objects.pop(key, None)


def test_a_copy_under_the_old_layout_is_read_and_deleted() -> None:
    topic = "t" * 249
    ref = SegmentRef(topic, TOPIC_ID, 0, 100, uuid.uuid4())
    manifest = Manifest(
        topic=topic, topic_id=TOPIC_ID, partition=0, segment_id=ref.segment_id, base_offset=100, end_offset=199,
        max_timestamp=1, leader_epochs=[(0, 100)], log_size=3, log_crc32c=0, indexes_size=0, indexes_crc32c=0,
        index_parts={}, created_ms=1,
    )  # fmt: skip
    store = DictStore()
    for kind in ("log", "indexes"):
        store.put_bytes(str(ref.legacy_key(kind)), b"abc")
    store.put_bytes(str(ref.legacy_key("manifest")), manifest.encode())
    copier = SegmentCopier(store)
    assert copier.manifest(ref) == manifest
    copier.delete(ref)
    assert store.objects == {}
    with pytest.raises(ObjectNotFound):
        copier.manifest(ref)
