"""Sweeping a partition: finishing what crashed or deposed sidecars left behind, through the FSM.

Duplicate finished copies, COPY_SEGMENT_STARTED copies older than ``copy_started_timeout_seconds``,
unfinished deletions (DELETE_SEGMENT_STARTED), and orphan objects (no metadata names them) at or
below the remote end. Every step is idempotent, so a sweep interrupted anywhere is simply run again.
"""

from __future__ import annotations

from segment_fsm import SegmentState
from tiering.policy import PartitionOffsets
from tiering.sidecar.writer import PartitionWriter
from tiering_core.logs import get_logger
from tiering_core.objects import parse_key, partition_prefixes

log = get_logger(__name__)


def sweep(writer: PartitionWriter, offsets: PartitionOffsets) -> None:
    """Finish what crashed sidecars left: duplicate finished copies, stale STARTED copies, unfinished
    deletions, orphans.

    A duplicate is a second COPY_SEGMENT_FINISHED of exactly the same offsets (a crash can leave one:
    a FINISHED record that lands late, after the retry finished its own copy). The copy reads prefer
    stays, the other goes through DELETE_SEGMENT_*. Overlapping copies of other boundaries (a new
    leader's) are legitimate and stay; size accounting counts their offsets once.
    """
    ctx, (topic, topic_id, partition) = writer.ctx, writer.scope
    for dup in ctx.manager.duplicate_copies(topic_id, partition):
        log.warning("deleting a duplicate copy: another finished copy holds the same offsets", topic=topic,
                    partition=partition, base_offset=dup.base_offset, end_offset=dup.end_offset,
                    segment_id=dup.segment_id.hex(), leader_epoch=dup.leader_epoch)  # fmt: skip
        writer.delete_copy(dup)
    timeout_ms = ctx.settings.copy_started_timeout_seconds * 1000
    now = ctx.now_ms()
    every = ctx.manager.segments(topic_id, partition)
    known = {s.segment_id for s in every}
    for seg in every:
        stale = seg.state == SegmentState.COPY_SEGMENT_STARTED and now - seg.event_time > timeout_ms
        if stale or seg.state == SegmentState.DELETE_SEGMENT_STARTED:
            writer.delete_copy(seg)
    if offsets.ry is None:
        return
    orphans = []
    for prefix in partition_prefixes(ctx.prefix, topic, topic_id, partition):
        for key in ctx.store.list_keys(prefix + "/"):
            parsed = parse_key(key)
            if parsed is not None and parsed[1].bytes not in known and parsed[0] <= offsets.ry:
                orphans.append(key)
    if orphans:
        log.warning("deleting orphan objects", topic=topic, partition=partition, count=len(orphans))
        ctx.store.delete(orphans)
