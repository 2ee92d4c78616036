"""``TieredConsumer``: ``confluent_kafka.Consumer``'s interface over remote copies and the broker.

A real ``confluent_kafka.Consumer`` (the *inner* one) does everything the broker serves: group
membership, rebalances, commits, and records at or above the broker's log start (Lx). Offsets below
Lx are read from the remote copies (``PartitionStream``), while the inner consumer keeps that
partition paused. When the remote data ends at offset H (the remote end Ry + 1, always >= Lx: the
sidecar deletes locally only what is remote), the inner consumer is sought to exactly H and resumed:
no gap, no duplicate. If the broker's log start later passes the position of a partition being
read from the broker (local retention moved the boundary under a slow reader), the inner consumer,
configured with ``auto.offset.reset=error``, reports it and the partition goes back to remote at the
same position. Broker records below a partition's position are dropped, so a hand-over can never
deliver one twice.

Group membership: eager strategies (``range``, ``roundrobin``) replace the whole assignment at each
rebalance, ``cooperative-sticky`` (and ``group.protocol=consumer``) add and revoke partitions
incrementally; ``on_assign``/``on_revoke``/``on_lost`` get this consumer, and may call ``assign`` /
``incremental_assign`` / ``unassign`` / ``incremental_unassign`` themselves. librdkafka keeps a
partition's pause across unassign and assign (only its own rebalance pause is cleared), so every
assignment sets the inner consumer's pause of each partition explicitly: paused while remote or paused by
the user, resumed otherwise (a partition paused while remote and assigned again on the broker stayed
silent). A paused partition is not paused any more once revoked and assigned again, as in Kafka's Java
client. Where librdkafka refuses a seek (no fetcher: after an offset reset error, or not started yet),
the partition is assigned to the inner consumer again at that offset (incrementally, or under an eager
protocol the whole assignment, the other partitions at their positions).

Semantics kept from Kafka: positions and commits are "next offset to read"; ``auto.offset.reset``
earliest means the remote start (Rx), latest the broker's end, anything else an error event
(``_AUTO_OFFSET_RESET``, as librdkafka reports OffsetOutOfRange); ``isolation.level`` (librdkafka's
default read_committed) drops aborted transactions and never delivers control batches, as the
broker does; auto commit (``enable.auto.commit``, ``auto.commit.interval.ms``) commits delivered
positions, also synchronously when revoked partitions are unassigned (not lost ones, as librdkafka).
Remote read errors are delivered as error events naming the object key (``_BAD_MSG`` corrupt,
``KAFKA_STORAGE_ERROR`` missing, ``_TRANSPORT`` store unreachable) and the partition retries after
``RETRY_SECONDS``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    OFFSET_INVALID,
    Consumer,
    KafkaError,
    KafkaException,
    TopicPartition,
)

from reader.config import ReaderSettings, load_reader_settings
from reader.errors import (
    NotInRemote,
    OffsetOutOfRange,
    RemoteDataCorrupt,
    RemoteObjectMissing,
    RemoteReadError,
    RemoteUnavailable,
)
from reader.messages import TieredEvent, TieredMessage, message_class
from reader.remote import RemoteReader
from reader.stream import PartitionStream
from tiering_core.kafka_cluster import KafkaClusterError
from tiering_core.logs import get_logger

log = get_logger(__name__)
RETRY_SECONDS = 1.0
STATS_INTERVAL_MS = 10_000  # librdkafka's statistics, for describe() (unless the config sets an interval)
_EARLIEST = {"smallest", "earliest", "beginning"}
_LATEST = {"largest", "latest", "end"}
_TRUE = {"true", "1", "yes"}
_SECURITY = ("security.", "sasl.", "ssl.")  # the librdkafka properties a catalog needs to connect as the consumer does
_LEAVE_S = 10.0  # close: how long the revocation after unsubscribe may take before the inner close goes ahead
Callback = Callable[[Any, list[TopicPartition]], None]


class _Partition:
    __slots__ = ("next", "paused", "pending", "position", "problem", "retry_at", "start", "stream", "topic", "tp")

    def __init__(self, topic: str, partition: int) -> None:
        self.topic = topic
        self.tp = (topic, partition)
        self.position: int | None = None  # next offset to deliver; None: wherever the broker starts
        self.start = OFFSET_INVALID  # the offset it was assigned at (may be logical: OFFSET_END...)
        self.stream: PartitionStream | None = None  # set while reading remote data
        self.pending: list[TieredMessage] = []  # decoded, not delivered yet: pending[next:]
        self.next = 0
        self.paused = False
        self.retry_at = 0.0
        self.problem: tuple[float, str] | None = None  # the last thing that held it up (monotonic time, what)


def _error_for(exc: RemoteReadError) -> KafkaError:
    if isinstance(exc, OffsetOutOfRange):
        return KafkaError(KafkaError._AUTO_OFFSET_RESET, f"Offset out of range: {exc}")
    if isinstance(exc, RemoteDataCorrupt):
        return KafkaError(KafkaError._BAD_MSG, str(exc))
    if isinstance(exc, RemoteObjectMissing):
        return KafkaError(KafkaError.KAFKA_STORAGE_ERROR, str(exc))
    if isinstance(exc, RemoteUnavailable):
        return KafkaError(KafkaError._TRANSPORT, str(exc), retriable=True)
    return KafkaError(KafkaError._FAIL, str(exc))


def _stream_state(stream: PartitionStream) -> dict[str, Any]:
    """A remote partition's stream for ``TieredConsumer.describe``."""
    copy = stream.copy
    return {
        "position": stream.position,
        "copy": None if copy is None else [copy.base_offset, copy.end_offset],
        "blocked_at": stream.blocked_at,
        "download_paused": stream.download_paused,
    }


