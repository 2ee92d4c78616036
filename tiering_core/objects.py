"""Remote object layout of a segment copy, and its manifest.

Keys (one factory, here)::

    <topic>-<topicId>/<partition>/<20-digit base offset>-<segmentId>.<log|indexes|manifest>
    e.g. orders-mXjDWYvGQ3SdP7gQi3DrqA/3/00000000000000001234-5f0c...e1.log

under the cluster's prefix (``remote_storage.prefix``), which the store applies (``PrefixedStore``).

The topic id keeps a deleted-and-recreated topic apart; the segment id (new for every copy attempt)
means a retried or fenced upload never overwrites a committed copy.

The ``<topic>-<topicId>`` component is at most 255 bytes (``TOPIC_DIR_MAX_BYTES``): MinIO and every
store kept on a POSIX filesystem refuse longer path components, while a legal Kafka topic name has up
to 249 characters and the id 22. A name longer than 232 characters is cut to its first 232 (the topic
id alone is unique, the prefix keeps it readable), so every legal name fits; names of up to 232
characters keep exactly the keys they always had. Copies written before the cut existed (possible on
AWS S3, whose keys may have 1024 bytes in any component) stay readable: ``legacy_key`` and
``partition_prefixes`` name where they are, and readers and deleters look there too. ``.indexes`` concatenates the
offset index, time index, transaction index, producer snapshot and leader-epoch checkpoint; the
manifest (JSON, versioned, written last) says where each part is and holds checksums and offsets.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

from tiering_core.errors import TieringError

MANIFEST_VERSION = 1
# A manifest is well under a KiB of JSON; a reader reads at most this much of one (a larger object is not a manifest)
MANIFEST_MAX_BYTES = 1 << 20
TOPIC_DIR_MAX_BYTES = 255
INDEX_PARTS = ("offset", "time", "txn", "producer_snapshot", "leader_epoch")


@dataclass(frozen=True, slots=True)
class SegmentRef:
    """Identifies one copy of one segment."""

    topic: str
    topic_id: str
    partition: int
    base_offset: int
    segment_id: uuid.UUID

    def partition_prefix(self) -> str:
        return partition_prefix(self.topic, self.topic_id, self.partition)

    def key(self, kind: str) -> str:
        return f"{self.partition_prefix()}/{self._name(kind)}"

    def object_keys(self) -> list[str]:
        """All keys of the copy, manifest last (the order to write; delete in reverse)."""
        return [self.key(k) for k in ("log", "indexes", "manifest")]

    def legacy_key(self, kind: str) -> str | None:
        """Where a copy written before topic names were cut keeps this object; None if it is ``key``."""
        if _fits(self.topic, self.topic_id):
            return None
        return f"{self.topic}-{self.topic_id}/{self.partition}/{self._name(kind)}"

    def _name(self, kind: str) -> str:
        return f"{self.base_offset:020d}-{self.segment_id.hex}.{kind}"


def topic_dir(topic: str, topic_id: str) -> str:
    """``<topic>-<topicId>``, the name cut so that it fits ``TOPIC_DIR_MAX_BYTES`` (Kafka names are ASCII)."""
    room = TOPIC_DIR_MAX_BYTES - len(topic_id) - 1
    return f"{topic[:room]}-{topic_id}"


def _fits(topic: str, topic_id: str) -> bool:
    return len(topic) + 1 + len(topic_id) <= TOPIC_DIR_MAX_BYTES


def partition_prefix(topic: str, topic_id: str, partition: int) -> str:
    return f"{topic_dir(topic, topic_id)}/{partition}"


def partition_prefixes(topic: str, topic_id: str, partition: int) -> list[str]:
    """Every prefix that may hold the partition's objects: the current one, then the legacy one if it differs."""
    current = partition_prefix(topic, topic_id, partition)
    if _fits(topic, topic_id):
        return [current]
    return [current, f"{topic}-{topic_id}/{partition}"]


def parse_key(key: str) -> tuple[int, uuid.UUID, str] | None:
    """(base offset, segment id, kind) of a segment object key, None for anything else."""
    name = key.rsplit("/", 1)[-1]
    stem, _, kind = name.partition(".")
    base, _, sid = stem.partition("-")
    if len(base) != 20 or not base.isdigit() or kind not in ("log", "indexes", "manifest"):
        return None
    try:
        return int(base), uuid.UUID(hex=sid), kind
    except ValueError:
        return None


class ManifestError(TieringError):
    """A manifest is missing fields, of an unknown version, or does not match its objects."""


class Manifest(BaseModel):
    """What a finished copy holds. Offsets inclusive; checksums are CRC-32C of the object bytes."""

    model_config = ConfigDict(frozen=True)

    version: int = MANIFEST_VERSION
    topic: str
    topic_id: str
    partition: int
    segment_id: uuid.UUID
    base_offset: int
    end_offset: int
    max_timestamp: int
    leader_epochs: list[tuple[int, int]]
    log_size: int
    log_crc32c: int
    indexes_size: int
    indexes_crc32c: int
    index_parts: dict[str, tuple[int, int]]  # name -> (position in .indexes, length)
    created_ms: int
    leader_epoch: int = -1  # the epoch of the leader that made the copy (its WAL records'); -1: not recorded

    def preference(self) -> tuple[int, int, int, str]:
        """Where copies overlap, the one with the largest preference holds the offset: the copy made under
        the higher leader epoch (after an unclean election the new leader's log is the partition's, even where
        its records carry older epochs), then the higher base offset, then the later one. Copies made under
        one epoch hold the same records at the offsets they share (a leader's log only grows), so the rest
        only makes the choice the same everywhere. The metadata's ``segment_for_offset`` applies the same
        rule to the WAL's records; a manifest written before ``leader_epoch`` was recorded counts its records'
        highest epoch, which is at most the leader's."""
        epoch = self.leader_epoch if self.leader_epoch >= 0 else max((e for e, _ in self.leader_epochs), default=-1)
        return (epoch, self.base_offset, self.created_ms, self.segment_id.hex)

    @property
    def ref(self) -> SegmentRef:
        return SegmentRef(self.topic, self.topic_id, self.partition, self.base_offset, self.segment_id)

    def mismatch(self, end_offset: int, log_size: int) -> str | None:
        """Why this copy does not hold exactly offsets ``base_offset..end_offset`` (inclusive) in
        ``log_size`` bytes, or None when it does. A copy that falls short must never be finished or
        let local data be deleted."""
        if (self.end_offset, self.log_size) == (end_offset, log_size):
            return None
        return (
            f"copy {self.segment_id.hex} of {self.topic}-{self.partition} holds offsets "
            f"{self.base_offset}..{self.end_offset} in {self.log_size} bytes, "
            f"the segment offsets {self.base_offset}..{end_offset} in {log_size} bytes"
        )

    def encode(self) -> bytes:
        return self.model_dump_json().encode()

    @classmethod
    def decode(cls, data: bytes, key: str) -> Manifest:
        try:
            raw = json.loads(data)
            if raw.get("version") != MANIFEST_VERSION:
                raise ManifestError(f"{key}: unsupported manifest version {raw.get('version')}")
            return cls.model_validate(raw)
        except (ValueError, TypeError) as exc:
            raise ManifestError(f"{key}: malformed manifest: {exc}") from exc
