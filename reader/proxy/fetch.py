"""Fetch through the proxy: partitions below the broker's log start from the remote copies, the rest from
the broker, in one answer, and never a remote byte the broker would not have sent to that client.

``FetchPlan.make`` splits a client's request: a partition whose fetch offset is below the broker's
(cached) log start and inside the remote data is served from remote storage; the others go to the
broker as the client asked them (a fetch offset in a hole that the broker's retention left between the
remote end and its log start is moved to the log start: the records in between are gone, and Kafka
clients accept batches that start after their fetch offset, as after compaction).

Every Fetch goes to the broker, the only authority on who may read what. A remote partition goes in it
as a *probe*: the same topic (name or id) and partition, the client's current leader epoch, at the
broker's cached high watermark with ``partition_max_bytes`` 0, so the broker authenticates the
connection, authorises its principal for READ on the topic, checks that the topic (id) exists and that
it leads the partition, exactly as for the client's own offset, and sends (nearly always) no records. A
remote partition is answered from the copies only when the broker's answer for its probe is NONE or
OFFSET_OUT_OF_RANGE (both mean the request was allowed and the partition is led there); any other error
(TOPIC_AUTHORIZATION_FAILED, UNKNOWN_TOPIC_ID, NOT_LEADER_OR_FOLLOWER, ...) is the client's answer as
the broker gave it. A connection the broker has not authenticated gets no answer at all: the broker
closes it, and the proxy with it. The decision is the broker's answer to this very request; nothing is
cached across requests, connections or principals (docs/design.md, "Remote reads and the broker's
security").

When remote partitions are in the request, the broker is asked not to wait (``max_wait`` 0): the remote
data is there now, and the answer must not sit ``max_wait`` behind the broker's partitions. Fetch
sessions (KIP-227) are declined: every request goes to the broker as a full, sessionless fetch (session id
0, epoch -1), so the broker answers session id 0 and the client keeps sending full requests.

``FetchPlan.merge`` builds the answer: the broker's partitions as it answered them, except
OFFSET_OUT_OF_RANGE for an offset that the remote copies hold (the log start moved past it since the proxy
last saw it), which is served from remote instead; each allowed probe replaced by the remote partition,
with the broker's high watermark and last stable offset, ``log_start_offset`` = the remote start, and the
aborted transactions overlapping the batches (read_committed), so a client filters exactly as the
broker's answer makes it. A remote read that fails (store unreachable, a damaged object) is
KAFKA_STORAGE_ERROR for that partition: retriable, the client fetches the same offset again; nothing is
skipped.
"""

from __future__ import annotations

import dataclasses
import datetime
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from kio.schema.errors import ErrorCode
from kio.static.primitive import i32, i64

from reader.cursor import ServedBatches
from reader.errors import NotInRemote, OffsetOutOfRange, RemoteReadError, WouldBlock
from reader.proxy.fetch_scan import ScannedPartition
from reader.proxy.protocol import build, nested, response_type
from reader.proxy.tiered import TieredView, TopicKey
from tiering_core.kafka_cluster import KafkaClusterError
from tiering_core.logs import get_logger

log = get_logger(__name__)
FETCH = 1
NO_WAIT = datetime.timedelta(0)
# How long a Fetch's remote partitions are read on the event loop (what read-ahead holds: about 0.1-0.2 ms a
# partition, measured) before the rest goes to a remote thread: the loop's latency for every other client
INLINE_READ_SECONDS = 0.002


_ALLOWED = (ErrorCode.none, ErrorCode.offset_out_of_range)  # a probe answered so was authorised and is led there


@dataclass(slots=True)
class RemotePart:
    """One partition the proxy answers from remote storage, once the broker allowed its probe."""

    topic: TopicKey  # the incarnation whose copies are read
    key: Any  # the topic's key in the request and answer: its name (v4-12) or id (v13+)
    partition: int
    offset: int
    max_bytes: int
    probe_at: int = -1  # the offset the broker is asked at (``_probe``)
    settle: bool = False  # read_committed stopped at open transactions: read once the broker told their outcome
    read: bool = False
    answer: Any = None  # the PartitionData once read; None when the broker has the offset now


