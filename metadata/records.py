"""Versioned metadata records: the WAL's payloads.

Each record is a pydantic model (validated when built by a writer) with a compact binary encoding
(decoded without re-validation on replay, which must run at well over 100k records/s):

    magic 0xA7 | version u8 | type u8 | broker id i32 | leader epoch i32 | fencing token i64 | event time i64
    | the type's fixed fields (big-endian struct) | topic name (u16 + UTF-8) | extras

Version 1 is the only one. A reader skips and counts a record of a newer version (written by a newer
sidecar) and reports a record it cannot parse as garbage; neither stops replay. A record that parses
but carries a value no writer can produce (an unknown state or action id, a negative partition or
offset, an end offset below the base) is garbage too: ``parse`` checks every field a replica acts on.
"""

from __future__ import annotations

import base64
import struct
import uuid
from abc import abstractmethod
from typing import Annotated, ClassVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from segment_fsm import LogStartKind, PartitionDeleteState, SegmentState, TopicAction
from tiering_core.errors import TieringError

VERSION = 1
MAGIC = 0xA7
_HEAD = struct.Struct(">BBB")
_U16 = struct.Struct(">H")
EPOCH_ENTRY = struct.Struct(">iq")  # a leader-epoch entry: (epoch, start offset)

TopicName = Annotated[str, Field(min_length=1, max_length=249)]  # Kafka's limit on topic names


class RecordDecodeError(TieringError):
    """A WAL record could not be decoded (garbage): it is skipped and counted, never applied."""


class UnknownVersion(TieringError):
    """A WAL record from a newer format version: skipped and counted."""


def topic_id_bytes(topic_id: str) -> bytes:
    """Kafka's base64 topic id (22 characters, URL-safe or standard alphabet) as its 16 raw bytes."""
    try:
        if len(topic_id) != 22:
            raise ValueError("not 22 characters")
        return base64.b64decode(topic_id.replace("-", "+").replace("_", "/") + "==", validate=True)
    except ValueError as exc:  # binascii.Error is a ValueError
        raise ValueError(f"topic id {topic_id!r} is not a Kafka Uuid (22 base64 characters): {exc}") from exc


