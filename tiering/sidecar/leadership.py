"""Whether this broker may act on a partition now: it leads it (by its own leader-epoch cache, not only
Kafka's answer) and holds its etcd lease when leases are configured. The result is the partition's
``PartitionWriter``, whose records carry that leader epoch and the lease's fencing token."""

from __future__ import annotations

from tiering.sidecar.context import SidecarContext
from tiering.sidecar.facts import PartitionFacts
from tiering.sidecar.retry import Scope
from tiering.sidecar.writer import PartitionWriter
from tiering_core.errors import TieringError
from tiering_core.formats import parse_leader_epoch_checkpoint
from tiering_core.formats.indexes import read_file

LEADER_EPOCH_CHECKPOINT = "leader-epoch-checkpoint"


class LeadershipMoved(TieringError):
    """The leader epoch Kafka answered with is not this broker's: the partition is led elsewhere now."""


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
