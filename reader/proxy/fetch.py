"""Fetch through the proxy: partitions below the broker's log start from the remote copies, the rest from
the broker, in one answer.

``FetchPlan.make`` splits a client's request: a partition whose fetch offset is below the broker's
(cached) log start and inside the remote data is served from remote storage; the others go to the
broker in a request that keeps everything else of the client's (a fetch offset in a hole that the
broker's retention left between the remote end and its log start is moved to the log start: the
records in between are gone, and Kafka clients accept batches that start after their fetch offset, as
after compaction). When remote partitions are in the request, the broker is asked not to wait
(``max_wait`` 0): the remote data is there now, and the answer must not sit ``max_wait`` behind the
broker's partitions. Fetch sessions (KIP-227) are declined: every request goes to the broker as a full,
sessionless fetch (session id 0, epoch -1), so the broker answers session id 0 and the client keeps
sending full requests; nothing depends on session state the proxy would have to patch.

``FetchPlan.answer`` merges: the broker's partitions as it answered them, except OFFSET_OUT_OF_RANGE for
an offset that the remote copies hold (the log start moved past it since the proxy last saw it),
which is served from remote instead; the remote partitions with the broker's high watermark and last
stable offset, ``log_start_offset`` = the remote start, and the aborted transactions overlapping the
batches (read_committed), so a client filters exactly as the broker's answer makes it. A remote read
that fails (store unreachable, a damaged object) is KAFKA_STORAGE_ERROR for that partition: retriable,
the client fetches the same offset again; nothing is skipped.
"""

from __future__ import annotations

import dataclasses
import datetime
from dataclasses import dataclass, field
from typing import Any

from kio.schema.errors import ErrorCode
from kio.static.primitive import i32, i64

from reader.errors import NotInRemote, OffsetOutOfRange, RemoteReadError
from reader.proxy.protocol import build, nested, response_type
from reader.proxy.tiered import TieredView
from tiering_core.kafka_cluster import KafkaClusterError
from tiering_core.logs import get_logger

log = get_logger(__name__)
FETCH = 1
NO_WAIT = datetime.timedelta(0)


@dataclass(slots=True)
class RemotePart:
    """One partition the proxy answers from remote storage."""

    topic: str
    key: Any  # the topic's key in the request and answer: its name (v4-12) or id (v13+)
    partition: int
    offset: int
    max_bytes: int
    answer: Any = None  # the PartitionData, once read