class TieredConsumer:
    """Drop-in for ``confluent_kafka.Consumer(config)``; ``settings`` say where the remote copies are
    (default: ``TIERING_*`` env vars, with ``bootstrap.servers`` from ``config``). Not thread-safe, like
    the consumer it stands for: call it from one thread."""

    def __init__(self, config: dict[str, Any], settings: ReaderSettings | None = None, *,
                 reader: RemoteReader | None = None) -> None:  # fmt: skip
        config = dict(config)
        self._reset = str(config.pop("auto.offset.reset", "largest")).lower()
        self._auto_commit = str(config.pop("enable.auto.commit", True)).lower() in _TRUE
        self._auto_commit_s = int(config.pop("auto.commit.interval.ms", 5000)) / 1000
        self._auto_store = str(config.pop("enable.auto.offset.store", True)).lower() in _TRUE
        self._read_committed = str(config.get("isolation.level", "read_committed")) == "read_committed"
        # librdkafka refuses assign() under these and incremental_assign() under eager strategies
        self._incremental = "cooperative" in str(config.get("partition.assignment.strategy", "")) or (
            str(config.get("group.protocol", "classic")).lower() == "consumer"
        )
        inner = {**config, "auto.offset.reset": "error", "enable.auto.commit": False, "enable.auto.offset.store": False}
        self._user_stats_cb: Callable[[str], None] | None = inner.pop("stats_cb", None)
        inner.setdefault("statistics.interval.ms", STATS_INTERVAL_MS)
        self._stats: tuple[float, str] | None = None  # librdkafka's last statistics (monotonic time, JSON)
        self._inner = Consumer({**inner, "stats_cb": self._keep_stats})
        if reader is None:
            security = {k: v for k, v in config.items() if k.startswith(_SECURITY)}  # the catalog connects as well
            overrides = {"kafka_client": security} if security else {}
            settings = settings or load_reader_settings(bootstrap_servers=config["bootstrap.servers"], **overrides)
            reader = RemoteReader.open(settings, [])
            self._owns_reader = True
        else:
            self._owns_reader = False
        self._reader = reader
        self._catalog = reader.catalog
        self._parts: dict[tuple[str, int], _Partition] = {}
        self._stored: dict[tuple[str, int], int] = {}
        self._next_commit = time.monotonic() + self._auto_commit_s
        self._rotation = 0
        self._subscribed = False
        self._in_rebalance = False
        self._assigned_in_callback = False
        self._commit_on_unassign = False
        self._closing = False  # close() has begun: assignments served while leaving are not set up
        self._closed = False

    # -- assignment -----------------------------------------------------------------------------
    def subscribe(self, topics: list[str], on_assign: Callback | None = None, on_revoke: Callback | None = None,
                  on_lost: Callback | None = None) -> None:  # fmt: skip
        """Join the group for ``topics`` (names; regular expressions are not supported)."""
        if any(t.startswith("^") for t in topics):
            raise ValueError("TieredConsumer.subscribe takes topic names, not regular expressions")
        self._catalog.watch(topics)

        def assigned(_consumer: Consumer, partitions: list[TopicPartition]) -> None:
            if self._closing:  # an assignment served while leaving the group: nothing is read any more (asking
                return  # the committed offsets then fails with _DESTROY); confluent-kafka assigns as it must
            self._rebalance(on_assign, partitions, self.incremental_assign if self._incremental else self.assign)

        def revoked(_consumer: Consumer, partitions: list[TopicPartition]) -> None:
            self._rebalance(on_revoke, partitions, self._unassign_revoked, commit=self._auto_commit)

        def lost(_consumer: Consumer, partitions: list[TopicPartition]) -> None:
            self._rebalance(on_lost or on_revoke, partitions, self._unassign_revoked)

        self._inner.subscribe(topics, on_assign=assigned, on_revoke=revoked, on_lost=lost)
        self._subscribed = True

    def _rebalance(self, callback: Callback | None, partitions: list[TopicPartition],
                   default: Callable[[list[TopicPartition]], None], commit: bool = False) -> None:  # fmt: skip
        """Run the user's rebalance callback; ``default`` changes the assignment unless the callback did. With
        ``commit``, positions are committed when the revoked partitions are unassigned (also by the callback)."""
        self._in_rebalance, self._assigned_in_callback, self._commit_on_unassign = True, False, commit
        try:
            if callback is not None:
                callback(self, partitions)
            if not self._assigned_in_callback:
                default(partitions)
        finally:
            self._in_rebalance = self._commit_on_unassign = False

    def _unassign_revoked(self, partitions: list[TopicPartition]) -> None:
        if self._incremental:
            self.incremental_unassign(partitions)
        else:
            self.unassign()

    def unsubscribe(self) -> None:
        self._inner.unsubscribe()
        self._subscribed = False
        self._forget(list(self._parts_as_tps()))

    def assign(self, partitions: list[TopicPartition]) -> None:
        """Read exactly these partitions from their offsets (OFFSET_INVALID/STORED: the committed offset,
        else ``auto.offset.reset``). Replaces the current assignment."""
        self._assignment_changed()
        keys = {(tp.topic, tp.partition) for tp in partitions}
        self._drop([tp for tp in self._parts_as_tps() if (tp.topic, tp.partition) not in keys])
        self._inner.assign(self._set_up(partitions))
        self._match_pauses(list(self._parts))

    def incremental_assign(self, partitions: list[TopicPartition]) -> None:
        """Add these partitions, read from their offsets as ``assign`` does."""
        self._assignment_changed()
        self._inner.incremental_assign(self._set_up(partitions))
        self._match_pauses([(tp.topic, tp.partition) for tp in partitions])

    def unassign(self) -> None:
        self._assignment_changed()
        self._drop(list(self._parts_as_tps()))
        self._inner.unassign()

    def incremental_unassign(self, partitions: list[TopicPartition]) -> None:
        self._assignment_changed()
        self._drop(partitions)
        self._inner.incremental_unassign([TopicPartition(tp.topic, tp.partition) for tp in partitions])

    def _assignment_changed(self) -> None:
        if self._in_rebalance:
            self._assigned_in_callback = True

    def _set_up(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        """Start reading ``partitions`` (from remote below the broker's log start); what the inner consumer
        is assigned: each partition at its start, a remote one at the log start (kept paused until the
        hand-over seeks it)."""
        self._catalog.watch({tp.topic for tp in partitions})
        starts = self._start_positions(partitions)
        log_starts = self._catalog.cluster.log_start_offsets(list(starts))
        inner_tps = []
        for key, start in starts.items():
            part = self._parts.get(key) or _Partition(*key)
            self._parts[key] = part
            self._close_stream(part)
            part.position = start if start >= 0 else None
            part.start = start
            if start >= 0 and start < log_starts[key]:
                self._go_remote(part, start)
                inner_tps.append(TopicPartition(*key, log_starts[key]))
            else:
                inner_tps.append(TopicPartition(*key, start))
        return inner_tps

    def _match_pauses(self, keys: list[tuple[str, int]]) -> None:
        """Pause these partitions in the inner consumer when read from remote or paused by the user, resume
        the others: librdkafka keeps a pause across unassign and assign, whatever the partition is now."""
        paused, fetching = [], []
        for key in keys:
            part = self._parts[key]
            (paused if part.stream is not None or part.paused else fetching).append(TopicPartition(*key))
        if paused:
            self._inner.pause(paused)
        if fetching:
            self._inner.resume(fetching)

    def assignment(self) -> list[TopicPartition]:
        return self._inner.assignment()

    def _parts_as_tps(self) -> list[TopicPartition]:
        return [TopicPartition(*k) for k in self._parts]

    def _drop(self, partitions: list[TopicPartition]) -> None:
        """Stop reading ``partitions``; in a revoke with auto commit, commit their positions first."""
        if self._commit_on_unassign:
            self._commit_positions(asynchronous=False, only={(tp.topic, tp.partition) for tp in partitions})
        self._forget(partitions)

    def _forget(self, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            part = self._parts.pop((tp.topic, tp.partition), None)
            if part is not None:
                self._close_stream(part)
            self._stored.pop((tp.topic, tp.partition), None)

    def _start_positions(self, partitions: list[TopicPartition]) -> dict[tuple[str, int], int]:
        """The first offset to read of each partition (OFFSET_END: the broker's end)."""
        starts: dict[tuple[str, int], int] = {}
        stored = [tp for tp in partitions if tp.offset < 0 and tp.offset not in (OFFSET_BEGINNING, OFFSET_END)]
        committed = {(tp.topic, tp.partition): tp.offset for tp in self._inner.committed(stored)} if stored else {}
        for tp in partitions:
            key = (tp.topic, tp.partition)
            offset = committed.get(key, tp.offset)
            if offset == OFFSET_BEGINNING or (offset < 0 and offset != OFFSET_END and self._reset in _EARLIEST):
                offset = self._earliest(*key)
            elif offset < 0 and offset != OFFSET_END and self._reset in _LATEST:
                offset = OFFSET_END  # else (no committed offset, reset=error): the inner consumer reports it
            starts[key] = offset
        return starts

    def _earliest(self, topic: str, partition: int) -> int:
        """The remote start (Rx) when the partition has remote data below the broker's log start."""
        lx = self._catalog.cluster.log_start_offsets([(topic, partition)])[(topic, partition)]
        rx, _ = self._catalog.remote_offsets(topic, partition)
        return lx if rx is None else min(rx, lx)

    # -- remote <-> broker ----------------------------------------------------------------------
    def _go_remote(self, part: _Partition, offset: int) -> None:
        part.position = offset
        topic, partition = part.tp
        part.stream = PartitionStream(self._reader, topic, partition, offset, read_committed=self._read_committed,
                                      record_class=lambda h: message_class(topic, partition, h))  # fmt: skip

    def _close_stream(self, part: _Partition) -> None:
        if part.stream is not None:
            part.stream.close()
            part.stream = None
        part.pending, part.next = [], 0

    def _broker_log_start(self, part: _Partition) -> int | None:
        """The broker's log start offset of the partition, or None when Kafka did not answer it now: while
        leadership moves (a reassignment, a broker restart) ListOffsets answers NOT_LEADER_OR_FOLLOWER or
        FENCED_LEADER_EPOCH until the client's metadata catches up. Then the partition stays where it is and
        asks again after ``RETRY_SECONDS``, as librdkafka hides a leader change from its consumer."""
        try:
            return self._catalog.cluster.log_start_offsets([part.tp])[part.tp]
        except KafkaClusterError as exc:
            log.info("broker's log start unknown; asking again", topic=part.tp[0], partition=part.tp[1],
                     error=str(exc))  # fmt: skip
            part.retry_at = time.monotonic() + RETRY_SECONDS
            part.problem = (time.monotonic(), f"broker's log start unknown: {exc}")
            return None

    def _hand_over(self, part: _Partition, offset: int, out: list) -> None:
        """The remote data ends at ``offset``: continue from the broker there, if it still has it."""
        lx = self._broker_log_start(part)
        if lx is None:
            return
        if offset < lx:  # nothing holds [offset, lx): a hole, or data deleted meanwhile
            exc = OffsetOutOfRange(part.tp[0], part.tp[1], offset, self._catalog.remote_offsets(*part.tp)[0], lx)
            if self._reset not in _EARLIEST:
                out.append(TieredEvent(*part.tp, offset, _error_for(exc)))
                part.retry_at = time.monotonic() + RETRY_SECONDS
                part.problem = (time.monotonic(), f"hand-over refused: {exc}")
                return
            log.warning("offsets missing from remote and broker skipped", error=str(exc))
            offset = lx
        self._close_stream(part)
        part.position = offset
        self._reposition(TopicPartition(*part.tp, offset), resume=not part.paused)
        log.info("handed over to the broker", topic=part.tp[0], partition=part.tp[1], offset=offset)

    def _reposition(self, tp: TopicPartition, resume: bool) -> None:
        """Make the inner consumer fetch ``tp`` from its offset, resumed or left paused (after an
        offset-reset error, seek is refused: the partition is re-assigned instead).

        The resume comes before the seek: librdkafka's fetcher, told of a seek while the partition is
        paused, sleeps up to a second before it sees the resume (measured: a one second stall at every
        hand-over). What it fetches between the two is discarded by the seek's version barrier.
        """
        if resume:
            self._inner.resume([TopicPartition(tp.topic, tp.partition)])
        try:
            self._inner.seek(tp)
        except KafkaException as exc:
            log.info("seek refused; assigning the partition again", topic=tp.topic, partition=tp.partition,
                     offset=tp.offset, error=str(exc))  # fmt: skip
            self._reassign(tp)

    def _reassign(self, tp: TopicPartition) -> None:
        """Assign ``tp`` to the inner consumer again at its offset: librdkafka refuses a seek where the
        partition has no fetcher (stopped by an offset reset error, or not started yet). An eager group
        protocol takes only whole assignments: then every partition is assigned again, the others where
        they are (broker ones at their positions, remote ones paused)."""
        key = (tp.topic, tp.partition)
        if self._incremental or not self._subscribed:
            self._inner.incremental_unassign([TopicPartition(*key)])
            self._inner.incremental_assign([tp])
            self._match_pauses([key])
            return
        self._sync_broker_positions()
        whole = [tp if k == key else TopicPartition(*k, p.start if p.position is None else p.position)
                 for k, p in self._parts.items()]  # fmt: skip
        self._inner.assign(whole)
        self._match_pauses(list(self._parts))

    # -- consuming ------------------------------------------------------------------------------
    def poll(self, timeout: float | None = None) -> TieredMessage | Any | None:
        """One message or event, or None after ``timeout`` seconds (None/negative: wait indefinitely)."""
        got = self.consume(1, -1 if timeout is None else timeout)
        return got[0] if got else None

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list:
        """Up to ``num_messages`` messages or events, waiting at most ``timeout`` seconds for the first."""
        if self._closed:
            raise RuntimeError("Consumer closed")
        deadline = float("inf") if timeout is None or timeout < 0 else time.monotonic() + timeout
        out: list = []
        while True:
            remote_waiting = self._take_remote(
                out, num_messages, 0.0 if out else min(0.05, max(0.0, deadline - time.monotonic()))
            )
            if len(out) < num_messages:
                wait = 0.0 if out or remote_waiting else min(0.2, max(0.0, deadline - time.monotonic()))
                self._take_broker(self._inner.consume(num_messages - len(out), wait), out)
            if self._auto_commit and time.monotonic() >= self._next_commit:
                self._commit_positions(asynchronous=True)
            if out or time.monotonic() >= deadline:
                return out

    def _take_remote(self, out: list, limit: int, wait: float) -> bool:
        """Move remote messages into ``out``; True while some remote partition is still downloading."""
        parts = [p for p in self._parts.values() if p.stream is not None and not p.paused]
        if not parts:
            return False
        now = time.monotonic()
        self._rotation = (self._rotation + 1) % len(parts)
        waiting = False
        for part in parts[self._rotation :] + parts[: self._rotation]:
            if len(out) >= limit:
                break
            if part.retry_at > now:
                continue
            if part.next >= len(part.pending):
                waiting |= self._refill(part, out, wait)
                wait = 0.0
            pending, start = part.pending, part.next
            take = pending[start : start + limit - len(out)]
            if take:
                out.extend(take)
                part.next = start + len(take)
                part.position = take[-1][0] + 1
            if part.next >= len(pending) and part.stream is not None:
                part.position = max(part.position or 0, part.stream.position)
        return waiting

    def _refill(self, part: _Partition, out: list, wait: float) -> bool:
        """Decode the next window of ``part`` into its pending messages; handle the end of remote data."""
        stream = part.stream
        assert stream is not None
        try:
            batches = stream.read(wait)
        except NotInRemote:
            self._hand_over(part, stream.position, out)
            return False
        except RemoteReadError as exc:
            log.error("remote read failed", topic=part.tp[0], partition=part.tp[1], offset=stream.position,
                      error=str(exc))  # fmt: skip
            if isinstance(exc, OffsetOutOfRange) and self._reset in _EARLIEST:
                self._close_stream(part)
                self._go_remote(part, self._earliest(*part.tp))
                return True
            if isinstance(exc, OffsetOutOfRange) and self._reset in _LATEST:
                self._close_stream(part)
                part.position = None
                self._reposition(TopicPartition(*part.tp, OFFSET_END), resume=not part.paused)
                return False
            out.append(TieredEvent(*part.tp, stream.position, _error_for(exc)))
            part.retry_at = time.monotonic() + RETRY_SECONDS
            part.problem = (time.monotonic(), f"remote read failed: {exc}")
            return False
        if not batches:
            if stream.download_paused:
                part.retry_at = time.monotonic() + RETRY_SECONDS
                return False
            if stream.blocked_at is not None:  # a transaction decided beyond the remote data
                lx = self._broker_log_start(part)
                if lx is None:
                    return False
                if stream.blocked_at >= lx:
                    self._hand_over(part, stream.blocked_at, out)
                    return False
                part.retry_at = time.monotonic() + RETRY_SECONDS
            return True
        if len(batches) == 1:
            part.pending = batches[0].records
        else:
            part.pending = [m for batch in batches for m in batch.records]
        part.next = 0
        return False

    def _take_broker(self, messages: list, out: list) -> None:
        parts = self._parts
        for m in messages:
            err = m.error()
            key = (m.topic(), m.partition())
            part = parts.get(key)
            if err is not None:
                if err.code() == KafkaError._AUTO_OFFSET_RESET and part is not None and part.stream is None:
                    self._boundary_passed(part, m, out)
                    continue
                out.append(m)
                continue
            if part is None:
                continue  # fetched before its partition was revoked: its next owner reads it (not committed here)
            if part.stream is not None or (part.position is not None and m.offset() < part.position):
                continue  # fetched before a pause or seek took effect: remote data or a duplicate
            part.position = m.offset() + 1
            out.append(m)

    def _boundary_passed(self, part: _Partition, message: Any, out: list) -> None:
        """The broker deleted data at this partition's position: read it from remote again. Without a
        position (no committed offset and auto.offset.reset=error) the error is the user's."""
        position = part.position
        if position is None:
            out.append(message)
            return
        self._inner.pause([TopicPartition(*part.tp)])
        log.info("broker log start passed the position; reading remote", topic=part.tp[0], partition=part.tp[1],
                 offset=position)  # fmt: skip
        self._go_remote(part, position)

    # -- offsets --------------------------------------------------------------------------------
    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        """The next offset to be delivered per partition (OFFSET_INVALID when not known yet)."""
        self._sync_broker_positions()
        out = []
        for tp in partitions:
            part = self._parts.get((tp.topic, tp.partition))
            offset = part.position if part is not None and part.position is not None else -1001
            out.append(TopicPartition(tp.topic, tp.partition, offset))
        return out

    def _sync_broker_positions(self) -> None:
        """Partitions read from the broker move past control records the broker consumer skipped."""
        broker = [TopicPartition(*k) for k, p in self._parts.items() if p.stream is None]
        if not broker:
            return
        for tp in self._inner.position(broker):
            part = self._parts[(tp.topic, tp.partition)]
            if tp.offset >= 0 and (part.position is None or tp.offset > part.position):
                part.position = tp.offset

    def seek(self, partition: TopicPartition) -> None:
        """Continue ``partition`` (assigned) from its offset, remote or broker as the offset requires."""
        key = (partition.topic, partition.partition)
        part = self._parts.get(key)
        if part is None:
            raise KafkaException(KafkaError(KafkaError._STATE, f"{key[0]}-{key[1]} is not assigned"))
        offset = self._start_positions([partition])[key]
        self._close_stream(part)
        lx = self._catalog.cluster.log_start_offsets([key])[key]
        if 0 <= offset < lx:
            self._go_remote(part, offset)
            self._inner.pause([TopicPartition(*key)])
            return
        part.position = offset if offset >= 0 else None
        self._reposition(TopicPartition(*key, offset), resume=not part.paused)

    def pause(self, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            part = self._parts.get((tp.topic, tp.partition))
            if part is not None:
                part.paused = True
        self._inner.pause(partitions)

    def resume(self, partitions: list[TopicPartition]) -> None:
        broker = []
        for tp in partitions:
            part = self._parts.get((tp.topic, tp.partition))
            if part is not None:
                part.paused = False
                if part.stream is None:
                    broker.append(tp)
        if broker:
            self._inner.resume(broker)

    def store_offsets(self, message: Any = None, offsets: list[TopicPartition] | None = None) -> None:
        """Offsets auto commit will commit when ``enable.auto.offset.store`` is false."""
        if message is not None:
            offsets = [TopicPartition(message.topic(), message.partition(), message.offset() + 1)]
        for tp in offsets or []:
            self._stored[(tp.topic, tp.partition)] = tp.offset

    def commit(self, message: Any = None, offsets: list[TopicPartition] | None = None,
               asynchronous: bool = True) -> list[TopicPartition] | None:  # fmt: skip
        """Commit ``message``'s offset + 1, ``offsets``, or the current positions (remote ones included)."""
        if message is not None:
            offsets = [TopicPartition(message.topic(), message.partition(), message.offset() + 1)]
        if offsets is None:
            self._sync_broker_positions()
            offsets = [TopicPartition(*k, p.position) for k, p in self._parts.items() if p.position is not None]
        if not offsets:
            raise KafkaException(KafkaError(KafkaError._NO_OFFSET, "no offset to commit"))
        return self._inner.commit(offsets=offsets, asynchronous=asynchronous)

    def _commit_positions(self, asynchronous: bool, only: set[tuple[str, int]] | None = None) -> None:
        """Auto commit: the positions (or stored offsets) of every partition, or of ``only`` these."""
        if only is None:
            self._next_commit = time.monotonic() + self._auto_commit_s
        if self._auto_store:
            self._sync_broker_positions()
            offsets = [TopicPartition(*k, p.position) for k, p in self._parts.items() if p.position is not None]
        else:
            offsets = [TopicPartition(*k, o) for k, o in self._stored.items()]
        if only is not None:
            offsets = [tp for tp in offsets if (tp.topic, tp.partition) in only]
        if offsets:
            try:
                self._inner.commit(offsets=offsets, asynchronous=asynchronous)
            except KafkaException as exc:  # as librdkafka's auto commit: logged, retried at the next interval
                log.warning("auto commit failed", error=str(exc))

    def committed(self, partitions: list[TopicPartition], timeout: float | None = None) -> list[TopicPartition]:
        return self._inner.committed(partitions, timeout) if timeout is not None else self._inner.committed(partitions)

    def get_watermark_offsets(self, partition: TopicPartition, timeout: float | None = None,
                              cached: bool = False) -> tuple[int, int]:  # fmt: skip
        """(low, high): low is the remote start when remote data goes below the broker's log start."""
        low, high = self._inner.get_watermark_offsets(partition, timeout, cached) if timeout is not None else (
            self._inner.get_watermark_offsets(partition, cached=cached))  # fmt: skip
        self._catalog.watch([partition.topic])
        rx, _ = self._catalog.remote_offsets(partition.topic, partition.partition)
        return (low if rx is None else min(rx, low)), high

    # -- diagnostics ----------------------------------------------------------------------------
    def _keep_stats(self, stats: str) -> None:
        """librdkafka's statistics callback: keep the last report for ``describe``, pass it on to the user's."""
        self._stats = (time.monotonic(), stats)
        if self._user_stats_cb is not None:
            self._user_stats_cb(stats)

    def describe(self) -> dict[str, Any]:
        """What this consumer is doing, for a person (or a test) looking at a reader that stopped delivering.
        Sends Kafka no request; call it from the consuming thread, as every other method.

        ``assignment``: the inner consumer's partitions, as ``topic-partition``. ``partitions``: per assigned
        partition (``topic-partition``), ``position`` (the next offset to deliver), ``reading`` (``remote`` or
        ``broker``), ``paused`` (by the user), ``inner_paused`` (held paused in the inner consumer: while remote,
        or paused by the user), ``pending`` (decoded, not delivered yet), ``retry_in_s`` (waiting before asking
        again, after an error), ``problem`` (the last thing that held it up, and ``problem_age_s``),
        ``remote_offsets`` (Rx, Ry as the catalog knows them), ``stream`` (while remote: its position, the
        copy being read as [base, end], ``blocked_at``, ``download_paused``), ``inner_position`` (the inner
        consumer's fetch position) and ``librdkafka``: from its last statistics report (every
        ``statistics.interval.ms``, default 10 s; ``stats_age_s`` old), the partition's ``leader`` and the
        ``broker`` it fetches from, its ``fetch_state`` and ``next_offset``, and which brokers are up."""
        now = time.monotonic()
        stats = json.loads(self._stats[1]) if self._stats is not None else {}
        tps = [TopicPartition(*k) for k in self._parts]
        inner_positions = {(tp.topic, tp.partition): tp.offset for tp in self._inner.position(tps)} if tps else {}
        partitions = {}
        for key, part in self._parts.items():
            stream = part.stream
            fetcher = stats.get("topics", {}).get(key[0], {}).get("partitions", {}).get(str(key[1]), {})
            partitions[f"{key[0]}-{key[1]}"] = {
                "position": part.position,
                "reading": "broker" if stream is None else "remote",
                "paused": part.paused,
                "inner_paused": stream is not None or part.paused,
                "pending": len(part.pending) - part.next,
                "retry_in_s": round(max(0.0, part.retry_at - now), 1),
                "problem": part.problem[1] if part.problem else None,
                "problem_age_s": round(now - part.problem[0], 1) if part.problem else None,
                "remote_offsets": self._catalog.remote_offsets(*key),
                "stream": None if stream is None else _stream_state(stream),
                "inner_position": inner_positions.get(key),
                "librdkafka": {k: fetcher.get(k) for k in ("leader", "broker", "fetch_state", "next_offset")},
            }
        brokers = stats.get("brokers", {}).values()
        return {
            "assignment": [f"{tp.topic}-{tp.partition}" for tp in self._inner.assignment()],
            "partitions": partitions,
            "brokers_up": sorted(b["nodeid"] for b in brokers if b.get("nodeid", -1) >= 0 and b.get("state") == "UP"),
            "stats_age_s": round(now - self._stats[0], 1) if self._stats is not None else None,
        }

    # -- the rest of the interface --------------------------------------------------------------
    def list_topics(self, *args: Any, **kwargs: Any) -> Any:
        return self._inner.list_topics(*args, **kwargs)

    def memberid(self) -> str | None:
        return self._inner.memberid()

    def consumer_group_metadata(self) -> Any:
        return self._inner.consumer_group_metadata()

    def offsets_for_times(self, *args: Any, **kwargs: Any) -> Any:
        """Answered by the broker (its time index covers only local data)."""
        return self._inner.offsets_for_times(*args, **kwargs)

    def close(self) -> None:
        """Commit (with auto commit), leave the group, free the remote streams. Idempotent."""
        if self._closed:
            return
        self._closing = True
        try:
            try:
                if self._auto_commit:
                    self._commit_positions(asynchronous=False)
                if self._subscribed:
                    self._leave_group()  # a failure here (a user's on_revoke raising) still closes the inner one
            finally:
                self._inner.close()
        finally:
            for part in self._parts.values():
                self._close_stream(part)
            self._parts.clear()
            self._closed = True
            if self._owns_reader:
                self._reader.close()

    def _leave_group(self) -> None:
        """Unsubscribe and serve the revocation before closing. librdkafka can hang for good in an
        ``(incremental_)unassign`` made from a rebalance callback that ``close`` itself serves (librdkafka
        issues 4527 and 4884; seen here after a member's session timed out and it joined again); the
        callback served by a poll after ``unsubscribe`` does not. Bounded: ``close`` follows regardless.
        What the inner consumer returns meanwhile is dropped: it was never delivered, so never committed. Not
        ``unsubscribe()``: that forgets the partitions before the revocation commits their positions."""
        self._inner.unsubscribe()
        self._subscribed = False
        deadline = time.monotonic() + _LEAVE_S
        while self._inner.assignment() and time.monotonic() < deadline:
            self._inner.consume(500, 0.1)

    def __enter__(self) -> TieredConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
