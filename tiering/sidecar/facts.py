"""What the sidecar learns about a partition before it acts on it: the runner's view of it (Kafka's
answers and the tiering state), the broker's local segments, and the offsets local and remote."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from metadata import MetadataManager
from segment_fsm import TopicTiering
from tiering.policy import LocalSegmentInfo, PartitionOffsets
from tiering.sidecar.retry import Scope
from tiering_core.formats import SegmentFiles, list_segments
from tiering_core.kafka_cluster import LocalOffsets, TopicInfo

Local = list[tuple[LocalSegmentInfo, SegmentFiles]]  # the partition's segments, oldest first, the last active


@dataclass
class PartitionFacts:
    """What the runner learned about a partition this tick."""

    topic: TopicInfo
    partition: int
    partition_dir: Path
    offsets: LocalOffsets
    tiering: TopicTiering
    uploads_allowed: bool  # tiered, and neither the topic's nor the cluster's uploads paused
    tiered: bool  # enabled, and neither the topic nor the cluster rolled back: local retention applies


def local_segments(partition_dir: Path) -> Local:
    """The segments in the broker's partition directory now, with their sizes and largest timestamps."""
    out = []
    for files in list_segments(partition_dir):
        try:
            size = files.log.stat().st_size
            max_ts = files.largest_timestamp()
        except FileNotFoundError:
            continue  # renamed to .deleted by Kafka's retention between listing and stat
        out.append((LocalSegmentInfo(files.base_offset, size, max_ts), files))
    return out


def partition_offsets(manager: MetadataManager, scope: Scope, local: LocalOffsets) -> PartitionOffsets:
    """Kafka's Lx, Ly, Lz with the remote start and end (Rx, Ry) the metadata holds now."""
    summary = manager.partition_state(scope.topic_id, scope.partition)
    if summary is None:
        return PartitionOffsets(local.lx, local.ly, local.lz)
    return PartitionOffsets(local.lx, local.ly, local.lz, summary.remote_start_offset, summary.remote_end_offset)
