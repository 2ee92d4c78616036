"""Pure state machines of tiered storage, with Apache Kafka KIP-405's state names. No I/O.

- Segment copies: COPY_SEGMENT_STARTED -> COPY_SEGMENT_FINISHED -> DELETE_SEGMENT_STARTED ->
  DELETE_SEGMENT_FINISHED (a failed copy goes from STARTED straight to DELETE_SEGMENT_STARTED).
- Partition deletion: DELETE_PARTITION_MARKED -> DELETE_PARTITION_STARTED -> DELETE_PARTITION_FINISHED.
- Per-topic tiering: enabled, upload paused, download paused, rolled back.
- Fencing: a transition from an older leader epoch (or older lease token) than the partition has
  seen is rejected, so every replica that applies the same records reaches the same state.
"""

from segment_fsm.fencing import Fence, fence_rejection
from segment_fsm.states import (
    PartitionDeleteState,
    SegmentState,
    partition_delete_rejection,
    segment_rejection,
)
from segment_fsm.topic import TopicAction, TopicTiering, apply_topic_action

__all__ = [
    "Fence",
    "PartitionDeleteState",
    "SegmentState",
    "TopicAction",
    "TopicTiering",
    "apply_topic_action",
    "fence_rejection",
    "partition_delete_rejection",
    "segment_rejection",
]
