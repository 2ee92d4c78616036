"""What the sidecar learns about a partition before it acts on it: the runner's view of it (Kafka's
answers and the tiering state), the broker's local segments, and the offsets local and remote."""

from __future__ import annotations

import os
import time
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


# A directory changed less than this before its mtime was read may change again within the same mtime (the kernel
# stamps with a coarse clock): such an mtime proves nothing (as git treats a "racily clean" index entry).
_RACY_NS = 2_000_000_000


def settled_mtime_ns(directory: Path) -> int | None:
    """The directory's mtime (a segment created, renamed or deleted, a checkpoint replaced: Kafka replaces files by
    renaming), or None when it changed too recently to be trusted, or cannot be read."""
    try:
        mtime = os.stat(directory).st_mtime_ns
    except OSError:
        return None
    return mtime if time.time_ns() - mtime > _RACY_NS else None


@dataclass(frozen=True)
class StepInputs:
    """Everything a partition's step decides on apart from the clock and its own failures: equal inputs after a
    step that left nothing to do mean the next step would do nothing too (until a time-based rule fires)."""

    partition_dir: Path
    dir_mtime_ns: int
    offsets: LocalOffsets
    configs: dict[str, str]
    tiering: TopicTiering
    uploads_allowed: bool
    tiered: bool
    remote_changed: int


def step_inputs(facts: PartitionFacts, manager: MetadataManager, scope: Scope) -> StepInputs | None:
    """The partition's inputs now (read before the step reads anything, so a change during it shows next time), or
    None when they cannot be pinned down (its directory changed a moment ago)."""
    mtime = settled_mtime_ns(facts.partition_dir)
    if mtime is None:
        return None
    return StepInputs(
        facts.partition_dir,
        mtime,
        facts.offsets,
        facts.topic.configs,
        facts.tiering,
        facts.uploads_allowed,
        facts.tiered,
        manager.partition_changed(scope.topic_id, scope.partition),
    )


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
