"""Sweeping: finishing what crashed or deposed sidecars left behind.

A partition's sweep (its leader's): duplicate finished copies, COPY_SEGMENT_STARTED copies older than
``copy_started_timeout_seconds``, unfinished deletions (DELETE_SEGMENT_STARTED), all through the FSM,
and orphan objects (no metadata names them) at or below the remote end. The cluster's sweep of
incomplete uploads (one sidecar's, the janitor's): multipart uploads under the prefix that a killed
process left, which no object listing shows and S3 keeps (and bills) until they are aborted. Every
step is idempotent, so a sweep interrupted anywhere is simply run again.
"""

from __future__ import annotations

from metadata import RemoteSegment
from segment_fsm import SegmentState
from tiering.policy import PartitionOffsets
from tiering.sidecar.context import SidecarContext
from tiering.sidecar.writer import PartitionWriter
from tiering_core.crash_points import crash_point
from tiering_core.logs import get_logger
from tiering_core.objects import parse_key, partition_prefixes

log = get_logger(__name__)


def sweep(writer: PartitionWriter, offsets: PartitionOffsets, *, list_orphans: bool) -> None:
    """Finish what crashed sidecars left: duplicate finished copies, stale STARTED copies, unfinished
    deletions, and with ``list_orphans`` orphans (the only part that asks the store anything: a LIST of the
    partition's prefix, which the caller does not do every tick).

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
    now = ctx.now_ms()
    every = ctx.manager.segments(topic_id, partition)
    known = {s.segment_id for s in every}
    for seg in every:
        stale = seg.state == SegmentState.COPY_SEGMENT_STARTED and now >= _stale_at(ctx, seg)
        if stale or seg.state == SegmentState.DELETE_SEGMENT_STARTED:
            writer.delete_copy(seg)
    if offsets.ry is None or not list_orphans:
        return
    orphans = []
    for prefix in partition_prefixes(topic, topic_id, partition):
        for key in ctx.store.list_keys(prefix + "/"):
            parsed = parse_key(key)
            if parsed is not None and parsed[1].bytes not in known and parsed[0] <= offsets.ry:
                orphans.append(key)
    if orphans:
        log.warning("deleting orphan objects", topic=topic, partition=partition, count=len(orphans))
        crash_point("sweep.orphans")
        ctx.store.delete(orphans)


def next_stale_ms(writer: PartitionWriter, now_ms: int) -> int | None:
    """When the sweep next finds a COPY_SEGMENT_STARTED copy stale (``copy_started_timeout_seconds`` after its
    record), or None when the partition has none that is not stale already."""
    ctx, (_, topic_id, partition) = writer.ctx, writer.scope
    started = ctx.manager.segments(topic_id, partition, [SegmentState.COPY_SEGMENT_STARTED])
    return min((t for s in started if (t := _stale_at(ctx, s)) > now_ms), default=None)


def _stale_at(ctx: SidecarContext, seg: RemoteSegment) -> int:
    """The first millisecond at which a COPY_SEGMENT_STARTED copy is stale: more than ``copy_started_timeout_seconds``
    after its record."""
    return int(seg.event_time + ctx.settings.copy_started_timeout_seconds * 1000) + 1


def abort_stale_uploads(ctx: SidecarContext) -> None:
    """Abort every incomplete upload under the cluster's prefix (segment copies of every partition, metadata
    snapshots) begun more than ``remote_log_manager_incomplete_upload_abort_ms`` ago.

    The setting is longer than any upload takes, so an upload that old belongs to no live copy (its copy is
    swept as a stale COPY_SEGMENT_STARTED, or was abandoned): aborting it only frees its parts. Run by one
    sidecar, when no copy of its own is in flight. Idempotent: an upload completed or aborted meanwhile is
    fine. The ages compare the store's clock with ours: keep them in sync (NTP), as for every timeout here.
    """
    max_age_ms = ctx.settings.remote_log_manager_incomplete_upload_abort_ms
    now = ctx.now_ms()
    stale = [u for u in ctx.store.incomplete_uploads("") if now - u.initiated_ms > max_age_ms]
    for upload in stale:
        crash_point("sweep.upload_abort")
        ctx.store.abort_upload(upload)
        ctx.metrics.uploads_aborted.inc()
    if stale:
        log.warning(
            "aborted incomplete uploads a crash left", count=len(stale), keys=[u.key for u in stale[:20]],
            oldest_age_s=round((now - min(u.initiated_ms for u in stale)) / 1000), max_age_ms=max_age_ms,
        )  # fmt: skip
