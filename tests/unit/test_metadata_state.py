"""The columnar state's queries, compaction, record codec and snapshots (round trip, corruption)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metadata import (
    ClusterRecord,
    MetadataState,
    PartitionDeleteRecord,
    RecordDecodeError,
    SnapshotCorrupt,
    TopicRecord,
    UnknownVersion,
    decode,
)
from metadata.records import parse, unparse
from metadata.snapshot import load_snapshot, write_snapshot
from segment_fsm import PartitionDeleteState, SegmentState, TopicAction
from tests.metadata_factory import TOPIC_ID, seg

S = SegmentState


def finished(state: MetadataState, base: int, end: int, epoch: int = 1, partition: int = 0) -> uuid.UUID:
    sid = uuid.uuid4()
    assert state.apply(seg(sid, S.COPY_SEGMENT_STARTED, base, end, epoch=epoch, partition=partition)).accepted
    assert state.apply(seg(sid, S.COPY_SEGMENT_FINISHED, base, end, epoch=epoch, partition=partition)).accepted
    return sid


def test_bounds_and_lookup_with_overlapping_epochs() -> None:
    state = MetadataState()
    a = finished(state, 0, 99, epoch=1)
    b = finished(state, 100, 199, epoch=1)
    c = finished(state, 150, 299, epoch=2)  # new leader's boundaries overlap the old copy
    p = state.partition(TOPIC_ID, 0)
    assert p is not None
    assert p.remote_bounds() == (0, 299)
    assert p.segment_for_offset(50).segment_id == a.bytes
    assert p.segment_for_offset(120).segment_id == b.bytes
    assert p.segment_for_offset(160).segment_id == c.bytes  # higher epoch wins the overlap
    assert p.segment_for_offset(300) is None
    assert p.remote_size() == 2500  # b's offsets 150..199 count once, in c (the higher epoch): b counts half
    summary = p.summary()
    assert (summary.remote_start_offset, summary.remote_end_offset, summary.remote_size) == (0, 299, 2500)
    assert summary.stored_size == 3000
    assert summary.segment_counts["COPY_SEGMENT_FINISHED"] == 3 and summary.fence == (2, 0)
    assert p.segment_for_offset(160).first_timestamp == 1_150  # the factory's first timestamp: 1000 + base


def test_deleted_segments_leave_the_bounds_and_are_compacted() -> None:
    state = MetadataState()
    ids = [finished(state, i * 10, i * 10 + 9) for i in range(1100)]
    for i, sid in enumerate(ids[:700]):
        assert state.apply(seg(sid, S.DELETE_SEGMENT_STARTED, i * 10, i * 10 + 9)).accepted
        assert state.apply(seg(sid, S.DELETE_SEGMENT_FINISHED, i * 10, i * 10 + 9)).accepted
    p = state.partition(TOPIC_ID, 0)
    assert p is not None
    assert p.remote_bounds() == (7000, 10999)
    assert len(p) < 1100  # finished deletions were compacted away
    assert p.segment_for_offset(8005).segment_id == ids[800].bytes


def test_cached_bounds_follow_every_record_about_the_partition(tmp_path: Path) -> None:
    """``bounds`` (what readers ask per fetch) is computed once per change and never stale: a copy finished, a
    copy deleted, and a partition loaded from a snapshot each give the bounds the copies give."""
    state = MetadataState()
    first = finished(state, 0, 99)
    p = state.partition(TOPIC_ID, 0)
    assert p is not None and p.bounds() == (0, 99)
    finished(state, 100, 199)
    assert p.bounds() == p.remote_bounds() == (0, 199)
    assert state.apply(seg(first, S.DELETE_SEGMENT_STARTED, 0, 99)).accepted
    assert p.bounds() == p.remote_bounds() == (100, 199)
    loaded = load_snapshot(write_snapshot(tmp_path, state, {0: 5})).state.partition(TOPIC_ID, 0)
    assert loaded is not None and loaded.bounds() == (100, 199)


def test_record_codec_round_trip_and_bad_input() -> None:
    record = seg(uuid.uuid4(), S.COPY_SEGMENT_STARTED, 5, 10)
    assert decode(record.encode()) == record
    assert unparse(*parse(record.encode())) == record.encode()
    for other in (
        PartitionDeleteRecord(topic="orders", topic_id=TOPIC_ID, partition=3, state=PartitionDeleteState(1),
                              broker_id=2, leader_epoch=7, fencing_token=12, event_time=5),
        ClusterRecord(action=TopicAction.PAUSE_UPLOAD, event_time=9),
    ):  # fmt: skip
        assert decode(other.encode()) == other
        assert unparse(*parse(other.encode())) == other.encode()
    topic = TopicRecord(topic="orders", topic_id=TOPIC_ID, action=TopicAction.ENABLE, local_retention_ms=1000,
                        event_time=1)  # fmt: skip
    assert decode(topic.encode()) == topic
    with pytest.raises(UnknownVersion):
        decode(b"\xa7\x07\x01rest")
    with pytest.raises(RecordDecodeError):
        decode(record.encode()[:-3])
    with pytest.raises(RecordDecodeError):
        decode(b"garbage!")
    state = MetadataState()
    with pytest.raises(RecordDecodeError):
        state.apply_payload(b"\xa7\x01\x09")
    assert state.counters.garbage == 1


def _populated() -> MetadataState:
    state = MetadataState()
    for partition in range(3):
        for i in range(50):
            finished(state, i * 100, i * 100 + 99, epoch=1 + i // 20, partition=partition)
    state.apply(TopicRecord(topic="orders", topic_id=TOPIC_ID, action=TopicAction.ENABLE, event_time=1))
    state.apply(seg(uuid.uuid4(), S.COPY_SEGMENT_STARTED, 5000, 5099, epoch=3))
    return state


def test_snapshot_round_trip(tmp_path: Path) -> None:
    state = _populated()
    path = write_snapshot(tmp_path, state, {0: 17, 3: 4}, "f7________8AAAAAAAAD_w")
    loaded, offsets, wal_topic_id = load_snapshot(path)
    assert wal_topic_id == "f7________8AAAAAAAAD_w"
    assert offsets == {0: 17, 3: 4}
    assert loaded.digest() == state.digest()
    p = loaded.partition(TOPIC_ID, 1)
    assert p is not None and p.segment_for_offset(4321) == state.partition(TOPIC_ID, 1).segment_for_offset(4321)


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty", "magic"])
def test_corrupt_snapshots_are_detected(tmp_path: Path, damage: str) -> None:
    path = write_snapshot(tmp_path, _populated(), {0: 1})
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "flip":
        data[len(data) // 2] ^= 0x40
    elif damage == "empty":
        data = bytearray()
    else:
        data[0:4] = b"XXXX"
    path.write_bytes(bytes(data))
    with pytest.raises(SnapshotCorrupt, match=str(path)):
        load_snapshot(path)


def test_records_check_themselves_when_built() -> None:
    with pytest.raises(ValueError, match="topic_id"):
        TopicRecord(topic="orders", topic_id="not-a-uuid", action=TopicAction.ENABLE, event_time=1)
    standard = TopicRecord(topic="orders", topic_id="f7////////8AAAAAAAAD/w", action=TopicAction.ENABLE, event_time=1)
    assert standard.topic_id == "f7________8AAAAAAAAD_w"  # confluent-kafka's alphabet, stored in Kafka's form
    with pytest.raises(ValueError, match="topic"):
        TopicRecord(topic="", topic_id=TOPIC_ID, action=TopicAction.ENABLE, event_time=1)
    with pytest.raises(ValueError, match="end_offset"):
        seg(uuid.uuid4(), S.COPY_SEGMENT_STARTED, 0, -5)
    with pytest.raises(ValueError, match="end_offset 4 is below base_offset 5"):
        seg(uuid.uuid4(), S.COPY_SEGMENT_STARTED, 5, 4)


def test_a_recreated_name_resolves_to_its_newest_incarnation_whatever_the_replay_order(tmp_path: Path) -> None:
    old_id, new_id = "f7________8AAAAAAAAD_w", "AAAAAAAAAAAAAAAAAAAAAA"  # the old id sorts last
    old = TopicRecord(topic="orders", topic_id=old_id, action=TopicAction.ENABLE, event_time=1_000)
    new = TopicRecord(topic="orders", topic_id=new_id, action=TopicAction.ENABLE, local_retention_ms=5,
                      event_time=2_000)  # fmt: skip
    paused = TopicRecord(topic="orders", topic_id=old_id, action=TopicAction.PAUSE_UPLOAD, event_time=3_000)
    digests = []
    for order in ([old, paused, new], [new, old, paused]):  # two WAL partitions, replayed in either order
        state = MetadataState()
        for record in order:
            assert state.apply(record).accepted
        assert state.topic("orders") == (new_id, state.tiering(new_id))
        assert state.tiering(new_id).local_retention_ms == 5 and state.tiering(old_id).upload_paused
        loaded = load_snapshot(write_snapshot(tmp_path / str(len(digests)), state, {})).state
        assert loaded.topic("orders")[0] == new_id  # a snapshot (topics sorted by id) keeps the answer
        digests.append(loaded.digest())
    assert digests[0] == digests[1]


copies_strategy = st.lists(
    st.tuples(st.integers(0, 60), st.integers(1, 25), st.integers(1, 3)), min_size=1, max_size=12
)  # (base offset, offsets in the copy, leader epoch)


@settings(max_examples=300, deadline=None)
@given(copies=copies_strategy, per_offset=st.integers(1, 50))
def test_remote_size_counts_every_offset_once_whatever_the_overlaps(
    copies: list[tuple[int, int, int]], per_offset: int
) -> None:
    state = MetadataState()
    for base, length, epoch in sorted(copies, key=lambda c: c[2]):  # the WAL's order: epochs only grow
        sid = uuid.uuid4()
        end = base + length - 1
        for s in (S.COPY_SEGMENT_STARTED, S.COPY_SEGMENT_FINISHED):
            assert state.apply(seg(sid, s, base, end, epoch=epoch, size=length * per_offset)).accepted
    p = state.partition(TOPIC_ID, 0)
    assert p is not None
    covered = {o for base, length, _ in copies for o in range(base, base + length)}
    assert p.remote_size() == per_offset * len(covered)  # bytes spread evenly: exactly once per offset
    assert p.stored_size() == per_offset * sum(length for _, length, _ in copies)
    counted = p.counted_sizes()
    owners = {o: p.segment_for_offset(o).segment_id for o in covered}  # the copy reads use
    for r, bytes_ in counted.items():
        row = p.segment(r)
        assert bytes_ == per_offset * sum(1 for o, owner in owners.items() if owner == row.segment_id)
    duplicates = p.duplicates()
    distinct = {(base, base + length - 1) for base, length, _ in copies}
    assert len(duplicates) == len(copies) - len(distinct)  # all but one of each set of equal offsets
    dropped = {d.segment_id for d in duplicates}
    kept = {
        (r.base_offset, r.end_offset): r
        for r in p.segments(frozenset({int(S.COPY_SEGMENT_FINISHED)}))
        if r.segment_id not in dropped
    }
    assert len(kept) == len(distinct)
    for dup in duplicates:  # one copy of the same offsets stays, of the same or a higher epoch
        assert kept[(dup.base_offset, dup.end_offset)].leader_epoch >= dup.leader_epoch


def test_the_duplicate_of_an_equal_copy_is_the_one_reads_do_not_use() -> None:
    state = MetadataState()
    first = finished(state, 0, 99, epoch=2)
    again = finished(state, 0, 99, epoch=2)  # the same segment finished twice (a late write and a retry)
    other = finished(state, 50, 149, epoch=3)  # a new leader's copy: other boundaries, legitimate
    p = state.partition(TOPIC_ID, 0)
    assert p is not None
    assert [d.segment_id for d in p.duplicates()] == [first.bytes]
    assert p.segment_for_offset(10).segment_id == again.bytes and p.segment_for_offset(60).segment_id == other.bytes
    assert p.remote_size() == 500 + 1000  # again: offsets 0..49 only (50..99 belong to other); first: none
    assert state.apply(seg(first, S.DELETE_SEGMENT_STARTED, 0, 99, epoch=3)).accepted
    assert p.duplicates() == [] and p.remote_size() == 1500 and p.stored_size() == 2000
