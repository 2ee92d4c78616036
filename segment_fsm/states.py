"""Segment and partition-deletion states, and the one table of legal transitions for each.

The ids are stable (they are written to the WAL) and equal Kafka's RemoteLogSegmentState and
RemotePartitionDeleteState ids. Every state may move to itself: a retried or replayed transition is
idempotent.
"""

from __future__ import annotations

from enum import IntEnum


class SegmentState(IntEnum):
    COPY_SEGMENT_STARTED = 0
    COPY_SEGMENT_FINISHED = 1
    DELETE_SEGMENT_STARTED = 2
    DELETE_SEGMENT_FINISHED = 3


class PartitionDeleteState(IntEnum):
    DELETE_PARTITION_MARKED = 0
    DELETE_PARTITION_STARTED = 1
    DELETE_PARTITION_FINISHED = 2


_S = SegmentState
SEGMENT_TRANSITIONS: dict[SegmentState | None, frozenset[SegmentState]] = {
    None: frozenset({_S.COPY_SEGMENT_STARTED}),
    _S.COPY_SEGMENT_STARTED: frozenset({_S.COPY_SEGMENT_STARTED, _S.COPY_SEGMENT_FINISHED, _S.DELETE_SEGMENT_STARTED}),
    _S.COPY_SEGMENT_FINISHED: frozenset({_S.COPY_SEGMENT_FINISHED, _S.DELETE_SEGMENT_STARTED}),
    _S.DELETE_SEGMENT_STARTED: frozenset({_S.DELETE_SEGMENT_STARTED, _S.DELETE_SEGMENT_FINISHED}),
    _S.DELETE_SEGMENT_FINISHED: frozenset({_S.DELETE_SEGMENT_FINISHED}),
}

_P = PartitionDeleteState
PARTITION_DELETE_TRANSITIONS: dict[PartitionDeleteState | None, frozenset[PartitionDeleteState]] = {
    None: frozenset({_P.DELETE_PARTITION_MARKED}),
    _P.DELETE_PARTITION_MARKED: frozenset({_P.DELETE_PARTITION_MARKED, _P.DELETE_PARTITION_STARTED}),
    _P.DELETE_PARTITION_STARTED: frozenset({_P.DELETE_PARTITION_STARTED, _P.DELETE_PARTITION_FINISHED}),
    _P.DELETE_PARTITION_FINISHED: frozenset({_P.DELETE_PARTITION_FINISHED}),
}


def _name(state: IntEnum | None) -> str:
    return "(none)" if state is None else state.name


def segment_rejection(current: SegmentState | None, new: SegmentState) -> str | None:
    """None when ``current -> new`` is legal for a segment copy, else the reason it is not."""
    if new in SEGMENT_TRANSITIONS[current]:
        return None
    return f"illegal segment transition {_name(current)} -> {new.name}"


def partition_delete_rejection(current: PartitionDeleteState | None, new: PartitionDeleteState) -> str | None:
    """None when ``current -> new`` is legal for a partition deletion, else the reason it is not."""
    if new in PARTITION_DELETE_TRANSITIONS[current]:
        return None
    return f"illegal partition-deletion transition {_name(current)} -> {new.name}"
