"""Records that parse but carry values no writer produces are garbage: counted, never applied, never fatal."""

from __future__ import annotations

import struct
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metadata import (
    ClusterRecord,
    MetadataState,
    PartitionDeleteRecord,
    RecordDecodeError,
    SegmentRecord,
    TopicRecord,
    UnknownVersion,
)
from metadata.records import parse, topic_id_bytes, unparse
from segment_fsm import PartitionDeleteState, SegmentState, TopicAction
from tests.metadata_factory import TOPIC_ID, seg

S = SegmentState
TID = topic_id_bytes(TOPIC_ID)
SID = uuid.UUID(int=7).bytes


def segment_fields(**changes: object) -> tuple:
    # broker, epoch, token, time, tid, partition, sid, state, base, end, first_ts, max_ts, size, topic, epochs
    fields = dict(broker=1, epoch=3, token=0, time=5, tid=TID, partition=0, sid=SID, state=0, base=10, end=19,
                  first_ts=1, max_ts=2, size=100, topic="orders", epochs=struct.pack(">iq", 3, 10))  # fmt: skip
    fields.update(changes)
    return tuple(fields.values())


BAD = [
    (SegmentRecord.TYPE, segment_fields(state=4), "unknown state id 4"),
    (SegmentRecord.TYPE, segment_fields(state=255), "unknown state id 255"),
    (SegmentRecord.TYPE, segment_fields(partition=-1), "negative partition -1"),
    (SegmentRecord.TYPE, segment_fields(base=-5, end=3), "offsets -5..3"),
    (SegmentRecord.TYPE, segment_fields(base=20, end=19), "offsets 20..19"),
    (SegmentRecord.TYPE, segment_fields(size=-1), "size -1"),
    (SegmentRecord.TYPE, segment_fields(token=-3), "negative fencing token -3"),
    (SegmentRecord.TYPE, segment_fields(topic=""), "topic name of 0 characters"),
    (PartitionDeleteRecord.TYPE, (1, 3, 0, 5, TID, 0, 3, "orders"), "unknown state id 3"),
    (PartitionDeleteRecord.TYPE, (1, 3, 0, 5, TID, -2, 1, "orders"), "negative partition -2"),
    (TopicRecord.TYPE, (-1, -1, 0, 5, TID, 42, -2, -2, "orders"), "unknown action id 42"),
    (TopicRecord.TYPE, (-1, -1, 0, 5, TID, 0, -3, -2, "orders"), "local retention -3 ms"),
    (ClusterRecord.TYPE, (-1, -1, 0, 5, 200), "unknown action id 200"),
]


@pytest.mark.parametrize(("kind", "fields", "why"), BAD)
def test_a_record_with_a_value_no_writer_produces_is_garbage(kind: int, fields: tuple, why: str) -> None:
    payload = unparse(kind, fields)
    with pytest.raises(RecordDecodeError, match=why):
        parse(payload)
    state = MetadataState()
    with pytest.raises(RecordDecodeError):
        state.apply_payload(payload)
    assert state.counters.garbage == 1 and state.counters.applied == 0
    assert state.partitions == {} and state.topics == {}  # nothing of it was applied
    good = seg(uuid.uuid4(), S.COPY_SEGMENT_STARTED, 0, 9)
    assert state.apply(good).accepted  # and the next record applies as usual


def test_valid_boundary_values_still_parse() -> None:
    for state in SegmentState:
        assert parse(unparse(SegmentRecord.TYPE, segment_fields(state=int(state))))[1][7] == state
    for p_state in PartitionDeleteState:
        assert parse(unparse(PartitionDeleteRecord.TYPE, (1, 3, 0, 5, TID, 0, int(p_state), "t")))[0] == 2
    for action in TopicAction:
        assert parse(unparse(TopicRecord.TYPE, (-1, -1, 0, 5, TID, int(action), -2, -1, "t")))[0] == 3
        assert parse(unparse(ClusterRecord.TYPE, (-1, -1, 0, 5, int(action))))[0] == 4
    assert parse(unparse(SegmentRecord.TYPE, segment_fields(base=0, end=0, size=0, topic="x" * 249)))


def _valid_payloads() -> list[bytes]:
    sid = uuid.uuid4()
    return [
        seg(sid, S.COPY_SEGMENT_STARTED, 100, 199).encode(),
        seg(sid, S.COPY_SEGMENT_FINISHED, 100, 199).encode(),
        PartitionDeleteRecord(
            topic="orders",
            topic_id=TOPIC_ID,
            partition=2,
            broker_id=1,
            leader_epoch=1,
            event_time=3,
            state=PartitionDeleteState.DELETE_PARTITION_MARKED,
        ).encode(),
        TopicRecord(topic="orders", topic_id=TOPIC_ID, action=TopicAction.ENABLE, event_time=1).encode(),
        ClusterRecord(action=TopicAction.PAUSE_UPLOAD, event_time=1).encode(),
    ]


@settings(max_examples=400, deadline=None)
@given(
    which=st.integers(0, 4),
    edits=st.lists(st.tuples(st.integers(0, 200), st.integers(0, 255)), min_size=1, max_size=4),
)
def test_any_damaged_record_is_applied_skipped_or_garbage_never_an_exception(
    which: int, edits: list[tuple[int, int]]
) -> None:
    """Bytes flipped anywhere in valid records: the state either applies/rejects the record or counts it
    as garbage / newer version; no other exception escapes (one would kill the metadata follower)."""
    state = MetadataState()
    for payload in _valid_payloads()[:which]:  # some history, so updates and fences are exercised too
        state.apply_payload(payload)
    data = bytearray(_valid_payloads()[which])
    for pos, value in edits:
        data[pos % len(data)] = value
    before = (state.counters.garbage, state.counters.unknown_version)
    try:
        result = state.apply_payload(bytes(data))
    except (RecordDecodeError, UnknownVersion):
        assert (state.counters.garbage, state.counters.unknown_version) != before
        return
    assert result.accepted or result.reason
    state.digest()  # whatever was applied leaves a consistent, queryable state
