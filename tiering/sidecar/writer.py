"""``PartitionWriter``: every change to one partition's metadata and remote copies, under its fence.

The context object that the partition's operations (copy, retention, sweeping, a deleted topic's
cleanup, ``tiering topic rollback --delete-remote``) share instead of passing the topic, topic id,
partition, leader epoch and lease token from function to function. Every record it writes carries
that leader epoch and fencing token, so the metadata rejects it once another broker leads.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace

from metadata import LogStartRecord, PartitionDeleteRecord, SegmentRecord
from metadata.partition import RemoteSegment
from segment_fsm import LogStartKind, LogStarts, PartitionDeleteState, SegmentState
from tiering.sidecar.context import SidecarContext
from tiering.sidecar.retry import Scope
from tiering_core.crash_points import crash_point
from tiering_core.logs import get_logger
from tiering_core.objects import SegmentRef, partition_prefixes
from tiering_core.stores.base import RemoteStoreError

log = get_logger(__name__)


@dataclass(frozen=True)
class PartitionWriter:
    """One partition (``scope``) as it may be changed now: records carry ``epoch`` (its leader epoch)
    and ``token`` (the etcd lease's fencing token, 0 without leases)."""

    ctx: SidecarContext
    scope: Scope
    epoch: int
    token: int

    @property
    def name(self) -> str:
        """``topic-partition``, as errors name it."""
        return f"{self.scope.topic}-{self.scope.partition}"

    def ref(self, base_offset: int, segment_id: uuid.UUID) -> SegmentRef:
        topic, topic_id, partition = self.scope
        return SegmentRef(topic, topic_id, partition, base_offset, segment_id)

    def segment_record(self, ref: SegmentRef, state: SegmentState, end: int, max_timestamp: int,
                       size: int) -> SegmentRecord:  # fmt: skip
        """The record of ``ref`` (offsets ``ref.base_offset`` .. ``end``, inclusive) entering ``state``."""
        topic, topic_id, partition = self.scope
        return SegmentRecord(
            topic=topic, topic_id=topic_id, partition=partition, segment_id=ref.segment_id, state=state,
            broker_id=self.ctx.broker_id, leader_epoch=self.epoch, fencing_token=self.token,
            event_time=self.ctx.now_ms(), base_offset=ref.base_offset, end_offset=end, max_timestamp=max_timestamp,
            size=size, leader_epochs=((self.epoch, ref.base_offset),),
        )  # fmt: skip

    def publish(self, record: SegmentRecord | LogStartRecord) -> bool:
        """Write ``record`` to the metadata WAL; False (and a warning) when the metadata refused it (fenced,
        or an invalid transition): the caller stops and decides again on the next tick."""
        result = self.ctx.manager.publish(record)
        if not result.accepted:
            log.warning(
                "metadata transition rejected", topic=self.scope.topic, partition=self.scope.partition,
                reason=result.reason,
                state=record.state.name if isinstance(record, SegmentRecord) else record.kind.name,
            )  # fmt: skip
        return result.accepted

    # -- log start offsets (segment_fsm.log_start) --------------------------------------------
    def log_starts(self) -> LogStarts:
        summary = self.ctx.manager.partition_state(self.scope.topic_id, self.scope.partition)
        return LogStarts() if summary is None else summary.log_starts

    def publish_log_start(self, kind: LogStartKind, offset: int) -> bool:
        topic, topic_id, partition = self.scope
        return self.publish(LogStartRecord(
            topic=topic, topic_id=topic_id, partition=partition, broker_id=self.ctx.broker_id,
            leader_epoch=self.epoch, fencing_token=self.token, event_time=self.ctx.now_ms(), kind=kind, offset=offset,
        ))  # fmt: skip

    # -- deleting ------------------------------------------------------------------------------
    def partition_delete_record(self, state: PartitionDeleteState) -> PartitionDeleteRecord:
        """The record of the (deleted topic's) partition entering ``state``."""
        topic, topic_id, partition = self.scope
        return PartitionDeleteRecord(topic=topic, topic_id=topic_id, partition=partition, state=state,
                                     broker_id=self.ctx.broker_id, leader_epoch=self.epoch, fencing_token=self.token,
                                     event_time=self.ctx.now_ms())  # fmt: skip

    def delete_copy(self, seg: RemoteSegment) -> bool:
        """Delete a remote copy through the FSM (idempotent). True when DELETE_SEGMENT_FINISHED, False when
        the metadata refused a transition; RemoteStoreError when the store failed (the copy stays in
        DELETE_SEGMENT_STARTED, which the sweeper retries)."""
        ref = self.ref(seg.base_offset, uuid.UUID(bytes=seg.segment_id))
        fenced = replace(self, epoch=max(self.epoch, seg.leader_epoch))  # never below the copy's own epoch

        def record(state: SegmentState) -> SegmentRecord:
            return fenced.segment_record(ref, state, seg.end_offset, seg.max_timestamp, seg.size)

        if seg.state != SegmentState.DELETE_SEGMENT_STARTED and not self.publish(
            record(SegmentState.DELETE_SEGMENT_STARTED)
        ):
            return False
        crash_point("delete.started")
        try:
            self.ctx.copier.delete(ref)
        except RemoteStoreError:
            self.ctx.metrics.delete_errors.labels(**self.scope.labels).inc()
            raise
        crash_point("delete.objects_deleted")
        return self.publish(record(SegmentState.DELETE_SEGMENT_FINISHED))

    def undeleted_copies(self) -> list[RemoteSegment]:
        """Every copy of the partition whose deletion has not finished, in any state."""
        segments = self.ctx.manager.segments(self.scope.topic_id, self.scope.partition)
        return [s for s in segments if s.state != SegmentState.DELETE_SEGMENT_FINISHED]

    def delete_leftovers(self) -> int:
        """Delete every object left under the partition's prefixes (after its copies were deleted through the
        FSM: what crashed uploads left); returns how many there were. Idempotent."""
        topic, topic_id, partition = self.scope
        keys = [k for p in partition_prefixes(topic, topic_id, partition)
                for k in self.ctx.store.list_keys(p + "/")]  # fmt: skip
        self.ctx.store.delete(keys)
        return len(keys)