@dataclass(slots=True)
class FetchPlan:
    version: int
    read_committed: bool
    max_bytes: int
    max_wait_ms: int
    remote: list[RemotePart]
    upstream: Any | None  # the request for the broker, None when every partition is remote
    offsets: dict[tuple[Any, int], tuple[str, int, int]] = field(default_factory=dict)  # (key, p) -> name, offset, max
    unconfirmed: bool = False  # a partition may be in a hole: make it again with confirm_holes (blocking)
    served_remote: set[tuple[Any, int]] = field(default_factory=set)  # (key, p) the broker sent out of range

    @classmethod
    def make(cls, version: int, request: Any, view: TieredView, confirm_holes: bool = False) -> FetchPlan:
        """The plan; without ``confirm_holes`` it never blocks (run it on the event loop) and says
        ``unconfirmed`` where a hole must be confirmed against the caught-up catalog (run that off the loop)."""
        by_id = version >= 13
        remote: list[RemotePart] = []
        offsets: dict[tuple[Any, int], tuple[str, int, int]] = {}
        unconfirmed = False
        topics = []
        for t in request.topics:
            key = t.topic_id if by_id else t.topic
            name = view.topic_name(t.topic_id) if by_id else t.topic
            keep = []
            for p in t.partitions:
                offset = int(p.fetch_offset)
                if name is not None:
                    offsets[(key, int(p.partition))] = (name, offset, int(p.partition_max_bytes))
                    if view.routes_remote(name, int(p.partition), offset):
                        remote.append(RemotePart(name, key, int(p.partition), offset, int(p.partition_max_bytes)))
                        continue
                    if view.maybe_hole(name, int(p.partition), offset):
                        if not confirm_holes:
                            unconfirmed = True
                        elif (hole_end := view.hole_end(name, int(p.partition), offset)) is not None:
                            p = dataclasses.replace(p, fetch_offset=i64(hole_end))
                keep.append(p)
            if keep:
                topics.append(dataclasses.replace(t, partitions=tuple(keep)))
        changes: dict[str, Any] = {}
        if hasattr(request, "session_id"):
            changes.update(session_id=i32(0), session_epoch=i32(-1), forgotten_topics_data=())
        if remote:
            changes["max_wait"] = NO_WAIT
        upstream = dataclasses.replace(request, topics=tuple(topics), **changes) if topics else None
        return cls(version, int(request.isolation_level) == 1, int(request.max_bytes),
                   int(request.max_wait.total_seconds() * 1000), remote, upstream, offsets, unconfirmed)  # fmt: skip

    @property
    def upstream_changed(self) -> bool:
        return bool(self.remote) or self.upstream is None

    # -- remote reads (blocking: run off the event loop) ------------------------------------------
    def read_remote(self, view: TieredView) -> None:
        budget = self.max_bytes
        for part in self.remote:
            part.answer = self._partition(view, part.topic, part.partition, part.offset,
                                          min(part.max_bytes, max(budget, 1)))  # fmt: skip
            records = part.answer.records
            budget -= len(records) if records else 0

    def _partition(self, view: TieredView, topic: str, partition: int, offset: int, max_bytes: int) -> Any:
        data_type = _types(self.version)[2]
        try:
            offsets = view.broker_offsets(topic, partition)
            served = view.read(topic, partition, offset, max_bytes, self.read_committed)
            found = view.remote_range(topic, partition)
        except OffsetOutOfRange:
            return _error(data_type, partition, ErrorCode.offset_out_of_range)
        except NotInRemote:
            return None  # the broker has it now: the caller asks it
        except (RemoteReadError, KafkaClusterError) as exc:
            log.warning("remote read failed; the client retries", topic=topic, partition=partition, offset=offset,
                        error=str(exc))  # fmt: skip
            return _error(data_type, partition, ErrorCode.kafka_storage_error)
        except Exception as exc:  # the metadata WAL unreadable, a bug: the partition fails, not the connection
            log.error("remote read failed unexpectedly; the client retries", topic=topic, partition=partition,
                      offset=offset, error=str(exc), exc_info=True)  # fmt: skip
            return _error(data_type, partition, ErrorCode.kafka_storage_error)
        aborted = None
        if self.read_committed:
            txn_type = _types(self.version)[3]
            aborted = tuple(build(txn_type, producer_id=i64(a.producer_id), first_offset=i64(a.first_offset))
                            for a in served.aborted)  # fmt: skip
        return build(
            data_type, partition_index=i32(partition), error_code=ErrorCode.none,
            high_watermark=i64(offsets.high_watermark), last_stable_offset=i64(offsets.last_stable),
            log_start_offset=i64(found[0] if found else offsets.log_start), aborted_transactions=aborted,
            preferred_read_replica=i32(-1), records=served.data,
        )  # fmt: skip

    # -- the answer ------------------------------------------------------------------------------
    def local_answer(self) -> Any:
        """The whole answer from remote reads only (no broker partition in the request)."""
        response, topic_type, _, _ = _types(self.version)
        return build(response, throttle_time=NO_WAIT, error_code=ErrorCode.none, session_id=i32(0),
                     responses=self._remote_topics(topic_type), node_endpoints=())  # fmt: skip

    def out_of_range(self, broker: Any) -> bool:
        """The broker answered OFFSET_OUT_OF_RANGE for a partition of a known topic (the remote copies may
        hold it: ``merge`` then blocks on the catalog, run it off the event loop)."""
        return any(p.error_code == ErrorCode.offset_out_of_range for t in broker.responses for p in t.partitions)

    def observe(self, broker: Any, view: TieredView) -> None:
        """Learn the broker's offsets from its answer (all ``merge`` does when nothing changes)."""
        for t in broker.responses:
            key = t.topic_id if self.version >= 13 else t.topic
            for p in t.partitions:
                name = self.offsets.get((key, int(p.partition_index)), (None, -1, 0))[0]
                if name is not None and p.error_code == ErrorCode.none:
                    view.observe(name, int(p.partition_index), int(getattr(p, "log_start_offset", -1)),
                                 int(p.high_watermark), int(p.last_stable_offset))  # fmt: skip

    def merge(self, broker: Any, view: TieredView) -> tuple[Any, bool]:
        """The broker's answer with the remote partitions added and OFFSET_OUT_OF_RANGE partitions the
        remote copies hold answered from them; learns the broker's offsets. Returns (answer, changed)."""
        _, topic_type, _, _ = _types(self.version)
        changed = bool(self.remote)
        responses = []
        for t in broker.responses:
            key = t.topic_id if self.version >= 13 else t.topic
            parts = []
            for p in t.partitions:
                name, offset, max_bytes = self.offsets.get((key, int(p.partition_index)), (None, -1, 0))
                if name is None:
                    parts.append(p)
                    continue
                if p.error_code == ErrorCode.none:
                    view.observe(name, int(p.partition_index), int(getattr(p, "log_start_offset", -1)),
                                 int(p.high_watermark), int(p.last_stable_offset))  # fmt: skip
                elif p.error_code == ErrorCode.offset_out_of_range:
                    served = self._out_of_range(view, name, int(p.partition_index), offset, max_bytes)
                    if served is not None:
                        p, changed = served, True
                        self.served_remote.add((key, int(p.partition_index)))
                parts.append(p)
            responses.append(dataclasses.replace(t, partitions=tuple(parts)))
        if self.remote:
            responses += self._remote_topics(topic_type)
        return dataclasses.replace(broker, responses=tuple(responses)), changed

    def _out_of_range(self, view: TieredView, topic: str, partition: int, offset: int, max_bytes: int) -> Any | None:
        found = view.remote_range(topic, partition)
        if found is None or not found[0] <= offset <= found[1]:
            found = view.remote_range(topic, partition, current=True)  # the copy may be newer than the catalog
        if found is None or not found[0] <= offset <= found[1]:
            return None
        try:
            view.broker_offsets(topic, partition, fresh=True)  # the log start moved: learn where to
        except KafkaClusterError as exc:
            log.warning("asking the broker's offsets failed", topic=topic, partition=partition, error=str(exc))
        return self._partition(view, topic, partition, offset, min(max_bytes, self.max_bytes))

    def _remote_topics(self, topic_type: type) -> list[Any]:
        grouped: dict[Any, list[Any]] = {}
        for part in self.remote:
            if part.answer is not None:
                grouped.setdefault(part.key, []).append(part.answer)
        key_field = "topic_id" if self.version >= 13 else "topic"
        return [build(topic_type, **{key_field: key}, partitions=tuple(parts)) for key, parts in grouped.items()]

    def empty(self, answer: Any) -> bool:
        return not any(p.records or p.error_code != ErrorCode.none for t in answer.responses for p in t.partitions)


def _error(data_type: type, partition: int, code: ErrorCode) -> Any:
    return build(data_type, partition_index=i32(partition), error_code=code, high_watermark=i64(-1),
                 last_stable_offset=i64(-1), log_start_offset=i64(-1), aborted_transactions=None,
                 preferred_read_replica=i32(-1), records=None)  # fmt: skip


def _types(version: int) -> tuple[type, type, type, type]:
    """FetchResponse, its topic, partition and aborted-transaction types at ``version``."""
    response = response_type(FETCH, version)
    topic = nested(response, "responses")
    data = nested(topic, "partitions")
    return response, topic, data, nested(data, "aborted_transactions")
