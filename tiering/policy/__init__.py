"""Pure policy: which segment to copy next, what local and remote retention may delete.

No I/O here: the sidecar's loops gather the facts (local segments, Kafka offsets, remote metadata)
and ask these functions what to do, so every rule is unit-testable on its own.
"""

from tiering.policy.copy import CopyDecision, LocalSegmentInfo, copy_lag, next_segment_to_copy
from tiering.policy.log_start import log_start_to_record
from tiering.policy.offsets import OffsetViolation, PartitionOffsets
from tiering.policy.retention import (
    RemoteSegmentInfo,
    RetentionSettings,
    local_retention_target,
    next_time_rule_ms,
    remote_segments_to_expire,
)

__all__ = [
    "CopyDecision",
    "LocalSegmentInfo",
    "OffsetViolation",
    "PartitionOffsets",
    "RemoteSegmentInfo",
    "RetentionSettings",
    "copy_lag",
    "local_retention_target",
    "log_start_to_record",
    "next_segment_to_copy",
    "next_time_rule_ms",
    "remote_segments_to_expire",
]
