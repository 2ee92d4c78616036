"""Which partitions this sidecar acts on, and whether it may act on one now.

Every tick ``led_partitions`` asks Kafka which tiered partitions this broker leads; a partition is acted
on while its topic is tiered, and after a rollback while remote copies of it are left (total retention
still expires them). Before writing anything, ``fence`` checks that this broker leads the partition by
its own leader-epoch cache (not only Kafka's answer) and holds its etcd lease when leases are
configured; the result is the partition's ``PartitionWriter``, whose records carry that leader epoch
and the lease's fencing token.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from metadata.records import topic_id_str
from segment_fsm import SegmentState, TopicTiering
from tiering.policy.tierable import refusal
from tiering.sidecar.context import SidecarContext
from tiering.sidecar.facts import PartitionFacts
from tiering.sidecar.retry import Scope
from tiering.sidecar.writer import PartitionWriter
from tiering_core.errors import TieringError
from tiering_core.formats import find_partition_dirs, parse_leader_epoch_checkpoint
from tiering_core.formats.indexes import read_file
from tiering_core.kafka_cluster import LocalOffsets, TopicInfo

LEADER_EPOCH_CHECKPOINT = "leader-epoch-checkpoint"


class LeadershipMoved(TieringError):
    """The leader epoch Kafka answered with is not this broker's: the partition is led elsewhere now."""


@dataclass(frozen=True)
class LedPartition:
    """A partition this sidecar acts on this tick: this broker leads it and holds its directory."""

    topic: TopicInfo
    partition: int
    partition_dir: Path
    tiering: TopicTiering
    uploads_allowed: bool
    tiered: bool

    @property
    def key(self) -> tuple[str, int]:
        """(topic id, partition): a topic created again under the same name is another topic."""
        return self.topic.topic_id, self.partition

    def facts(self, offsets: LocalOffsets) -> PartitionFacts:
        return PartitionFacts(self.topic, self.partition, self.partition_dir, offsets, self.tiering,
                              self.uploads_allowed, self.tiered)  # fmt: skip


@dataclass(frozen=True)
class Led:
    """The runner's view of one tick: the partitions to act on, and the tiered topics that are never acted
    on (id -> (name, why), see ``tiering.policy.tierable``): internal, Streams' or compacted now."""

    partitions: list[LedPartition]
    refused: dict[str, tuple[str, str]]


def led_partitions(ctx: SidecarContext) -> Led:
    """The partitions this broker leads whose topic is tiered (or rolled back with remote copies left), as
    Kafka answers now. Raises KafkaClusterError when Kafka does not answer: then nothing is known."""
    with ctx.manager.lock:
        topics = {topic_id_str(tid): entry for tid, entry in ctx.manager.state.topics.items()}
        paused, rolled_back = ctx.manager.state.cluster.upload_paused, ctx.manager.state.cluster.rolled_back
    infos = ctx.cluster.topics({name for name, _ in topics.values()}, missing_ok=True)
    dirs = find_partition_dirs(ctx.settings.log_dirs)
    led = Led([], {})
    for topic_id, (name, tiering) in topics.items():
        info = infos.get(name)
        if info is None or info.topic_id != topic_id:
            continue  # deleted (the janitor's), or created again: another topic id
        reason = refusal(info, ctx.settings.metadata_topic)
        if reason is not None:
            led.refused[topic_id] = (name, reason)
            continue
        tiered = tiering.enabled and not tiering.rolled_back and not rolled_back
        uploads_allowed = tiering.uploads_allowed and not paused and not rolled_back
        for p in info.partitions:
            directory = dirs.get((name, p.partition))
            if p.leader != ctx.broker_id or directory is None:
                continue
            if tiered or _has_copies(ctx, topic_id, p.partition):
                led.partitions.append(LedPartition(info, p.partition, directory, tiering, uploads_allowed, tiered))
    return led


def _has_copies(ctx: SidecarContext, topic_id: str, partition: int) -> bool:
    """Whether remote copies of the partition are left (in any state but DELETE_SEGMENT_FINISHED)."""
    return any(s.state != SegmentState.DELETE_SEGMENT_FINISHED for s in ctx.manager.segments(topic_id, partition))


def fence(ctx: SidecarContext, scope: Scope, facts: PartitionFacts) -> PartitionWriter:
    """The partition's writer for this tick: this broker's own leader epoch and the lease's fencing token.

    Raises LeadershipMoved when another broker leads the partition, TieringError when another sidecar
    holds its lease; then nothing may be written this tick.
    """
    epoch = own_leader_epoch(scope, facts)
    token = 0
    if ctx.leases is not None:
        held = ctx.leases.acquire(scope.topic_id, scope.partition)
        if held is None:
            raise TieringError(f"{scope.topic}-{scope.partition}: another sidecar holds the partition lease")
        token = held
    return PartitionWriter(ctx, scope, epoch, token)


def own_leader_epoch(scope: Scope, facts: PartitionFacts) -> int:
    """The leader epoch to write records with, proven to be this broker's own.

    ListOffsets goes to whichever broker librdkafka believes leads the partition; after a leader
    change that is the new leader, whose epoch a deposed leader's sidecar must never write with (its
    late records would pass the fence). The answer's epoch (Kafka puts the partition's current leader
    epoch in a LATEST answer) counts only if this broker's own leader-epoch cache ends with it: a
    leader appends its epoch there when it becomes leader, a deposed one only once it replicated
    records of the new epoch. Raises LeadershipMoved otherwise.
    """
    answered = facts.offsets.leader_epoch
    path = facts.partition_dir / LEADER_EPOCH_CHECKPOINT
    entries = parse_leader_epoch_checkpoint(read_file(path).decode(), str(path))
    own = entries[-1].epoch if entries else None
    if own != answered:
        raise LeadershipMoved(
            f"{scope.topic}-{scope.partition}: Kafka answered with leader epoch {answered}, but this broker's "
            f"{path} ends at epoch {own}: another broker leads the partition (or leadership is moving); "
            "nothing is written with that epoch"
        )
    return answered


def check_still_leading(writer: PartitionWriter) -> None:
    """Raise LeadershipMoved unless the partition's leader epoch is still the writer's (asked between
    segments of a long backlog: a broker that lost the leadership meanwhile must stop uploading)."""
    now = writer.ctx.cluster.leader_epoch(writer.scope.topic, writer.scope.partition)
    if now != writer.epoch:
        raise LeadershipMoved(f"{writer.name}: the leader epoch moved from {writer.epoch} to {now} "
                              "during the uploads; the rest waits for the next tick")  # fmt: skip
