"""Pure state machines of tiered storage, with Apache Kafka KIP-405's state names. No I/O.

- Segment copies: COPY_SEGMENT_STARTED -> COPY_SEGMENT_FINISHED -> DELETE_SEGMENT_STARTED ->
  DELETE_SEGMENT_FINISHED (a failed copy goes from STARTED straight to DELETE_SEGMENT_STARTED).
- Partition deletion: DELETE_PARTITION_MARKED -> DELETE_PARTITION_STARTED -> DELETE_PARTITION_FINISHED.
- Per-topic tiering: enabled, upload paused, download paused, rolled back.
- Log start offsets: the local one our local retention asks for, and the log start offset a user's
  delete_records (or the broker's retention) moved above it, below which copies are deleted.
- Fencing: a transition from an older leader epoch (or older lease token) than the partition has
  seen is rejected, so every replica that applies the same records reaches the same state.
"""

from segment_fsm.fencing import Fence, fence_rejection
from segment_fsm.log_start import LogStartKind, LogStarts, apply_log_start, log_start_rejection
from segment_fsm.states import (
    PartitionDeleteState,
    SegmentState,
    partition_delete_rejection,
    segment_rejection,
)
from segment_fsm.topic import TopicAction, TopicTiering, apply_topic_action

__all__ = [
    "Fence",
    "LogStartKind",
    "LogStarts",
    "PartitionDeleteState",
    "SegmentState",
    "TopicAction",
    "TopicTiering",
    "apply_log_start",
    "apply_topic_action",
    "fence_rejection",
    "log_start_rejection",
    "partition_delete_rejection",
    "segment_rejection",
]
