"""Versioned metadata records: the WAL's payloads.

Each record is a pydantic model (validated when built by a writer) with a compact binary encoding
(decoded without re-validation on replay, which must run at well over 100k records/s):

    magic 0xA7 | version u8 | type u8 | fixed fields (big-endian struct) | topic name (u16 + UTF-8) | extras

Version 1 is the only one. A reader skips and counts a record of a newer version (written by a newer
sidecar) and reports a record it cannot parse as garbage; neither stops replay.
"""

from __future__ import annotations

import base64
import struct
import uuid
from typing import Annotated, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from segment_fsm import PartitionDeleteState, SegmentState, TopicAction
from tiering.errors import TieringError

VERSION = 1
MAGIC = 0xA7
_HEAD = struct.Struct(">BBB")
_U16 = struct.Struct(">H")
_EPOCH = struct.Struct(">iq")

Offset = Annotated[int, Field(ge=-1)]


class RecordDecodeError(TieringError):
    """A WAL record could not be decoded (garbage): it is skipped and counted, never applied."""


class UnknownVersion(TieringError):
    """A WAL record from a newer format version: skipped and counted."""


def topic_id_bytes(topic_id: str) -> bytes:
    """Kafka's base64 topic id (22 characters) as its 16 raw bytes."""
    raw = base64.urlsafe_b64decode(topic_id + "==")
    if len(raw) != 16:
        raise ValueError(f"topic id {topic_id!r} is not a 16-byte Kafka Uuid")
    return raw


def topic_id_str(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True)
    TYPE: ClassVar[int]
    FIXED: ClassVar[struct.Struct]

    def encode(self) -> bytes:
        raise NotImplementedError


def _name_bytes(name: str) -> bytes:
    raw = name.encode()
    return _U16.pack(len(raw)) + raw


class SegmentRecord(_Record):
    """A segment copy's transition to ``state``, written by the partition leader's sidecar.

    ``end_offset`` is inclusive; ``leader_epochs`` are the (epoch, start offset) entries of Kafka's
    leader-epoch cache that cover the segment; ``segment_id`` is new for every copy attempt.
    """

    TYPE: ClassVar[int] = 1
    FIXED: ClassVar[struct.Struct] = struct.Struct(">16si16sBiiqqqqqq")

    topic: str
    topic_id: str
    partition: int = Field(ge=0)
    segment_id: uuid.UUID
    state: SegmentState
    broker_id: int
    leader_epoch: int
    fencing_token: int = 0
    event_time: int
    base_offset: int = Field(ge=0)
    end_offset: int = Field(ge=0)
    max_timestamp: int = -1
    size: int = Field(ge=0)
    leader_epochs: tuple[tuple[int, int], ...] = ()

    def encode(self) -> bytes:
        fixed = self.FIXED.pack(
            topic_id_bytes(self.topic_id), self.partition, self.segment_id.bytes, self.state, self.broker_id,
            self.leader_epoch, self.fencing_token, self.event_time, self.base_offset, self.end_offset,
            self.max_timestamp, self.size,
        )  # fmt: skip
        epochs = _U16.pack(len(self.leader_epochs)) + b"".join(_EPOCH.pack(e, o) for e, o in self.leader_epochs)
        return _HEAD.pack(MAGIC, VERSION, self.TYPE) + fixed + _name_bytes(self.topic) + epochs


class PartitionDeleteRecord(_Record):
    """A deleted topic's partition moving through DELETE_PARTITION_MARKED / STARTED / FINISHED."""

    TYPE: ClassVar[int] = 2
    FIXED: ClassVar[struct.Struct] = struct.Struct(">16siBiiqq")

    topic: str
    topic_id: str
    partition: int = Field(ge=0)
    state: PartitionDeleteState
    broker_id: int
    leader_epoch: int
    fencing_token: int = 0
    event_time: int

    def encode(self) -> bytes:
        fixed = self.FIXED.pack(
            topic_id_bytes(self.topic_id), self.partition, self.state, self.broker_id, self.leader_epoch,
            self.fencing_token, self.event_time,
        )  # fmt: skip
        return _HEAD.pack(MAGIC, VERSION, self.TYPE) + fixed + _name_bytes(self.topic)


class TopicRecord(_Record):
    """An operator's action on a topic's tiering (``tiering topic enable|pause-upload|...``)."""

    TYPE: ClassVar[int] = 3
    FIXED: ClassVar[struct.Struct] = struct.Struct(">16sBqqiq")

    topic: str
    topic_id: str
    action: TopicAction
    local_retention_ms: int = Field(default=-2, ge=-2)
    local_retention_bytes: int = Field(default=-2, ge=-2)
    broker_id: int = -1
    event_time: int

    def encode(self) -> bytes:
        fixed = self.FIXED.pack(
            topic_id_bytes(self.topic_id), self.action, self.local_retention_ms, self.local_retention_bytes,
            self.broker_id, self.event_time,
        )  # fmt: skip
        return _HEAD.pack(MAGIC, VERSION, self.TYPE) + fixed + _name_bytes(self.topic)


