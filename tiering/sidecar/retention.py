"""Applying a partition's retention: local retention (``local.retention.*``) releases local data that is
already remote through ``delete_records``; total retention (``retention.*``) and the log start offset
delete remote copies through DELETE_SEGMENT_*. What to release or delete is decided in
``tiering.policy``; this module gathers the facts, checks them against the store and acts."""

from __future__ import annotations

import uuid

from metadata import RemoteSegment
from segment_fsm import LogStartKind, SegmentState
from tiering.policy import (
    PartitionOffsets,
    RemoteSegmentInfo,
    RetentionSettings,
    local_retention_target,
    log_start_to_record,
    remote_segments_to_expire,
)
from tiering.sidecar.facts import Local, PartitionFacts
from tiering.sidecar.writer import PartitionWriter
from tiering_core.crash_points import crash_point
from tiering_core.errors import ConfigError, TieringError
from tiering_core.logs import get_logger

log = get_logger(__name__)


def retention_settings(facts: PartitionFacts) -> RetentionSettings:
    """The topic's total retention (Kafka's topic configs) and local retention (the tiering state).
    Raises ConfigError when they contradict each other: then no retention is applied at all."""
    try:
        return RetentionSettings(
            retention_ms=facts.topic.config_int("retention.ms", 7 * 24 * 3600 * 1000),
            retention_bytes=facts.topic.config_int("retention.bytes", -1),
            local_retention_ms=facts.tiering.local_retention_ms,
            local_retention_bytes=facts.tiering.local_retention_bytes,
        )
    except ConfigError as exc:
        raise ConfigError(f"{facts.topic.name}: inconsistent retention settings, no retention applied: {exc}") from exc


def record_log_start(writer: PartitionWriter, offsets: PartitionOffsets) -> None:
    """Record a baseline, or a log start offset moved above every local retention request (a user's
    delete_records or the broker's retention), below which remote retention then deletes copies."""
    starts = writer.log_starts()
    action = log_start_to_record(offsets.lx, offsets.ry, starts)
    if action is None:
        return
    kind, offset = action
    if writer.publish_log_start(kind, offset) and kind is LogStartKind.LOG_START:
        log.warning(
            "the log start offset moved above every local retention request: remote copies below it go",
            topic=writer.scope.topic, partition=writer.scope.partition, log_start_offset=offset,
            local_log_start_offset=starts.local,
        )  # fmt: skip


def apply_local_retention(writer: PartitionWriter, local: Local, offsets: PartitionOffsets,
                          settings: RetentionSettings) -> None:  # fmt: skip
    """Advance the broker's log start offset as far as local retention asks, never past what finished
    copies hold (checked against their manifests); the offset is written to the WAL before it is asked."""
    ctx = writer.ctx
    target = local_retention_target([s for s, _ in local], offsets, settings, ctx.now_ms())
    if target is None:
        return
    check_remote_holds(writer, max(offsets.lx, offsets.rx or 0), target)
    if target > writer.log_starts().local and not writer.publish_log_start(LogStartKind.LOCAL_LOG_START, target):
        return  # fenced, or our view was behind the WAL: decide again on the next tick
    crash_point("local_retention.recorded")
    new_start = ctx.cluster.delete_records_before(writer.scope.topic, writer.scope.partition, target)
    crash_point("local_retention.deleted")
    ctx.metrics.local_deleted_offsets.labels(**writer.scope.labels).inc(max(0, new_start - offsets.lx))
    log.info("local retention advanced the log start offset", topic=writer.scope.topic,
             partition=writer.scope.partition, log_start_offset=new_start, remote_end_offset=offsets.ry)  # fmt: skip


def check_remote_holds(writer: PartitionWriter, start: int, target: int) -> None:
    """Raise unless finished copies hold every offset in ``[start, target)``, as their manifests say.

    Local data goes only when its remote copy is really there: each copy's manifest is read and
    must state the offsets and size its COPY_SEGMENT_STARTED fixed and hold the offset in question
    (one small GET per copy, only for the segments being released).
    """
    ctx, (_, topic_id, partition) = writer.ctx, writer.scope
    offset = start
    while offset < target:
        holder = ctx.manager.segment_for_offset(topic_id, partition, offset)
        if holder is None:
            raise TieringError(f"{writer.name}: no finished copy holds offset {offset}; local data below {target} "
                               "is kept")  # fmt: skip
        manifest = ctx.copier.manifest(writer.ref(holder.base_offset, uuid.UUID(bytes=holder.segment_id)))
        problem = manifest.mismatch(holder.end_offset, holder.size)  # ObjectNotFound above if the copy is gone
        if problem is None and not manifest.base_offset <= offset <= manifest.end_offset:
            problem = f"its manifest does not hold offset {offset}"
        if problem is not None:
            raise TieringError(f"{writer.name}: local data below {target} is kept: {problem}")
        offset = manifest.end_offset + 1


def finished_copies(writer: PartitionWriter) -> tuple[list[RemoteSegment], list[RemoteSegmentInfo]]:
    """The partition's finished copies, and each as total retention judges it.

    Copies recorded before the file-time fallback may carry no timestamp (<= 0): judged by the time of their last
    transition, later than any record in them, never as 55 years old. Sizes count each offset once: overlapping
    copies must not make retention.bytes expire data early."""
    ctx, (_, topic_id, partition) = writer.ctx, writer.scope
    finished = ctx.manager.segments(topic_id, partition, [SegmentState.COPY_SEGMENT_FINISHED])
    counted = ctx.manager.counted_sizes(topic_id, partition) if finished else {}
    infos = [RemoteSegmentInfo(s.segment_id.hex(), s.base_offset, s.end_offset, counted.get(s.segment_id, s.size),
                               s.max_timestamp if s.max_timestamp > 0 else s.event_time)
             for s in finished]  # fmt: skip
    return finished, infos


def apply_remote_retention(writer: PartitionWriter, local: Local, offsets: PartitionOffsets,
                           settings: RetentionSettings) -> None:  # fmt: skip
    """Delete the finished copies that total retention, or the log start offset, expires, oldest first."""
    ctx = writer.ctx
    finished, infos = finished_copies(writer)
    if not finished:
        return
    ry = offsets.ry if offsets.ry is not None else -1
    local_only = sum(s.size for s, _ in local if s.base_offset > ry)
    log_start = writer.log_starts().log_start
    expired = remote_segments_to_expire(infos, settings, ctx.now_ms(), local_only_bytes=local_only,
                                        log_start_offset=log_start if log_start >= 0 else None)  # fmt: skip
    ctx.metrics.delete_lag_segments.labels(**writer.scope.labels).set(len(expired))
    by_id = {s.segment_id.hex(): s for s in finished}
    for info in expired:
        if ctx.stopping.is_set() or not writer.delete_copy(by_id[info.segment_id]):
            return
