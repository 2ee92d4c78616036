"""Deleted topics: their partitions go through DELETE_PARTITION_MARKED / STARTED / FINISHED and every
object of theirs is deleted. One sidecar does it (the one on the lowest live broker id), since a
deleted partition has no leader."""

from __future__ import annotations

from functools import partial

from metadata import PartitionDeleteRecord
from metadata.records import topic_id_str
from segment_fsm import PartitionDeleteState, SegmentState
from tiering.sidecar.context import SidecarContext
from tiering.sidecar.partition_task import PartitionTask
from tiering.sidecar.retry import Scope
from tiering_core.logs import get_logger
from tiering_core.objects import partition_prefixes

log = get_logger(__name__)


def delete_partitions_of_deleted_topics(ctx: SidecarContext, live_topic_ids: set[str]) -> int:
    """Delete the remote data of partitions whose topic no longer exists; returns how many finished.

    Each partition on its own: one that fails is recorded and retried after its backoff, the others go on."""
    with ctx.manager.lock:
        gone = [
            (topic_id_str(tid), num, p.topic, p.fence, p.delete_state)
            for (tid, num), p in ctx.manager.state.partitions.items()
            if topic_id_str(tid) not in live_topic_ids
            and p.delete_state != PartitionDeleteState.DELETE_PARTITION_FINISHED
        ]
    finished = 0
    for topic_id, num, topic, fence, current in gone:
        if ctx.stopping.is_set():
            break
        scope = Scope(topic, topic_id, num)
        done = ctx.retry.run(scope, "delete_partition", partial(_delete_partition, ctx, scope, fence, current))
        finished += bool(done)
    return finished


def _delete_partition(ctx: SidecarContext, scope: Scope, fence: tuple[int, int],
                      current: PartitionDeleteState | None) -> bool:  # fmt: skip
    """One deleted partition: MARKED, STARTED, every copy deleted, leftovers deleted, FINISHED. Raises on
    failure (the caller retries with backoff); True when DELETE_PARTITION_FINISHED was written."""
    topic, topic_id, num = scope
    epoch, token = fence

    def record(state: PartitionDeleteState) -> PartitionDeleteRecord:
        return PartitionDeleteRecord(topic=topic, topic_id=topic_id, partition=num, state=state,
                                     broker_id=ctx.broker_id, leader_epoch=epoch, fencing_token=token,
                                     event_time=ctx.now_ms())  # fmt: skip

    for state in (PartitionDeleteState.DELETE_PARTITION_MARKED, PartitionDeleteState.DELETE_PARTITION_STARTED):
        if current is None or current < state:
            ctx.manager.publish(record(state))
    task = PartitionTask(ctx, topic, topic_id, num)
    segments = [s for s in ctx.manager.segments(topic_id, num) if s.state != SegmentState.DELETE_SEGMENT_FINISHED]
    if not all(task.delete_copy(s, epoch, token) for s in segments):
        return False
    leftovers = [k for p in partition_prefixes(ctx.prefix, topic, topic_id, num) for k in ctx.store.list_keys(p + "/")]
    ctx.store.delete(leftovers)
    if not ctx.manager.publish(record(PartitionDeleteState.DELETE_PARTITION_FINISHED)).accepted:
        return False
    log.info("deleted the remote data of a deleted topic's partition", topic=topic, partition=num,
             segments=len(segments), leftover_objects=len(leftovers))  # fmt: skip
    return True
