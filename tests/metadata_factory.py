"""Builders of metadata records for tests."""

from __future__ import annotations

import uuid

from metadata import LogStartRecord, SegmentRecord
from segment_fsm import LogStartKind, SegmentState

TOPIC_ID = "mXjDWYvGQ3SdP7gQi3DrqA"


def seg(
    sid: uuid.UUID, state: SegmentState, base: int = 0, end: int = 99, *, partition: int = 0, epoch: int = 1,
    token: int = 0, broker: int = 1, topic_id: str = TOPIC_ID, size: int = 1000, t: int = 0,
) -> SegmentRecord:  # fmt: skip
    return SegmentRecord(
        topic="orders", topic_id=topic_id, partition=partition, segment_id=sid, state=state, broker_id=broker,
        leader_epoch=epoch, fencing_token=token, event_time=t, base_offset=base, end_offset=end,
        first_timestamp=1_000 + base, max_timestamp=1_000 + end, size=size, leader_epochs=((epoch, base),),
    )  # fmt: skip


def log_start(
    kind: LogStartKind, offset: int, *, partition: int = 0, epoch: int = 1, token: int = 0, broker: int = 1
) -> LogStartRecord:
    return LogStartRecord(
        topic="orders", topic_id=TOPIC_ID, partition=partition, broker_id=broker, leader_epoch=epoch,
        fencing_token=token, event_time=0, kind=kind, offset=offset,
    )  # fmt: skip