class ClusterRecord(_Record):
    """An operator's action on the whole cluster: PAUSE_UPLOAD, RESUME_UPLOAD or ROLLBACK."""

    TYPE: ClassVar[int] = 4
    FIXED: ClassVar[struct.Struct] = struct.Struct(">Bq")

    action: TopicAction
    event_time: int

    def encode(self) -> bytes:
        return _HEAD.pack(MAGIC, VERSION, self.TYPE) + self.FIXED.pack(self.action, self.event_time)


MetadataRecord = SegmentRecord | PartitionDeleteRecord | TopicRecord | ClusterRecord
_TYPES: dict[int, type[_Record]] = {
    c.TYPE: c for c in (SegmentRecord, PartitionDeleteRecord, TopicRecord, ClusterRecord)
}


_SEGMENT_HEAD = _HEAD.pack(MAGIC, VERSION, 1)
_SEGMENT_FIXED = struct.Struct(">16si16sBiiqqqqqqH")  # SegmentRecord.FIXED + the topic name length


def parse(data: bytes) -> tuple[int, tuple]:
    """Split one WAL payload into (record type, raw fields): the replay fast path.

    Fields are in struct order with ids as raw 16-byte strings and enums as ints, then the topic
    name (str) and, for segments, the raw leader-epoch entries (bytes, 12 per entry). Raises
    UnknownVersion for a newer format and RecordDecodeError for anything unparseable.
    """
    if data[:3] == _SEGMENT_HEAD:  # the common case, in one unpack
        try:
            f = _SEGMENT_FIXED.unpack_from(data, 3)
            pos = 3 + _SEGMENT_FIXED.size + f[12]
            topic = data[pos - f[12] : pos].decode()
            (count,) = _U16.unpack_from(data, pos)
        except (struct.error, UnicodeDecodeError) as exc:
            raise RecordDecodeError(f"malformed SegmentRecord: {exc}") from exc
        if pos + 2 + count * 12 != len(data):
            raise RecordDecodeError("malformed SegmentRecord: leader epochs do not fill the record")
        return 1, (*f[:12], topic, data[pos + 2 :])
    try:
        magic, version, kind = _HEAD.unpack_from(data, 0)
    except struct.error as exc:
        raise RecordDecodeError(f"record of {len(data)} bytes is too short for a header") from exc
    if magic != MAGIC:
        raise RecordDecodeError(f"not a tiering metadata record (first byte {magic:#04x})")
    if version > VERSION:
        raise UnknownVersion(f"record version {version} is newer than {VERSION}")
    cls = _TYPES.get(kind)
    if version != VERSION or cls is None or kind == SegmentRecord.TYPE:
        raise RecordDecodeError(f"unknown record version {version} / type {kind}")
    try:
        fields = cls.FIXED.unpack_from(data, 3)
        pos = 3 + cls.FIXED.size
        if kind == ClusterRecord.TYPE:
            if pos != len(data):
                raise ValueError("trailing bytes")
            return kind, fields
        (n,) = _U16.unpack_from(data, pos)
        topic = data[pos + 2 : pos + 2 + n].decode()
        if pos + 2 + n != len(data):
            raise ValueError("trailing bytes or topic name past the end")
        return kind, (*fields, topic)
    except (struct.error, ValueError, UnicodeDecodeError) as exc:
        raise RecordDecodeError(f"malformed {cls.__name__}: {exc}") from exc


def decode(data: bytes) -> MetadataRecord:
    """Decode one WAL payload into its model (for tools and tests; replay uses ``parse``)."""
    kind, f = parse(data)
    try:
        if kind == SegmentRecord.TYPE:
            return SegmentRecord(
                topic=f[12], topic_id=topic_id_str(f[0]), partition=f[1], segment_id=uuid.UUID(bytes=f[2]),
                state=SegmentState(f[3]), broker_id=f[4], leader_epoch=f[5], fencing_token=f[6],
                event_time=f[7], base_offset=f[8], end_offset=f[9], max_timestamp=f[10], size=f[11],
                leader_epochs=tuple(_EPOCH.iter_unpack(f[13])),
            )  # fmt: skip
        if kind == PartitionDeleteRecord.TYPE:
            return PartitionDeleteRecord(
                topic=f[7], topic_id=topic_id_str(f[0]), partition=f[1], state=PartitionDeleteState(f[2]),
                broker_id=f[3], leader_epoch=f[4], fencing_token=f[5], event_time=f[6],
            )  # fmt: skip
        if kind == TopicRecord.TYPE:
            return TopicRecord(
                topic=f[6], topic_id=topic_id_str(f[0]), action=TopicAction(f[1]), local_retention_ms=f[2],
                local_retention_bytes=f[3], broker_id=f[4], event_time=f[5],
            )  # fmt: skip
        return ClusterRecord(action=TopicAction(f[0]), event_time=f[1])
    except ValueError as exc:  # pydantic's ValidationError and bad enum ids are ValueErrors
        raise RecordDecodeError(f"invalid record fields: {exc}") from exc