def topic_id_str(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _canonical_topic_id(value: str) -> str:
    return topic_id_str(topic_id_bytes(value))


# Kafka's Uuid as Kafka prints it: URL-safe base64 without padding (confluent-kafka's str(Uuid) uses
# the standard alphabet; either is accepted and stored in Kafka's form)
TopicId = Annotated[str, AfterValidator(_canonical_topic_id)]


class _Record(BaseModel):
    """What every record carries: who wrote it, under which leader epoch and lease token, and when.

    ``fencing_token`` is the create revision of the writer's etcd lease key (0 without etcd);
    operator records (topic and cluster actions) carry broker id and leader epoch -1.
    """

    model_config = ConfigDict(frozen=True)
    TYPE: ClassVar[int]
    FIXED: ClassVar[struct.Struct]  # starts with the common fields: broker id, leader epoch, token, time

    broker_id: int = -1
    leader_epoch: int = -1
    fencing_token: int = Field(default=0, ge=0)
    event_time: int

    @abstractmethod
    def raw(self) -> tuple:
        """The record's fields in ``parse`` order (ids as raw bytes, enums as ints)."""

    def _common(self) -> tuple[int, int, int, int]:
        return self.broker_id, self.leader_epoch, self.fencing_token, self.event_time

    def encode(self) -> bytes:
        return unparse(self.TYPE, self.raw())


class PartitionRecord(_Record):
    """A record about one user partition, written by its leader's sidecar (broker id and epoch required)."""

    broker_id: int
    leader_epoch: int
    topic: TopicName
    topic_id: TopicId
    partition: int = Field(ge=0)


class SegmentRecord(PartitionRecord):
    """A segment copy's transition to ``state``, written by the partition leader's sidecar.

    ``end_offset`` is inclusive; ``first_timestamp`` / ``max_timestamp`` are the lowest batch base
    timestamp and the highest max timestamp in the segment; ``leader_epochs`` are the (epoch, start
    offset) entries of Kafka's leader-epoch cache that cover the segment; ``segment_id`` is new for
    every copy attempt. With topic name, topic id and partition, (base offset, segment id) names the
    segment's objects in the remote store. As in Kafka, COPY_SEGMENT_STARTED fixes the offsets,
    timestamps and size; later records of the copy (same segment id and base offset) move its state.
    """

    TYPE: ClassVar[int] = 1
    FIXED: ClassVar[struct.Struct] = struct.Struct(">iiqq16si16sBqqqqq")

    segment_id: uuid.UUID
    state: SegmentState
    base_offset: int = Field(ge=0)
    end_offset: int = Field(ge=0)
    first_timestamp: int = -1
    max_timestamp: int = -1
    size: int = Field(ge=0)
    leader_epochs: tuple[tuple[int, int], ...] = ()

    @model_validator(mode="after")
    def _offsets_in_order(self) -> SegmentRecord:
        if self.end_offset < self.base_offset:
            raise ValueError(f"end_offset {self.end_offset} is below base_offset {self.base_offset}")
        return self

    def raw(self) -> tuple:
        return (
            *self._common(), topic_id_bytes(self.topic_id), self.partition, self.segment_id.bytes, self.state,
            self.base_offset, self.end_offset, self.first_timestamp, self.max_timestamp, self.size, self.topic,
            b"".join(EPOCH_ENTRY.pack(e, o) for e, o in self.leader_epochs),
        )  # fmt: skip


class PartitionDeleteRecord(PartitionRecord):
    """A deleted topic's partition moving through DELETE_PARTITION_MARKED / STARTED / FINISHED."""

    TYPE: ClassVar[int] = 2
    FIXED: ClassVar[struct.Struct] = struct.Struct(">iiqq16siB")

    state: PartitionDeleteState

    def raw(self) -> tuple:
        return (*self._common(), topic_id_bytes(self.topic_id), self.partition, self.state, self.topic)


class TopicRecord(_Record):
    """An operator's action on a topic's tiering (``tiering topic enable|pause-upload|...``)."""

    TYPE: ClassVar[int] = 3
    FIXED: ClassVar[struct.Struct] = struct.Struct(">iiqq16sBqq")

    topic: TopicName
    topic_id: TopicId
    action: TopicAction
    local_retention_ms: int = Field(default=-2, ge=-2)
    local_retention_bytes: int = Field(default=-2, ge=-2)

    def raw(self) -> tuple:
        return (
            *self._common(), topic_id_bytes(self.topic_id), self.action, self.local_retention_ms,
            self.local_retention_bytes, self.topic,
        )  # fmt: skip


class ClusterRecord(_Record):
    """An operator's action on the whole cluster: PAUSE_UPLOAD, RESUME_UPLOAD, ROLLBACK or ENABLE."""

    TYPE: ClassVar[int] = 4
    FIXED: ClassVar[struct.Struct] = struct.Struct(">iiqqB")

    action: TopicAction

    def raw(self) -> tuple:
        return (*self._common(), self.action)


class LogStartRecord(PartitionRecord):
    """A partition's log start offsets (``segment_fsm.log_start``), written by its leader's sidecar.

    LOCAL_LOG_START: local retention is about to ask the broker for ``offset`` (written before the
    ``delete_records`` call). LOG_START: the broker's log start offset ``offset`` is above every offset
    recorded so far; copies entirely below it are deleted.
    """

    TYPE: ClassVar[int] = 5
    FIXED: ClassVar[struct.Struct] = struct.Struct(">iiqq16siBq")

    kind: LogStartKind
    offset: int = Field(ge=0)

    def raw(self) -> tuple:
        return (
            *self._common(), topic_id_bytes(self.topic_id), self.partition, self.kind, self.offset, self.topic,
        )  # fmt: skip


MetadataRecord = SegmentRecord | PartitionDeleteRecord | TopicRecord | ClusterRecord | LogStartRecord
_TYPES: dict[int, type[_Record]] = {
    c.TYPE: c for c in (SegmentRecord, PartitionDeleteRecord, TopicRecord, ClusterRecord, LogStartRecord)
}
_NFIXED = {kind: len(cls.FIXED.unpack(bytes(cls.FIXED.size))) for kind, cls in _TYPES.items()}


def _name_bytes(name: str) -> bytes:
    raw = name.encode()
    return _U16.pack(len(raw)) + raw


def unparse(kind: int, fields: tuple) -> bytes:
    """One WAL payload from raw fields in ``parse`` order: the inverse of ``parse``.

    Bulk writers (benchmarks, tools) use it to skip building models; it does not validate.
    """
    cls = _TYPES[kind]
    n = _NFIXED[kind]
    out = _HEAD.pack(MAGIC, VERSION, kind) + cls.FIXED.pack(*fields[:n])
    if kind == ClusterRecord.TYPE:
        return out
    out += _name_bytes(fields[n])
    if kind == SegmentRecord.TYPE:
        epochs = fields[n + 1]
        out += _U16.pack(len(epochs) // EPOCH_ENTRY.size) + epochs
    return out


_SEGMENT_STATES = frozenset(int(s) for s in SegmentState)
_PARTITION_STATES = frozenset(int(s) for s in PartitionDeleteState)
_ACTIONS = frozenset(int(a) for a in TopicAction)
_LOG_START_KINDS = frozenset(int(k) for k in LogStartKind)
_MAX_NAME = 249


def _invalid(kind: int, fields: tuple) -> str | None:
    """Why a parsed record's fields are not ones a writer can produce, or None when they are valid."""
    name = _TYPES[kind].__name__
    token = fields[2]
    if token < 0:
        return f"{name} has a negative fencing token {token}"
    if kind == ClusterRecord.TYPE:
        return None if fields[4] in _ACTIONS else f"{name} has an unknown action id {fields[4]}"
    topic, partition = fields[-1] if kind != SegmentRecord.TYPE else fields[13], fields[5]
    if not 0 < len(topic) <= _MAX_NAME:
        return f"{name} has a topic name of {len(topic)} characters"
    if kind == TopicRecord.TYPE:
        if fields[5] not in _ACTIONS:
            return f"{name} of topic {topic} has an unknown action id {fields[5]}"
        if min(fields[6], fields[7]) < -2:
            return f"{name} of topic {topic} has local retention {fields[6]} ms / {fields[7]} bytes below -2"
        return None
    if partition < 0:
        return f"{name} of topic {topic} has a negative partition {partition}"
    if kind == LogStartRecord.TYPE:
        if fields[6] not in _LOG_START_KINDS or fields[7] < 0:
            return f"{name} of {topic}-{partition} has kind {fields[6]} and offset {fields[7]}"
        return None
    if kind == PartitionDeleteRecord.TYPE:
        return (
            None
            if fields[6] in _PARTITION_STATES
            else f"{name} of {topic}-{partition} has an unknown state id {fields[6]}"
        )
    state, base, end, size = fields[7], fields[8], fields[9], fields[12]
    if state not in _SEGMENT_STATES:
        return f"{name} of {topic}-{partition} at offset {base} has an unknown state id {state}"
    if base < 0 or end < base or size < 0:
        return f"{name} of {topic}-{partition} has offsets {base}..{end} and size {size}"
    return None


_SEGMENT_HEAD = _HEAD.pack(MAGIC, VERSION, SegmentRecord.TYPE)
_SEGMENT_FIXED = struct.Struct(SegmentRecord.FIXED.format + "H")  # the fixed fields + the topic name length


def parse(data: bytes) -> tuple[int, tuple]:
    """Split one WAL payload into (record type, raw fields): the replay fast path.

    Fields are in struct order with ids as raw 16-byte strings and enums as ints, then the topic
    name (str) and, for segments, the raw leader-epoch entries (bytes, 12 per entry). Raises
    UnknownVersion for a newer format and RecordDecodeError for anything unparseable or invalid.
    """
    if data[:3] == _SEGMENT_HEAD:  # the common case, in one unpack
        try:
            f = _SEGMENT_FIXED.unpack_from(data, 3)
            pos = 3 + _SEGMENT_FIXED.size + f[-1]
            topic = data[pos - f[-1] : pos].decode()
            (count,) = _U16.unpack_from(data, pos)
        except (struct.error, UnicodeDecodeError) as exc:
            raise RecordDecodeError(f"malformed SegmentRecord: {exc}") from exc
        if pos + 2 + count * EPOCH_ENTRY.size != len(data):
            raise RecordDecodeError("malformed SegmentRecord: leader epochs do not fill the record")
        fields = (*f[:-1], topic, data[pos + 2 :])
        # the common case in one expression; _invalid names the problem when there is one
        if (
            f[7] not in _SEGMENT_STATES
            or f[5] < 0
            or f[8] < 0
            or f[9] < f[8]
            or f[12] < 0
            or f[2] < 0
            or not (0 < len(topic) <= _MAX_NAME)
        ):
            raise RecordDecodeError(f"invalid record: {_invalid(SegmentRecord.TYPE, fields)}")
        return SegmentRecord.TYPE, fields
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
        else:
            (n,) = _U16.unpack_from(data, pos)
            topic = data[pos + 2 : pos + 2 + n].decode()
            if pos + 2 + n != len(data):
                raise ValueError("trailing bytes or topic name past the end")
            fields = (*fields, topic)
    except (struct.error, ValueError, UnicodeDecodeError) as exc:
        raise RecordDecodeError(f"malformed {cls.__name__}: {exc}") from exc
    problem = _invalid(kind, fields)
    if problem is not None:
        raise RecordDecodeError(f"invalid record: {problem}")
    return kind, fields


def decode(data: bytes) -> MetadataRecord:
    """Decode one WAL payload into its model (for tools and tests; replay uses ``parse``)."""
    kind, f = parse(data)
    common = {"broker_id": f[0], "leader_epoch": f[1], "fencing_token": f[2], "event_time": f[3]}
    try:
        if kind == SegmentRecord.TYPE:
            return SegmentRecord(
                **common, topic_id=topic_id_str(f[4]), partition=f[5], segment_id=uuid.UUID(bytes=f[6]),
                state=SegmentState(f[7]), base_offset=f[8], end_offset=f[9], first_timestamp=f[10],
                max_timestamp=f[11], size=f[12], topic=f[13], leader_epochs=tuple(EPOCH_ENTRY.iter_unpack(f[14])),
            )  # fmt: skip
        if kind == PartitionDeleteRecord.TYPE:
            return PartitionDeleteRecord(
                **common, topic_id=topic_id_str(f[4]), partition=f[5], state=PartitionDeleteState(f[6]), topic=f[7]
            )
        if kind == TopicRecord.TYPE:
            return TopicRecord(
                **common, topic_id=topic_id_str(f[4]), action=TopicAction(f[5]), local_retention_ms=f[6],
                local_retention_bytes=f[7], topic=f[8],
            )  # fmt: skip
        if kind == LogStartRecord.TYPE:
            return LogStartRecord(
                **common, topic_id=topic_id_str(f[4]), partition=f[5], kind=LogStartKind(f[6]), offset=f[7],
                topic=f[8],
            )  # fmt: skip
        return ClusterRecord(**common, action=TopicAction(f[4]))
    except ValueError as exc:  # pydantic's ValidationError and bad enum ids are ValueErrors
        raise RecordDecodeError(f"invalid record fields: {exc}") from exc
