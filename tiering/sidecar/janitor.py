"""Deleted topics: their partitions go through DELETE_PARTITION_MARKED / STARTED / FINISHED and every
object of theirs is deleted. One sidecar does it (the one on the lowest live broker id), since a
deleted partition has no leader."""

from __future__ import annotations

from metadata import PartitionDeleteRecord
from metadata.records import topic_id_str
from segment_fsm import PartitionDeleteState, SegmentState
from tiering.sidecar.context import SidecarContext
from tiering.sidecar.partition_task import PartitionTask
from tiering_core.logs import get_logger
from tiering_core.objects import partition_prefix

log = get_logger(__name__)


def delete_partitions_of_deleted_topics(ctx: SidecarContext, live_topic_ids: set[str]) -> int:
    """Delete the remote data of partitions whose topic no longer exists; returns how many finished."""
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
        epoch, token = fence

        def record(state: PartitionDeleteState, topic_id: str = topic_id, num: int = num, topic: str = topic,
                   epoch: int = epoch, token: int = token) -> PartitionDeleteRecord:  # fmt: skip
            return PartitionDeleteRecord(topic=topic, topic_id=topic_id, partition=num, state=state,
                                         broker_id=ctx.broker_id, leader_epoch=epoch, fencing_token=token,
                                         event_time=ctx.now_ms())  # fmt: skip

        for state in (PartitionDeleteState.DELETE_PARTITION_MARKED, PartitionDeleteState.DELETE_PARTITION_STARTED):
            if current is None or current < state:
                ctx.manager.publish(record(state))
        task = PartitionTask(ctx, topic, topic_id, num)
        segments = [s for s in ctx.manager.segments(topic_id, num) if s.state != SegmentState.DELETE_SEGMENT_FINISHED]
        if not all(task.delete_copy(s, epoch, token) for s in segments):
            continue
        leftovers = ctx.store.list_keys(partition_prefix(ctx.prefix, topic, topic_id, num) + "/")
        ctx.store.delete(leftovers)
        if ctx.manager.publish(record(PartitionDeleteState.DELETE_PARTITION_FINISHED)).accepted:
            finished += 1
            log.info("deleted the remote data of a deleted topic's partition", topic=topic, partition=num,
                     segments=len(segments), leftover_objects=len(leftovers))  # fmt: skip
    return finished
