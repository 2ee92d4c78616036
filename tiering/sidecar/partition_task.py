"""One partition's work in one tick: copy, local retention, total retention, sweeping.

Write-ahead everywhere: COPY_SEGMENT_STARTED is durable before the first byte is uploaded, and
COPY_SEGMENT_FINISHED is written only after the manifest (the last object). A crash at any point
leaves either a finished copy or a STARTED one, which the sweeper deletes after
``copy_started_timeout_seconds`` and the next copy retries with a new segment id. Deletions go
through DELETE_SEGMENT_STARTED / FINISHED the same way.
"""

from __future__ import annotations

import itertools
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from metadata import LogStartRecord, SegmentRecord
from metadata.partition import RemoteSegment
from segment_fsm import LogStartKind, LogStarts, SegmentState, TopicTiering
from tiering.copier import LocalSegment
from tiering.policy import (
    LocalSegmentInfo,
    OffsetViolation,
    PartitionOffsets,
    RemoteSegmentInfo,
    RetentionSettings,
    local_retention_target,
    log_start_to_record,
    next_segment_to_copy,
    remote_segments_to_expire,
)
from tiering.sidecar.context import SidecarContext
from tiering.sidecar.retry import Scope
from tiering_core.errors import ConfigError, FormatError, TieringError
from tiering_core.formats import SegmentFiles, list_segments, parse_leader_epoch_checkpoint
from tiering_core.formats.indexes import read_file
from tiering_core.kafka_cluster import LocalOffsets, TopicInfo
from tiering_core.logs import get_logger
from tiering_core.objects import SegmentRef, parse_key, partition_prefixes
from tiering_core.stores.base import RemoteStoreError

log = get_logger(__name__)
Local = list[tuple[LocalSegmentInfo, SegmentFiles]]  # the partition's segments, oldest first
LEADER_EPOCH_CHECKPOINT = "leader-epoch-checkpoint"


@dataclass
class PartitionFacts:
    """What the runner learned about a partition this tick."""

    topic: TopicInfo
    partition: int
    partition_dir: Path
    offsets: LocalOffsets
    tiering: TopicTiering
    uploads_allowed: bool
    local_deletion_allowed: bool


@dataclass
class PartitionStatus:
    """What status.json (and so ``tiering topic status``) shows of the partition."""

    copy_lag_bytes: int = 0
    copy_lag_segments: int = 0
    last_error: str | None = None
    last_error_ms: int | None = None
    next_retry_ms: int | None = None
    failing: dict[str, str] = field(default_factory=dict)  # operation -> its error, until it succeeds


class LeadershipMoved(TieringError):
    """The leader epoch Kafka answered with is not this broker's: the partition is led elsewhere now."""


class CopyFailed(TieringError):
    """A segment copy failed; its objects were deleted again (or the sweeper will). Retried with backoff."""


