"""Copying a partition's rolled segments to remote storage, in offset order, through the FSM.

Write-ahead: COPY_SEGMENT_STARTED is durable before the first byte is uploaded, and
COPY_SEGMENT_FINISHED is written only after the manifest (the last object) and only when the manifest
covers the segment exactly. A crash at any point leaves either a finished copy or a STARTED one, which
the sweeper deletes after ``copy_started_timeout_seconds``; the next copy retries with a new segment
id. A failed copy is abandoned at once through DELETE_SEGMENT_STARTED / FINISHED.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

from segment_fsm import SegmentState
from tiering.copier import LocalSegment
from tiering.policy import CopyDecision, LocalSegmentInfo, PartitionOffsets, next_segment_to_copy
from tiering.sidecar.facts import Local
from tiering.sidecar.leadership import check_still_leading
from tiering.sidecar.writer import PartitionWriter
from tiering_core.crash_points import crash_point
from tiering_core.errors import FormatError, TieringError
from tiering_core.logs import get_logger
from tiering_core.objects import SegmentRef

log = get_logger(__name__)


class CopyFailed(TieringError):
    """A segment copy failed; its objects were deleted again (or the sweeper will). Retried with backoff."""


class CorruptSegments:
    """Local segments refused as corrupt, by base offset, with the file's size then: never uploaded while
    the size stays the same (the error is reported again instead), tried again once it changes."""

    def __init__(self) -> None:
        self._known: dict[int, tuple[int, str]] = {}  # base offset -> (size, error)

    def error(self, seg: LocalSegmentInfo) -> str | None:
        """The error ``seg`` was refused with, while its size is the same; None otherwise."""
        known = self._known.get(seg.base_offset)
        return known[1] if known is not None and known[0] == seg.size else None

    def add(self, seg: LocalSegmentInfo, error: str) -> None:
        self._known[seg.base_offset] = (seg.size, error)


def copy_backlog(writer: PartitionWriter, local: Local, offsets: PartitionOffsets, corrupt: CorruptSegments,
                 refreshed: Callable[[], PartitionOffsets]) -> None:  # fmt: skip
    """Copy eligible segments in offset order until none is left (or one is refused).

    Before each further segment the partition's leader epoch is asked again: a backlog can take long
    to upload, and a broker that lost the leadership meanwhile must stop (and let its lease go)
    instead of uploading the rest of its own log. ``refreshed()`` gives the offsets anew after each
    copied segment (and updates the copy lag: a tick can copy for minutes).
    """
    while not writer.ctx.stopping.is_set():
        decision = next_segment_to_copy([s for s, _ in local], offsets)
        if decision is None or not copy_segment(writer, decision, local, corrupt):
            return
        check_still_leading(writer)
        offsets = refreshed()


def copy_segment(writer: PartitionWriter, decision: CopyDecision, local: Local, corrupt: CorruptSegments) -> bool:
    """Copy one segment through the FSM; True when it finished, or another leader's finished copy turned out to
    cover it (so the next one may follow), False when the metadata refused a transition. Raises CopyFailed (its
    objects deleted again) or TieringError."""
    ctx, labels = writer.ctx, writer.scope.labels
    seg, end = decision.segment, decision.end_offset
    known = corrupt.error(seg)
    if known is not None:
        raise CopyFailed(known)  # still corrupt: keep reporting it, never upload it
    index = next(i for i, (s, _) in enumerate(local) if s.base_offset == seg.base_offset)
    files, next_base = local[index][1], local[index + 1][0].base_offset
    ref = writer.ref(seg.base_offset, uuid.uuid4())
    if not writer.publish(writer.segment_record(ref, SegmentState.COPY_SEGMENT_STARTED, end, seg.max_timestamp,
                                                seg.size)):  # fmt: skip
        return False
    crash_point("copy.started")
    if _copied_meanwhile(writer, end):
        # Another leader's copy of these offsets finished before our STARTED was applied (a deposed leader's
        # in-flight copy, or a late WAL write): uploading would only make a duplicate. Anything that leader
        # writes after our STARTED carries an older epoch and is fenced, so this check closes the race.
        log.info("segment already copied by another leader; not copying it again", topic=writer.scope.topic,
                 partition=writer.scope.partition, base_offset=seg.base_offset, end_offset=end)  # fmt: skip
        abandon(writer, ref, end, seg)
        return True
    try:
        manifest = ctx.copier.copy(ref, LocalSegment(files, next_base), size=seg.size, leader_epoch=writer.epoch)
    except Exception as exc:  # whatever it is: count it, delete what was written, report it
        message = f"copy of {files.log} failed: {exc if isinstance(exc, TieringError) else repr(exc)}"
        if isinstance(exc, FormatError):
            corrupt.add(seg, message)
            ctx.metrics.corrupt_segments.labels(**labels).inc()
        ctx.metrics.copy_errors.labels(**labels).inc()
        abandon(writer, ref, end, seg)
        raise CopyFailed(message) from exc
    crash_point("copy.manifest_written")
    if ctx.leases is not None and not ctx.leases.is_held(writer.scope.topic_id, writer.scope.partition):
        # the new holder's sweeper removes the STARTED copy
        raise TieringError(f"{writer.name}: lease lost during the copy; not finishing it")
    short = manifest.mismatch(end, seg.size)  # COPY_SEGMENT_STARTED fixed these; FINISHED must hold them
    if short is not None:
        message = f"copy of {files.log} does not cover the segment, abandoned: {short}"
        corrupt.add(seg, message)
        ctx.metrics.copy_errors.labels(**labels).inc()
        abandon(writer, ref, end, seg)
        raise CopyFailed(message)
    finished = writer.segment_record(ref, SegmentState.COPY_SEGMENT_FINISHED, end, manifest.max_timestamp,
                                     manifest.log_size)  # fmt: skip
    if not writer.publish(finished):
        return False  # fenced or swept: whoever owns the partition now removes the objects
    crash_point("copy.finished")
    ctx.metrics.copy_bytes.labels(**labels).inc(manifest.log_size)
    ctx.metrics.copy_segments.labels(**labels).inc()
    log.info(
        "segment copied", topic=writer.scope.topic, partition=writer.scope.partition, base_offset=seg.base_offset,
        end_offset=end, bytes=manifest.log_size, segment_id=ref.segment_id.hex,
    )  # fmt: skip
    return True


def _copied_meanwhile(writer: PartitionWriter, end: int) -> bool:
    """Whether finished copies now reach ``end``. Asked after our COPY_SEGMENT_STARTED is applied: the WAL
    partition is totally ordered and ``publish`` waits until this replica applied our record, so every record
    written before it (a FINISHED that landed while we were deciding) is in the state."""
    summary = writer.ctx.manager.partition_state(writer.scope.topic_id, writer.scope.partition)
    return summary is not None and summary.remote_end_offset is not None and summary.remote_end_offset >= end


def abandon(writer: PartitionWriter, ref: SegmentRef, end: int, seg: LocalSegmentInfo) -> None:
    """A failed copy: DELETE_SEGMENT_STARTED, delete its objects, DELETE_SEGMENT_FINISHED. Never raises: the
    sweeper retries a DELETE_SEGMENT_STARTED later, and the copy's own error is what gets reported."""
    try:
        if writer.publish(writer.segment_record(ref, SegmentState.DELETE_SEGMENT_STARTED, end, seg.max_timestamp,
                                                seg.size)):  # fmt: skip
            writer.ctx.copier.delete(ref)
            writer.publish(writer.segment_record(ref, SegmentState.DELETE_SEGMENT_FINISHED, end, seg.max_timestamp,
                                                 seg.size))  # fmt: skip
    except Exception as exc:
        log.error("abandoning a failed copy failed", segment=str(ref), error=str(exc), exc_info=exc)
