"""The metadata state: every record of the WAL applied through segment_fsm, in WAL order.

Deterministic: replicas that apply the same records in the same order reach the same state,
including the same rejections (illegal transitions, fenced writers). Rejected records change
nothing. Records of a newer format version are skipped and counted; garbage (unparseable, or
carrying a value no writer produces, such as an unknown state id: ``records.parse`` checks) is
counted and logged. Neither ever stops replay.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from metadata.partition import DELETE_FINISHED, PartitionSegments
from metadata.records import (
    ClusterRecord,
    LogStartRecord,
    MetadataRecord,
    PartitionDeleteRecord,
    RecordDecodeError,
    SegmentRecord,
    TopicRecord,
    UnknownVersion,
    parse,
    topic_id_bytes,
    topic_id_str,
)
from segment_fsm import (
    Fence,
    LogStartKind,
    PartitionDeleteState,
    SegmentState,
    TopicAction,
    TopicTiering,
    apply_log_start,
    apply_topic_action,
    fence_rejection,
    log_start_rejection,
    partition_delete_rejection,
    segment_rejection,
)
from segment_fsm.fencing import advance
from segment_fsm.states import SEGMENT_TRANSITIONS

_ALLOWED = {(-1 if k is None else int(k)): frozenset(int(v) for v in vs) for k, vs in SEGMENT_TRANSITIONS.items()}
_SEGMENT, _PARTITION, _TOPIC, _CLUSTER, _LOG_START = (
    SegmentRecord.TYPE, PartitionDeleteRecord.TYPE, TopicRecord.TYPE, ClusterRecord.TYPE, LogStartRecord.TYPE,
)  # fmt: skip
COMPACT_AFTER = 1024  # drop rows of finished deletions once a partition has this many


class ApplyResult(NamedTuple):
    accepted: bool
    reason: str | None = None


ACCEPTED = ApplyResult(True)


@dataclass
class Counters:
    applied: int = 0
    rejected: int = 0
    unknown_version: int = 0
    garbage: int = 0


@dataclass
class ClusterTiering:
    upload_paused: bool = False
    rolled_back: bool = False


@dataclass
class MetadataState:
    partitions: dict[tuple[bytes, int], PartitionSegments] = field(default_factory=dict)
    topics: dict[bytes, tuple[str, TopicTiering]] = field(default_factory=dict)
    # per topic id, the event time of its first accepted topic record: which incarnation of a re-created
    # name is the newest, the same on every replica (dict order is not: it follows WAL replay order)
    topic_since: dict[bytes, int] = field(default_factory=dict)
    cluster: ClusterTiering = field(default_factory=ClusterTiering)
    counters: Counters = field(default_factory=Counters)
    last_rejection: str | None = None
    # records applied about any partition (accepted or not): each partition keeps the count as of its last one
    # in ``changed``, so a reader can tell "nothing about this partition changed" without comparing its segments
    changes: int = 0

    # -- applying ---------------------------------------------------------------------------
    def apply(self, record: MetadataRecord) -> ApplyResult:
        return self.apply_payload(record.encode())

    def apply_payload(self, data: bytes) -> ApplyResult:
        """Apply one WAL payload. Raises RecordDecodeError / UnknownVersion after counting them."""
        try:
            kind, f = parse(data)
        except UnknownVersion:
            self.counters.unknown_version += 1
            raise
        except RecordDecodeError:
            self.counters.garbage += 1
            raise
        if kind == _SEGMENT:
            result = self._apply_segment(f)
        elif kind == _PARTITION:
            result = self._apply_partition_delete(f)
        elif kind == _TOPIC:
            result = self._apply_topic(f)
        elif kind == _LOG_START:
            result = self._apply_log_start(f)
        else:
            result = self._apply_cluster(f)
        if result.accepted:
            self.counters.applied += 1
        else:
            self.counters.rejected += 1
            self.last_rejection = result.reason
        return result

    def _partition(self, tid: bytes, partition: int, topic: str) -> PartitionSegments:
        p = self.partitions.get((tid, partition))
        if p is None:
            p = self.partitions[(tid, partition)] = PartitionSegments(topic)
        self.changes += 1
        p.changed = self.changes
        return p

    def _apply_segment(self, f: tuple) -> ApplyResult:
        broker, epoch, token, event_time, tid, partition, sid, state, base, end, first_ts, max_ts, size, topic, _ = f
        p = self._partition(tid, partition, topic)
        fence = p.fence
        if epoch < fence.leader_epoch or token < fence.token:
            return ApplyResult(False, fence_rejection(fence, Fence(epoch, token), broker))
        row = p.find(sid, base)
        current = -1 if row is None else p.state[row]
        if state not in _ALLOWED[current]:
            return ApplyResult(
                False, segment_rejection(None if current < 0 else SegmentState(current), SegmentState(state))
            )
        if row is None:
            p.add(sid, state, epoch, event_time, base, end, first_ts, max_ts, size)
        else:
            p.update(row, state, event_time)
        if epoch > fence.leader_epoch or token > fence.token:
            p.fence = advance(fence, Fence(epoch, token))
        if state == DELETE_FINISHED and len(p) >= COMPACT_AFTER and p.state.count(DELETE_FINISHED) * 2 >= len(p):
            p.compact()
        return ACCEPTED

    def _apply_partition_delete(self, f: tuple) -> ApplyResult:
        broker, epoch, token, _time, tid, partition, state, topic = f
        p = self._partition(tid, partition, topic)
        new = PartitionDeleteState(state)
        reason = fence_rejection(p.fence, Fence(epoch, token), broker) or partition_delete_rejection(
            p.delete_state, new
        )
        if reason:
            return ApplyResult(False, reason)
        p.delete_state = new
        p.fence = advance(p.fence, Fence(epoch, token))
        return ACCEPTED

    def _apply_log_start(self, f: tuple) -> ApplyResult:
        broker, epoch, token, _time, tid, partition, kind, offset, topic = f
        p = self._partition(tid, partition, topic)
        kind = LogStartKind(kind)
        reason = fence_rejection(p.fence, Fence(epoch, token), broker) or log_start_rejection(
            p.log_starts, kind, offset
        )
        if reason:
            return ApplyResult(False, f"{topic}-{partition}: {reason}")
        p.log_starts = apply_log_start(p.log_starts, kind, offset)
        p.fence = advance(p.fence, Fence(epoch, token))
        return ACCEPTED

    def _apply_topic(self, f: tuple) -> ApplyResult:
        _broker, _epoch, _token, event_time, tid, action, local_ms, local_bytes, topic = f
        current = self.topics.get(tid)
        new, reason = apply_topic_action(current[1] if current else None, TopicAction(action), local_ms, local_bytes)
        if reason:
            return ApplyResult(False, f"topic {topic}: {reason}")
        assert new is not None
        self.topics[tid] = (topic, new)
        self.topic_since.setdefault(tid, event_time)
        return ACCEPTED

    def _apply_cluster(self, f: tuple) -> ApplyResult:
        action = TopicAction(f[4])
        c = self.cluster
        if action is TopicAction.PAUSE_UPLOAD:
            c.upload_paused = True
        elif action is TopicAction.RESUME_UPLOAD:
            c.upload_paused = False
        elif action is TopicAction.ROLLBACK:
            c.rolled_back = True
        elif action is TopicAction.ENABLE:
            c.rolled_back = False
        else:
            return ApplyResult(False, f"{action.name} is not a cluster-wide action")
        return ACCEPTED

    # -- queries ----------------------------------------------------------------------------
    def partition(self, topic_id: str, partition: int) -> PartitionSegments | None:
        return self.partitions.get((topic_id_bytes(topic_id), partition))

    def tiering(self, topic_id: str) -> TopicTiering | None:
        """The tiering state of exactly this topic id (None if it was never tiered)."""
        entry = self.topics.get(topic_id_bytes(topic_id))
        return None if entry is None else entry[1]

    def topic(self, name: str) -> tuple[str, TopicTiering] | None:
        """(topic id, tiering state) of the newest topic with this name: if the name was deleted and
        created again, the id whose first tiering record is the latest (then the larger id). Callers
        that know the live topic's id from Kafka use ``tiering(topic_id)`` instead."""
        found = [(self.topic_since.get(tid, -1), tid) for tid, (topic, _) in self.topics.items() if topic == name]
        if not found:
            return None
        tid = max(found)[1]
        return topic_id_str(tid), self.topics[tid][1]

    def segment_count(self) -> int:
        return sum(len(p) for p in self.partitions.values())

    def digest(self) -> dict[str, object]:
        """A canonical, comparable view of the whole state (for replicas, snapshots and tests)."""
        partitions = {}
        for (tid, num), p in sorted(self.partitions.items()):
            partitions[f"{topic_id_str(tid)}/{num}"] = {
                "topic": p.topic,
                "fence": tuple(p.fence),
                "delete_state": None if p.delete_state is None else p.delete_state.name,
                "log_starts": tuple(p.log_starts),
                "segments": [tuple(s) for s in p.segments()],
            }
        return {
            "partitions": partitions,
            "topics": {
                topic_id_str(t): (n, tiering, self.topic_since.get(t))
                for t, (n, tiering) in sorted(self.topics.items())
            },
            "cluster": (self.cluster.upload_paused, self.cluster.rolled_back),
        }
