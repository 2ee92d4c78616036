"""The KIP-405 state machines: the transition table, fencing, and replica determinism."""

from __future__ import annotations

import random
import uuid

from hypothesis import given, settings
from hypothesis import strategies as st

from metadata import MetadataState, PartitionDeleteRecord
from segment_fsm import (
    PartitionDeleteState,
    SegmentState,
    TopicAction,
    apply_topic_action,
    partition_delete_rejection,
    segment_rejection,
)
from tests.metadata_factory import TOPIC_ID, seg

S = SegmentState
LEGAL = {
    (None, S.COPY_SEGMENT_STARTED),
    (S.COPY_SEGMENT_STARTED, S.COPY_SEGMENT_FINISHED),
    (S.COPY_SEGMENT_STARTED, S.DELETE_SEGMENT_STARTED),
    (S.COPY_SEGMENT_FINISHED, S.DELETE_SEGMENT_STARTED),
    (S.DELETE_SEGMENT_STARTED, S.DELETE_SEGMENT_FINISHED),
} | {(s, s) for s in S}


def test_segment_transition_table_is_exactly_kip_405() -> None:
    for current in [None, *S]:
        for new in S:
            reason = segment_rejection(current, new)
            assert (reason is None) == ((current, new) in LEGAL), (current, new)
    assert segment_rejection(S.COPY_SEGMENT_FINISHED, S.COPY_SEGMENT_STARTED) == (
        "illegal segment transition COPY_SEGMENT_FINISHED -> COPY_SEGMENT_STARTED"
    )


def test_partition_deletion_table() -> None:
    P = PartitionDeleteState
    assert partition_delete_rejection(None, P.DELETE_PARTITION_MARKED) is None
    assert partition_delete_rejection(P.DELETE_PARTITION_MARKED, P.DELETE_PARTITION_STARTED) is None
    assert partition_delete_rejection(P.DELETE_PARTITION_STARTED, P.DELETE_PARTITION_FINISHED) is None
    assert partition_delete_rejection(P.DELETE_PARTITION_FINISHED, P.DELETE_PARTITION_FINISHED) is None
    assert partition_delete_rejection(None, P.DELETE_PARTITION_STARTED) is not None
    assert partition_delete_rejection(P.DELETE_PARTITION_FINISHED, P.DELETE_PARTITION_MARKED) is not None


def test_topic_actions() -> None:
    state, reason = apply_topic_action(None, TopicAction.PAUSE_UPLOAD)
    assert state is None and reason is not None and "not enabled" in reason
    state, reason = apply_topic_action(None, TopicAction.ENABLE, 60_000, -2)
    assert reason is None and state is not None and state.uploads_allowed
    paused, _ = apply_topic_action(state, TopicAction.PAUSE_UPLOAD)
    assert paused is not None and not paused.uploads_allowed and paused.enabled
    same, reason = apply_topic_action(state, TopicAction.ENABLE, 60_000, -2)
    assert same == state and reason is None
    _, reason = apply_topic_action(state, TopicAction.ENABLE, 1, -2)
    assert reason is not None
    rolled, _ = apply_topic_action(paused, TopicAction.ROLLBACK)
    assert rolled is not None and rolled.rolled_back and not rolled.enabled
    again, _ = apply_topic_action(rolled, TopicAction.ENABLE, 5, 5)
    assert again is not None and again.enabled and not again.rolled_back


def test_older_leader_epoch_is_fenced() -> None:
    state = MetadataState()
    a, b = uuid.uuid4(), uuid.uuid4()
    assert state.apply(seg(a, S.COPY_SEGMENT_STARTED, epoch=5)).accepted
    late = state.apply(seg(b, S.COPY_SEGMENT_STARTED, epoch=4, broker=2))
    assert not late.accepted and "leader epoch 4 < 5" in (late.reason or "")
    assert state.apply(seg(a, S.COPY_SEGMENT_FINISHED, epoch=5, token=7)).accepted
    stale_token = state.apply(seg(b, S.COPY_SEGMENT_STARTED, epoch=6, token=6, broker=2))
    assert not stale_token.accepted and "lease token 6 < 7" in (stale_token.reason or "")
    p = state.partition(TOPIC_ID, 0)
    assert p is not None and p.fence == (5, 7) and len(p) == 1  # rejected records change nothing


@st.composite
def histories(draw: st.DrawFn) -> list[list]:
    """Per-partition record sequences: segment copies taking random (possibly illegal) walks and
    partition deletions, written under random leader epochs and lease tokens."""
    per_partition = []
    for partition in range(draw(st.integers(1, 4))):
        records = []
        for i in range(draw(st.integers(1, 6))):
            sid = uuid.UUID(int=draw(st.integers(0, 2**64)) * 16 + partition)
            for state in draw(st.lists(st.sampled_from([*S, *PartitionDeleteState]), min_size=1, max_size=5)):
                epoch, token = draw(st.integers(0, 3)), draw(st.integers(0, 2))
                if isinstance(state, PartitionDeleteState):
                    records.append(
                        PartitionDeleteRecord(topic="orders", topic_id=TOPIC_ID, partition=partition, state=state,
                                              broker_id=1, leader_epoch=epoch, fencing_token=token, event_time=0)
                    )  # fmt: skip
                    continue
                base = i * 100
                records.append(seg(sid, state, base, base + 99, partition=partition, epoch=epoch, token=token))
        per_partition.append(records)
    return per_partition


def _interleave(per_partition: list[list], rng: random.Random) -> list:
    queues = [list(q) for q in per_partition]
    out = []
    while any(queues):
        q = rng.choice([q for q in queues if q])
        out.append(q.pop(0))
    return out


@settings(max_examples=150, deadline=None)
@given(histories(), st.integers(0, 2**32))
def test_replicas_agree_under_any_interleaving(per_partition: list[list], seed: int) -> None:
    rng = random.Random(seed)
    first, second = MetadataState(), MetadataState()
    results_1 = [first.apply(r).accepted for r in _interleave(per_partition, rng)]
    results_2 = [second.apply(r).accepted for r in _interleave(per_partition, rng)]
    assert first.digest() == second.digest()
    assert sum(results_1) == sum(results_2)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(list(S)), min_size=1, max_size=8))
def test_illegal_transitions_never_change_the_state(states: list[SegmentState]) -> None:
    state = MetadataState()
    sid = uuid.uuid4()
    current = None
    for new in states:
        accepted = state.apply(seg(sid, new)).accepted
        assert accepted == ((current, new) in LEGAL)
        if accepted:
            current = new
        p = state.partition(seg(sid, new).topic_id, 0)
        assert (p.state_of(sid.bytes, 0) if p else None) == (None if current is None else int(current))