class PartitionTask:
    """The state kept across ticks for one partition this broker leads."""

    def __init__(self, ctx: SidecarContext, topic: str, topic_id: str, partition: int) -> None:
        self.ctx = ctx
        self.topic = topic
        self.topic_id = topic_id
        self.partition = partition
        self.scope = Scope(topic, topic_id, partition)
        self.status = PartitionStatus()
        self.labels = {"topic": topic, "partition": str(partition)}
        self.corrupt: dict[int, tuple[int, str]] = {}  # base offset -> (size, error): skipped until the size changes

    # -- the tick ---------------------------------------------------------------------------
    def step(self, facts: PartitionFacts) -> None:
        """Run each operation of the partition that is due. Never raises: a failing operation is recorded
        (log with traceback, metrics, status) and retried after its backoff; the others go on."""
        retry, scope = self.ctx.retry, self.scope
        begun = retry.run(scope, "partition", lambda: self._begin(facts))
        if begun is not None:
            token, epoch, local, offsets = begun
            retry.run(scope, "log_start", lambda: self._record_log_start(offsets, epoch, token))
            if facts.uploads_allowed:
                retry.run(scope, "copy", lambda: self._copy_all(facts, local, offsets, epoch, token))
                offsets = self._offsets(facts.offsets)
                self._update_lag(local, offsets)
            else:
                retry.clear(scope, "copy")
            settings = retry.run(scope, "retention", lambda: self._retention(facts))
            if settings is not None and facts.local_deletion_allowed:
                retry.run(scope, "local_retention",
                          lambda: self._local_retention(local, offsets, settings, epoch, token))  # fmt: skip
            else:
                retry.clear(scope, "local_retention")
            if settings is not None:
                retry.run(scope, "remote_retention",
                          lambda: self._remote_retention(local, offsets, settings, epoch, token))  # fmt: skip
            retry.run(scope, "sweep", lambda: self._sweep(epoch, token, offsets))
            summary = self.ctx.manager.partition_state(self.topic_id, self.partition)
            self.ctx.metrics.remote_log_size_bytes.labels(**self.labels).set(summary.remote_size if summary else 0)
            self.ctx.metrics.remote_stored_bytes.labels(**self.labels).set(summary.stored_size if summary else 0)
        self._refresh_status()

    def _refresh_status(self) -> None:
        for name, value in self.ctx.retry.summary(self.scope).items():
            setattr(self.status, name, value)

    def _begin(self, facts: PartitionFacts) -> tuple[int, int, Local, PartitionOffsets]:
        """The lease's fencing token, the leader epoch, the local segments and the offsets, checked; raises
        if the partition must not be touched this tick (led elsewhere, lease elsewhere, offsets out of order)."""
        epoch = self._own_leader_epoch(facts)
        token = 0
        if self.ctx.leases is not None:
            held = self.ctx.leases.acquire(self.topic_id, self.partition)
            if held is None:
                raise TieringError(f"{self.topic}-{self.partition}: another sidecar holds the partition lease")
            token = held
        local = self._local_segments(facts.partition_dir)
        offsets = self._offsets(facts.offsets)
        self._update_lag(local, offsets)
        try:
            offsets.check(f"{self.topic}-{self.partition}")
        except OffsetViolation:
            self.ctx.metrics.offset_violations.labels(**self.labels).inc()
            raise
        return token, epoch, local, offsets

    def _own_leader_epoch(self, facts: PartitionFacts) -> int:
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
                f"{self.topic}-{self.partition}: Kafka answered with leader epoch {answered}, but this broker's "
                f"{path} ends at epoch {own}: another broker leads the partition (or leadership is moving); "
                "nothing is written with that epoch"
            )
        return answered

    def _copy_all(self, facts: PartitionFacts, local: Local,
                  offsets: PartitionOffsets, epoch: int, token: int) -> None:  # fmt: skip
        """Copy eligible segments in offset order until none is left (or one is refused).

        Before each further segment the partition's leader epoch is asked again: a backlog can take long
        to upload, and a broker that lost the leadership meanwhile must stop (and let its lease go)
        instead of uploading the rest of its own log.
        """
        while not self.ctx.stopping.is_set():
            decision = next_segment_to_copy([s for s, _ in local], offsets)
            if decision is None or not self._copy(decision.segment, decision.end_offset, local, epoch, token):
                return
            now = self.ctx.cluster.leader_epoch(self.topic, self.partition)
            if now != epoch:
                raise LeadershipMoved(f"{self.topic}-{self.partition}: the leader epoch moved from {epoch} to {now} "
                                      "during the uploads; the rest waits for the next tick")  # fmt: skip
            offsets = self._offsets(facts.offsets)
            self._update_lag(local, offsets)  # after every segment: a tick can copy for minutes

    # -- facts ------------------------------------------------------------------------------
    def _local_segments(self, partition_dir: Path) -> Local:
        out = []
        for files in list_segments(partition_dir):
            try:
                size = files.log.stat().st_size
                max_ts = files.largest_timestamp()
            except FileNotFoundError:
                continue  # renamed to .deleted by Kafka's retention between listing and stat
            out.append((LocalSegmentInfo(files.base_offset, size, max_ts), files))
        return out

    def _offsets(self, local: LocalOffsets) -> PartitionOffsets:
        summary = self.ctx.manager.partition_state(self.topic_id, self.partition)
        if summary is None:
            return PartitionOffsets(local.lx, local.ly, local.lz)
        return PartitionOffsets(local.lx, local.ly, local.lz, summary.remote_start_offset, summary.remote_end_offset)

    def refresh_lag(self, partition_dir: Path, local: LocalOffsets) -> None:
        """Recompute the copy lag from the disk, Kafka's offsets and the metadata (the runner's monitor
        calls it between and during ticks)."""
        self._update_lag(self._local_segments(partition_dir), self._offsets(local))

    def _update_lag(self, local: Local, offsets: PartitionOffsets) -> None:
        lag_bytes = lag_segments = 0
        for (seg, _), (following, _) in itertools.pairwise(local):
            done = offsets.ry is not None and following.base_offset - 1 <= offsets.ry
            if not done and following.base_offset <= offsets.ly and following.base_offset > offsets.lx:
                lag_bytes += seg.size
                lag_segments += 1
        self.status.copy_lag_bytes, self.status.copy_lag_segments = lag_bytes, lag_segments
        self.ctx.metrics.copy_lag_bytes.labels(**self.labels).set(lag_bytes)
        self.ctx.metrics.copy_lag_segments.labels(**self.labels).set(lag_segments)

    def _retention(self, facts: PartitionFacts) -> RetentionSettings:
        try:
            return RetentionSettings(
                retention_ms=facts.topic.config_int("retention.ms", 7 * 24 * 3600 * 1000),
                retention_bytes=facts.topic.config_int("retention.bytes", -1),
                local_retention_ms=facts.tiering.local_retention_ms,
                local_retention_bytes=facts.tiering.local_retention_bytes,
            )
        except ConfigError as exc:
            raise ConfigError(f"{self.topic}: inconsistent retention settings, no retention applied: {exc}") from exc

    # -- records ----------------------------------------------------------------------------
    def _record(self, ref: SegmentRef, state: SegmentState, end: int, max_ts: int, size: int, epoch: int,
                token: int) -> SegmentRecord:  # fmt: skip
        return SegmentRecord(
            topic=self.topic, topic_id=self.topic_id, partition=self.partition, segment_id=ref.segment_id,
            state=state, broker_id=self.ctx.broker_id, leader_epoch=epoch, fencing_token=token,
            event_time=self.ctx.now_ms(), base_offset=ref.base_offset, end_offset=end, max_timestamp=max_ts,
            size=size, leader_epochs=((epoch, ref.base_offset),),
        )  # fmt: skip

    def _publish(self, record: SegmentRecord | LogStartRecord) -> bool:
        result = self.ctx.manager.publish(record)
        if not result.accepted:
            log.warning(
                "metadata transition rejected", topic=self.topic, partition=self.partition, reason=result.reason,
                state=record.state.name if isinstance(record, SegmentRecord) else record.kind.name,
            )  # fmt: skip
        return result.accepted

    # -- copy -------------------------------------------------------------------------------
    def _copy(self, seg: LocalSegmentInfo, end: int, local: Local, epoch: int,
              token: int) -> bool:  # fmt: skip
        """Copy one segment through the FSM; True when it finished (so the next one may follow)."""
        known = self.corrupt.get(seg.base_offset)
        if known is not None and known[0] == seg.size:
            raise CopyFailed(known[1])  # still corrupt: keep reporting it, never upload it
        index = next(i for i, (s, _) in enumerate(local) if s.base_offset == seg.base_offset)
        files, next_base = local[index][1], local[index + 1][0].base_offset
        ref = SegmentRef(self.topic, self.topic_id, self.partition, seg.base_offset, uuid.uuid4())
        if not self._publish(self._record(ref, SegmentState.COPY_SEGMENT_STARTED, end, seg.max_timestamp, seg.size,
                                          epoch, token)):  # fmt: skip
            return False
        try:
            manifest = self.ctx.copier.copy(ref, LocalSegment(files, next_base), size=seg.size)
        except Exception as exc:  # whatever it is: count it, delete what was written, report it
            message = f"copy of {files.log} failed: {exc if isinstance(exc, TieringError) else repr(exc)}"
            if isinstance(exc, FormatError):
                self.corrupt[seg.base_offset] = (seg.size, message)
                self.ctx.metrics.corrupt_segments.labels(**self.labels).inc()
            self.ctx.metrics.copy_errors.labels(**self.labels).inc()
            self._abandon(ref, end, seg, epoch, token)
            raise CopyFailed(message) from exc
        if self.ctx.leases is not None and not self.ctx.leases.is_held(self.topic_id, self.partition):
            # the new holder's sweeper removes the STARTED copy
            raise TieringError(f"{self.topic}-{self.partition}: lease lost during the copy; not finishing it")
        short = manifest.mismatch(end, seg.size)  # COPY_SEGMENT_STARTED fixed these; FINISHED must hold them
        if short is not None:
            message = f"copy of {files.log} does not cover the segment, abandoned: {short}"
            self.corrupt[seg.base_offset] = (seg.size, message)
            self.ctx.metrics.copy_errors.labels(**self.labels).inc()
            self._abandon(ref, end, seg, epoch, token)
            raise CopyFailed(message)
        finished = self._record(ref, SegmentState.COPY_SEGMENT_FINISHED, end, manifest.max_timestamp,
                                manifest.log_size, epoch, token)  # fmt: skip
        if not self._publish(finished):
            return False  # fenced or swept: whoever owns the partition now removes the objects
        self.ctx.metrics.copy_bytes.labels(**self.labels).inc(manifest.log_size)
        self.ctx.metrics.copy_segments.labels(**self.labels).inc()
        log.info(
            "segment copied", topic=self.topic, partition=self.partition, base_offset=seg.base_offset,
            end_offset=end, bytes=manifest.log_size, segment_id=ref.segment_id.hex,
        )  # fmt: skip
        return True

    def _abandon(self, ref: SegmentRef, end: int, seg: LocalSegmentInfo, epoch: int, token: int) -> None:
        """A failed copy: DELETE_SEGMENT_STARTED, delete its objects, DELETE_SEGMENT_FINISHED."""
        try:
            if self._publish(self._record(ref, SegmentState.DELETE_SEGMENT_STARTED, end, seg.max_timestamp, seg.size,
                                          epoch, token)):  # fmt: skip
                self.ctx.copier.delete(ref)
                self._publish(self._record(ref, SegmentState.DELETE_SEGMENT_FINISHED, end, seg.max_timestamp,
                                           seg.size, epoch, token))  # fmt: skip
        except Exception as exc:  # the sweeper retries a DELETE_SEGMENT_STARTED later; the copy's error is reported
            log.error("abandoning a failed copy failed", segment=str(ref), error=str(exc), exc_info=exc)

    # -- deletion of remote copies -----------------------------------------------------------
    def delete_copy(self, seg: RemoteSegment, epoch: int, token: int) -> bool:
        """Delete a remote copy through the FSM (idempotent). True when DELETE_SEGMENT_FINISHED, False when
        the metadata refused a transition; RemoteStoreError when the store failed (the copy stays in
        DELETE_SEGMENT_STARTED, which the sweeper retries)."""
        ref = SegmentRef(self.topic, self.topic_id, self.partition, seg.base_offset, uuid.UUID(bytes=seg.segment_id))
        common = (seg.end_offset, seg.max_timestamp, seg.size, max(epoch, seg.leader_epoch), token)
        if seg.state != SegmentState.DELETE_SEGMENT_STARTED and not self._publish(
            self._record(ref, SegmentState.DELETE_SEGMENT_STARTED, *common)
        ):
            return False
        try:
            self.ctx.copier.delete(ref)
        except RemoteStoreError:
            self.ctx.metrics.delete_errors.labels(**self.labels).inc()
            raise
        return self._publish(self._record(ref, SegmentState.DELETE_SEGMENT_FINISHED, *common))

    # -- log start offsets (segment_fsm.log_start) --------------------------------------------
    def _log_starts(self) -> LogStarts:
        summary = self.ctx.manager.partition_state(self.topic_id, self.partition)
        return LogStarts() if summary is None else summary.log_starts

    def _publish_log_start(self, kind: LogStartKind, offset: int, epoch: int, token: int) -> bool:
        return self._publish(LogStartRecord(
            topic=self.topic, topic_id=self.topic_id, partition=self.partition, broker_id=self.ctx.broker_id,
            leader_epoch=epoch, fencing_token=token, event_time=self.ctx.now_ms(), kind=kind, offset=offset,
        ))  # fmt: skip

    def _record_log_start(self, offsets: PartitionOffsets, epoch: int, token: int) -> None:
        """Record a baseline, or a log start offset moved above every local retention request (a user's
        delete_records or the broker's retention), below which remote retention then deletes copies."""
        starts = self._log_starts()
        action = log_start_to_record(offsets.lx, offsets.ry, starts)
        if action is None:
            return
        kind, offset = action
        if self._publish_log_start(kind, offset, epoch, token) and kind is LogStartKind.LOG_START:
            log.warning(
                "the log start offset moved above every local retention request: remote copies below it go",
                topic=self.topic, partition=self.partition, log_start_offset=offset,
                local_log_start_offset=starts.local,
            )  # fmt: skip

    # -- retention --------------------------------------------------------------------------
    def _local_retention(self, local: Local, offsets: PartitionOffsets, settings: RetentionSettings, epoch: int,
                         token: int) -> None:  # fmt: skip
        target = local_retention_target([s for s, _ in local], offsets, settings, self.ctx.now_ms())
        if target is None:
            return
        self._check_remote_holds(max(offsets.lx, offsets.rx or 0), target)
        if target > self._log_starts().local and not self._publish_log_start(
            LogStartKind.LOCAL_LOG_START, target, epoch, token
        ):
            return  # fenced, or our view was behind the WAL: decide again on the next tick
        new_start = self.ctx.cluster.delete_records_before(self.topic, self.partition, target)
        self.ctx.metrics.local_deleted_offsets.labels(**self.labels).inc(max(0, new_start - offsets.lx))
        log.info("local retention advanced the log start offset", topic=self.topic, partition=self.partition,
                 log_start_offset=new_start, remote_end_offset=offsets.ry)  # fmt: skip

    def _check_remote_holds(self, start: int, target: int) -> None:
        """Raise unless finished copies hold every offset in ``[start, target)``, as their manifests say.

        Local data goes only when its remote copy is really there: each copy's manifest is read and
        must state the offsets and size its COPY_SEGMENT_STARTED fixed and hold the offset in question
        (one small GET per copy, only for the segments being released).
        """
        offset = start
        while offset < target:
            holder = self.ctx.manager.segment_for_offset(self.topic_id, self.partition, offset)
            if holder is None:
                raise TieringError(f"{self.topic}-{self.partition}: no finished copy holds offset {offset}; "
                                   f"local data below {target} is kept")  # fmt: skip
            ref = SegmentRef(self.topic, self.topic_id, self.partition, holder.base_offset,
                             uuid.UUID(bytes=holder.segment_id))  # fmt: skip
            manifest = self.ctx.copier.manifest(ref)  # raises ObjectNotFound if the copy is gone
            problem = manifest.mismatch(holder.end_offset, holder.size)
            if problem is None and not manifest.base_offset <= offset <= manifest.end_offset:
                problem = f"its manifest does not hold offset {offset}"
            if problem is not None:
                raise TieringError(f"{self.topic}-{self.partition}: local data below {target} is kept: {problem}")
            offset = manifest.end_offset + 1

    def _remote_retention(self, local: Local, offsets: PartitionOffsets,
                          settings: RetentionSettings, epoch: int, token: int) -> None:  # fmt: skip
        finished = self.ctx.manager.segments(self.topic_id, self.partition, [SegmentState.COPY_SEGMENT_FINISHED])
        if not finished:
            return
        # copies recorded before the file-time fallback may carry no timestamp (<= 0): judge those by the
        # time of their last transition, later than any record in them, never as 55 years old. Sizes count
        # each offset once: overlapping copies must not make retention.bytes expire data early.
        counted = self.ctx.manager.counted_sizes(self.topic_id, self.partition)
        infos = [RemoteSegmentInfo(s.segment_id.hex(), s.base_offset, s.end_offset, counted.get(s.segment_id, s.size),
                                   s.max_timestamp if s.max_timestamp > 0 else s.event_time)
                 for s in finished]  # fmt: skip
        ry = offsets.ry if offsets.ry is not None else -1
        local_only = sum(s.size for s, _ in local if s.base_offset > ry)
        log_start = self._log_starts().log_start
        expired = remote_segments_to_expire(infos, settings, self.ctx.now_ms(), local_only_bytes=local_only,
                                            log_start_offset=log_start if log_start >= 0 else None)  # fmt: skip
        self.ctx.metrics.delete_lag_segments.labels(**self.labels).set(len(expired))
        by_id = {s.segment_id.hex(): s for s in finished}
        for info in expired:
            if self.ctx.stopping.is_set() or not self.delete_copy(by_id[info.segment_id], epoch, token):
                return

    # -- sweeping ---------------------------------------------------------------------------
    def _sweep(self, epoch: int, token: int, offsets: PartitionOffsets) -> None:
        """Finish what crashed sidecars left: duplicate finished copies, stale STARTED copies, unfinished
        deletions, orphans.

        A duplicate is a second COPY_SEGMENT_FINISHED of exactly the same offsets (a crash can leave one:
        a FINISHED record that lands late, after the retry finished its own copy). The copy reads prefer
        stays, the other goes through DELETE_SEGMENT_*. Overlapping copies of other boundaries (a new
        leader's) are legitimate and stay; size accounting counts their offsets once.
        """
        for dup in self.ctx.manager.duplicate_copies(self.topic_id, self.partition):
            log.warning("deleting a duplicate copy: another finished copy holds the same offsets", topic=self.topic,
                        partition=self.partition, base_offset=dup.base_offset, end_offset=dup.end_offset,
                        segment_id=dup.segment_id.hex(), leader_epoch=dup.leader_epoch)  # fmt: skip
            self.delete_copy(dup, epoch, token)
        timeout_ms = self.ctx.settings.copy_started_timeout_seconds * 1000
        now = self.ctx.now_ms()
        every = self.ctx.manager.segments(self.topic_id, self.partition)
        known = {s.segment_id for s in every}
        for seg in every:
            stale = seg.state == SegmentState.COPY_SEGMENT_STARTED and now - seg.event_time > timeout_ms
            if stale or seg.state == SegmentState.DELETE_SEGMENT_STARTED:
                self.delete_copy(seg, epoch, token)
        if offsets.ry is None:
            return
        orphans = []
        for prefix in partition_prefixes(self.ctx.prefix, self.topic, self.topic_id, self.partition):
            for key in self.ctx.store.list_keys(prefix + "/"):
                parsed = parse_key(key)
                if parsed is not None and parsed[1].bytes not in known and parsed[0] <= offsets.ry:
                    orphans.append(key)
        if orphans:
            log.warning("deleting orphan objects", topic=self.topic, partition=self.partition, count=len(orphans))
            self.ctx.store.delete(orphans)