@dataclass(slots=True)
class FetchPlan:
    version: int
    read_committed: bool
    max_bytes: int
    max_wait_ms: int
    remote: list[RemotePart]
    upstream: Any  # the request for the broker: the client's partitions and a probe per remote one
    offsets: dict[tuple[Any, int], tuple[str, int, int]] = field(default_factory=dict)  # (key, p) -> name, offset, max
    unconfirmed: bool = False  # a partition may be in a hole: make it again with confirm_holes (blocking)
    served_remote: set[tuple[Any, int]] = field(default_factory=set)  # (key, p) answered from the remote copies
    allowed: set[Any] = field(default_factory=set)  # topic keys the broker allowed in its answer to this request
    denied: set[Any] = field(default_factory=set)  # topic keys whose probe the broker refused
    live: dict[str, bool | None] = field(default_factory=dict)  # by name: the cached id confirmed now (``_live``)
    sent: bytes | None = None  # the request sent the broker for it (the probes of a remote lane: remote_lane.py)

    @classmethod
    def make(cls, version: int, request: Any, view: TieredView, confirm_holes: bool = False) -> FetchPlan:
        """The plan; without ``confirm_holes`` it never blocks (run it on the event loop) and says
        ``unconfirmed`` where a hole must be confirmed against the caught-up catalog (run that off the loop)."""
        by_id = version >= 13
        remote: list[RemotePart] = []
        offsets: dict[tuple[Any, int], tuple[str, int, int]] = {}
        unconfirmed = False
        topics = []
        plan = cls(version, int(request.isolation_level) == 1, int(request.max_bytes),
                   int(request.max_wait.total_seconds() * 1000), remote, request, offsets)  # fmt: skip
        for t in request.topics:
            key = t.topic_id if by_id else t.topic
            name = view.topic_name(t.topic_id) if by_id else t.topic
            topic = None if name is None else plan._known(view, key, name)
            keep = []
            for p in t.partitions:
                offset = int(p.fetch_offset)
                if name is not None:
                    offsets[(key, int(p.partition))] = (name, offset, int(p.partition_max_bytes))
                if topic is not None:
                    if view.routes_remote(topic, int(p.partition), offset):
                        settle = plan.read_committed and view.wants_outcomes(topic, int(p.partition))
                        at = view.probe_offset(topic, int(p.partition), settle)
                        remote.append(RemotePart(topic, key, int(p.partition), offset, int(p.partition_max_bytes),
                                                 at, settle))  # fmt: skip
                        keep.append(_probe(p, at))
                        continue
                    if view.maybe_hole(topic, int(p.partition), offset):
                        unconfirmed = unconfirmed or not confirm_holes
                        # by name, the id is confirmed first: never moved along a deleted incarnation's offsets
                        confirmed = confirm_holes and plan._live(view, topic)
                        hole_end = view.hole_end(topic, int(p.partition), offset) if confirmed else None
                        if hole_end is not None:
                            p = dataclasses.replace(p, fetch_offset=i64(hole_end))
                keep.append(p)
            if keep:
                topics.append(dataclasses.replace(t, partitions=tuple(keep)))
        changes: dict[str, Any] = {}
        if hasattr(request, "session_id"):
            changes.update(session_id=i32(0), session_epoch=i32(-1), forgotten_topics_data=())
        if remote:
            changes["max_wait"] = NO_WAIT
        plan.upstream = dataclasses.replace(request, topics=tuple(topics), **changes)
        plan.unconfirmed = unconfirmed
        return plan

    # -- which incarnation -------------------------------------------------------------------------
    def _known(self, view: TieredView, key: Any, name: str) -> TopicKey | None:
        """The incarnation a partition of the request is about: the id it names (v13+), else the name's id
        as last learned (None while unknown: the broker answers, and OFFSET_OUT_OF_RANGE asks the cluster)."""
        return TopicKey(name, key) if self.version >= 13 else view.known_key(name)

    def _live(self, view: TieredView, topic: TopicKey) -> bool | None:
        """Whether ``topic`` is the live incarnation of its name, before its copies are read. A request by id
        (v13+) names it, and the broker's answer to the probe checks that id. By name (v4-12) the learned id
        may be a deleted incarnation's, and the broker's answer cannot tell: the cluster is asked now (once
        per request and name). A name deleted and created again forgets the old incarnation (``learn_name``).
        None: the cluster did not say."""
        if self.version >= 13:
            return True
        if topic.name not in self.live:
            try:
                self.live[topic.name] = view.live_key(topic.name) == topic
            except KafkaClusterError as exc:
                log.warning("the topic's id could not be confirmed; the client retries", topic=topic.name,
                            error=str(exc))  # fmt: skip
                self.live[topic.name] = None
        return self.live[topic.name]

    # -- remote reads (blocking: run off the event loop) ------------------------------------------
    def read_remote(self, view: TieredView, parts: list[RemotePart] | None = None, block: bool = True) -> None:
        """Read the remote partitions (``parts``, else all) not read yet, within the request's ``max_bytes``:
        the first partition with data may return one larger batch (Kafka's rule), the others only what fits.
        Remote partitions come first in an answer (a broker partition that no longer fits is cheap to fetch
        again; a remote one would be read again from the store). A read before the broker answered is
        *speculative*: ``merge`` sends only what the broker allowed; a partition waiting for the broker's word on
        its open transactions (``settle``) is not read speculatively. Without ``block`` (on the event loop) only
        what read-ahead holds in memory now is read, in order, up to the first partition that would wait for
        the store or the cluster, and for at most ``INLINE_READ_SECONDS`` (``ahead_unread``: the rest is read on
        a remote thread), so a Fetch of hundreds of partitions does not hold the loop from other clients."""
        used = self.remote_bytes()
        until = time.perf_counter() + INLINE_READ_SECONDS
        todo = [part for part in (self.remote if parts is None else parts)
                if not part.read and not (parts is None and part.settle)]  # fmt: skip
        if len(todo) > 1 and block:  # the broker's offsets they are answered with: those not cached asked together
            try:
                view.refresh_offsets([(part.topic, part.partition) for part in todo])
            except KafkaClusterError as exc:  # each partition asks again on its own and fails alone
                log.info("asking the broker's offsets failed", partitions=len(todo), error=str(exc))
        for part in todo:
            if not block and self.version < 13 and part.topic.name not in self.live:
                return  # by name, the cluster is asked whether the id is the live one
            if not block and time.perf_counter() > until:
                return
            live = self._live(view, part.topic)
            if live:
                try:
                    answer = self._partition(view, part.topic, part.partition, part.offset,
                                             min(part.max_bytes, self.max_bytes - used), used == 0, block)  # fmt: skip
                except WouldBlock:
                    return
                part.answer = answer
            else:  # another incarnation now (the client asks again, planned on it) or unconfirmed: retriable
                part.answer = None if live is False else _error(_types(self.version)[2], part.partition,
                                                                 ErrorCode.kafka_storage_error)  # fmt: skip
            part.read = True
            if part.answer is not None and part.answer.records:
                used += len(part.answer.records)

    def remote_bytes(self) -> int:
        """Record bytes read from remote for this answer so far."""
        return sum(len(p.answer.records or b"") for p in self.remote if p.answer is not None)

    def limit_upstream(self) -> None:
        """After a speculative read: the broker is asked for what the remote part left of ``max_bytes`` (its
        first partition with data may still return one batch beyond it: ``merge`` drops that one)."""
        left = max(0, self.max_bytes - self.remote_bytes())
        if left < self.max_bytes:
            self.upstream = dataclasses.replace(self.upstream, max_bytes=i32(left))

    @property
    def probes_only(self) -> bool:
        """The broker is asked only probes (every partition of the request is served from remote)."""
        return sum(len(t.partitions) for t in self.upstream.topics) == len(self.remote)

    @property
    def ahead_unread(self) -> bool:
        """Remote partitions ``read_remote`` reads ahead of the broker's answer are still to be read."""
        return any(not part.read and not part.settle for part in self.remote)

    @property
    def unread(self) -> bool:
        """Remote partitions are still to be read (``merge`` would block: run it off the event loop)."""
        return any(not part.read for part in self.remote)

    def _partition(self, view: TieredView, topic: TopicKey, partition: int, offset: int, max_bytes: int,
                   min_one: bool = True, block: bool = True) -> Any:  # fmt: skip
        """The remote answer for one partition: batches from ``offset`` (none when ``max_bytes`` is used up), an
        error, or None where the copies do not hold ``offset`` (the broker has it now). Without ``block``,
        WouldBlock where it would wait for the store or the cluster."""
        data_type = _types(self.version)[2]
        try:
            offsets = view.broker_offsets(topic, partition, block=block)
            if max_bytes > 0 or min_one:
                served = view.read(topic, partition, offset, max(max_bytes, 0), self.read_committed, min_one, block)
                if served.undecided:  # the next fetch asks the broker how they ended (``FetchPlan.make``)
                    view.note_undecided(topic, partition, served.undecided)
            else:  # no room left in this answer: the client fetches the same offset again
                served = ServedBatches(b"", [], offset)
            found = view.remote_range(topic, partition)
        except WouldBlock:
            raise
        except OffsetOutOfRange:
            return _error(data_type, partition, ErrorCode.offset_out_of_range)
        except NotInRemote:
            return None  # the broker has it now: the caller asks it
        except (RemoteReadError, KafkaClusterError) as exc:
            log.warning("remote read failed; the client retries", topic=topic.name, partition=partition,
                        offset=offset, error=str(exc))  # fmt: skip
            return _error(data_type, partition, ErrorCode.kafka_storage_error)
        except Exception as exc:  # the metadata WAL unreadable, a bug: the partition fails, not the connection
            if view.closed:  # the proxy stopped under a read in flight (its download threads are gone)
                log.info("remote read cut short: the proxy is stopping", topic=topic.name, partition=partition,
                         offset=offset, error=str(exc))  # fmt: skip
                return _error(data_type, partition, ErrorCode.kafka_storage_error)
            log.error("remote read failed unexpectedly; the client retries", topic=topic.name, partition=partition,
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
    def out_of_range(self, broker: Any) -> bool:
        """The broker answered OFFSET_OUT_OF_RANGE for a partition of a known topic (the remote copies may
        hold it: ``merge`` then blocks on the catalog, run it off the event loop)."""
        return any(p.error_code == ErrorCode.offset_out_of_range for t in broker.responses for p in t.partitions)

    def observe(self, partitions: Iterable[ScannedPartition], view: TieredView) -> None:
        """Learn the broker's offsets from its answer's partitions (``fetch_scan``): those without error of the
        topics the request named."""
        answered = []
        for p in partitions:
            name = self.offsets.get((p.topic, p.partition), (None, -1, 0))[0]
            topic = None if name is None or p.error_code else self._known(view, p.topic, name)
            if topic is not None:
                answered.append((topic, p.partition, p.log_start_offset, p.high_watermark, p.last_stable_offset))
        view.observe(answered)

    def merge(self, broker: Any, view: TieredView) -> tuple[Any, bool]:
        """The broker's answer with each probe the broker allowed replaced by its remote partition (read now
        if it was not read ahead), every refused probe left as the broker's error, and OFFSET_OUT_OF_RANGE
        partitions the remote copies hold answered from them; learns the broker's offsets. Blocks when
        ``unread`` or ``out_of_range``. Returns (answer, changed)."""
        probes = {(part.key, part.partition): part for part in self.remote}
        if broker.error_code != ErrorCode.none:  # the whole request refused: nothing remote goes out
            self.denied.update(key for key, _ in probes)
            return broker, False
        if not broker.responses and broker.throttle_time.total_seconds() > 0:
            return broker, False  # KIP-219: a throttled client gets the broker's empty answer, nothing else
        allowed = []
        for t in broker.responses:
            key = t.topic_id if self.version >= 13 else t.topic
            for p in t.partitions:
                part = probes.get((key, int(p.partition_index)))
                if part is not None:
                    (self.allowed if p.error_code in _ALLOWED else self.denied).add(key)
                    if p.error_code in _ALLOWED:
                        allowed.append(part)
                    if p.error_code == ErrorCode.none:  # the offsets its remote answer carries: nothing to ask
                        _observe(view, part.topic, p)
                    if part.settle and p.error_code == ErrorCode.none and p.aborted_transactions is not None:
                        listed = [(int(a.producer_id), int(a.first_offset)) for a in p.aborted_transactions]
                        view.learn_outcomes(part.topic, part.partition, part.probe_at, listed)
        self.read_remote(view, allowed)  # remote partitions first: a broker partition is cheap to fetch again
        targets = self._out_of_range_targets(broker, view)
        used = self.remote_bytes()  # what goes out, counted as the partitions are placed
        changed = bool(probes)
        responses = []
        for t in broker.responses:
            key = t.topic_id if self.version >= 13 else t.topic
            parts = []
            for p in t.partitions:
                index = int(p.partition_index)
                part = probes.get((key, index))
                if part is not None:
                    if p.error_code not in _ALLOWED:
                        parts.append(p)  # the broker's refusal is the answer
                        continue
                    if part.answer is not None:
                        parts.append(part.answer)
                        self.served_remote.add((key, index))
                    else:  # the broker has the offset now (or a new incarnation): nothing this time, asked again
                        parts.append(self._nothing(view, part, p))
                    continue
                name, offset, max_bytes = self.offsets.get((key, index), (None, -1, 0))
                if p.records and used > 0 and used + len(p.records) > self.max_bytes:
                    p, changed = dataclasses.replace(p, records=b""), True  # past max_bytes: fetched again
                used += len(p.records or b"")
                if name is None:
                    parts.append(p)
                    continue
                if p.error_code == ErrorCode.none:
                    if (topic := self._known(view, key, name)) is not None:
                        _observe(view, topic, p)
                elif (target := targets.get((key, index))) is not None:
                    served = target if not isinstance(target, TopicKey) else self._partition(
                        view, target, index, offset, min(max_bytes, self.max_bytes - used), used == 0)  # fmt: skip
                    if served is not None:
                        p, changed = served, True
                        used += len(p.records or b"")
                        self.served_remote.add((key, index))
                parts.append(p)
            responses.append(dataclasses.replace(t, partitions=tuple(parts)))
        return dataclasses.replace(broker, responses=tuple(responses)), changed

    def _out_of_range_targets(self, broker: Any, view: TieredView) -> dict[tuple[Any, int], Any]:
        """For each partition of the request the broker answered OFFSET_OUT_OF_RANGE whose offset the remote
        copies hold: the incarnation to read (or an error answer where its id could not be confirmed). The
        broker's offsets of those are refreshed together (its log start moved: learn where to), one
        ListOffsets per leader, not a round trip per partition."""
        targets: dict[tuple[Any, int], Any] = {}
        names: dict[str, TopicKey | None] = {}
        for t in broker.responses:
            key = t.topic_id if self.version >= 13 else t.topic
            for p in t.partitions:
                index = int(p.partition_index)
                if p.error_code == ErrorCode.offset_out_of_range:
                    target = self.out_of_range_target(view, key, index, names)
                    if target is not None:
                        targets[(key, index)] = target
        held = [(topic, index) for (_, index), topic in targets.items() if isinstance(topic, TopicKey)]
        if held:
            try:
                view.refresh_offsets(held, fresh=True)
            except KafkaClusterError as exc:
                log.warning("asking the broker's offsets failed", partitions=len(held), error=str(exc))
        return targets

    def out_of_range_target(self, view: TieredView, key: Any, index: int, names: dict[str, TopicKey | None]) -> Any:
        """For a partition of the request the broker answered OFFSET_OUT_OF_RANGE: the incarnation whose remote
        copies hold its offset, an error answer where its id could not be confirmed (retriable), or None (the
        broker's answer stands). ``names``: the live incarnations asked so far in this answer. Blocks (the
        catalog; by name, the cluster)."""
        name, offset, _ = self.offsets.get((key, index), (None, -1, 0))
        if name is None or any(part.key == key and part.partition == index for part in self.remote):
            return None
        topic: TopicKey | None
        if self.version >= 13:
            topic = TopicKey(name, key)  # the broker's OFFSET_OUT_OF_RANGE: a live id
        elif name in names:
            topic = names[name]
        else:
            try:  # by name: the live incarnation, asked of the cluster (the learned id may be a deleted one's)
                topic = names[name] = view.live_key(name)
            except KafkaClusterError as exc:
                log.warning("the topic's id could not be confirmed; the client retries", topic=name, error=str(exc))
                return _error(_types(self.version)[2], index, ErrorCode.kafka_storage_error)
        return topic if topic is not None and _holds(view, topic, index, offset) else None

    def _nothing(self, view: TieredView, part: RemotePart, probe: Any) -> Any:
        """A remote partition answered with no records and no error (a full answer names every partition the
        client asked: Java's FetchSessionHandler drops one that does not): the broker's offsets from the probe,
        else the cached ones."""
        if probe.error_code == ErrorCode.none:
            return dataclasses.replace(probe, records=b"", aborted_transactions=None)
        known = view.known_offsets(part.topic, part.partition)
        log_start, high, stable = (known.log_start, known.high_watermark, known.last_stable) if known else (-1, -1, -1)
        return build(_types(self.version)[2], partition_index=i32(part.partition), error_code=ErrorCode.none,
                     high_watermark=i64(high), last_stable_offset=i64(stable), log_start_offset=i64(log_start),
                     aborted_transactions=None, preferred_read_replica=i32(-1), records=b"")  # fmt: skip

    def empty(self, answer: Any) -> bool:
        return not any(p.records or p.error_code != ErrorCode.none for t in answer.responses for p in t.partitions)


def _probe(p: Any, offset: int) -> Any:
    """A remote partition as the broker is asked it: the same topic, partition and current leader epoch, at
    ``offset`` (the broker's cached high watermark, where it has nothing to send) with no room for records."""
    changes: dict[str, Any] = {"fetch_offset": i64(offset), "partition_max_bytes": i32(0)}
    if hasattr(p, "last_fetched_epoch"):
        changes["last_fetched_epoch"] = i32(-1)  # no divergence check against an offset the client did not ask
    return dataclasses.replace(p, **changes)


def _holds(view: TieredView, topic: TopicKey, partition: int, offset: int) -> bool:
    """Whether the remote copies hold ``offset`` (asked again of the caught-up catalog before saying no: a
    copy may be newer than the catalog)."""
    for current in (False, True):
        found = view.remote_range(topic, partition, current=current)
        if found is not None and found[0] <= offset <= found[1]:
            return True
    return False


def _observe(view: TieredView, topic: TopicKey, p: Any) -> None:
    view.observe([(topic, int(p.partition_index), int(getattr(p, "log_start_offset", -1)), int(p.high_watermark),
                   int(p.last_stable_offset))])  # fmt: skip


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
