"""The metadata WAL: an inner Kafka topic (default ``__tiering_metadata``).

cleanup.policy=delete with infinite retention, replication min(3, brokers), written by an
idempotent producer with acks=all. All records of one user partition go to one WAL partition (a
stable CRC-32C hash of topic id + partition), so their order is total; topic-level records go by
topic id, cluster-level records to partition 0. The partition count must never change once the
topic exists (a user partition's records would move to another WAL partition): ``ensure_topic``
adopts the existing topic's count.
"""

from __future__ import annotations

import atexit
import threading
import time
import weakref
from collections.abc import Iterable, Iterator
from typing import Any

import crc32c
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

from metadata.records import (
    ClusterRecord,
    MetadataRecord,
    PartitionRecord,
    topic_id_bytes,
    topic_id_str,
)
from tiering_core.errors import TieringError
from tiering_core.kafka_client import make_client
from tiering_core.kafka_logs import admin_client, kafka_logging
from tiering_core.logs import get_logger
from tiering_core.produce import produce_waiting

log = get_logger(__name__)


class WalError(TieringError):
    """The WAL could not be written or read (Kafka unreachable, topic missing, write not durable).

    A failed write was not applied anywhere: the caller must treat the transition as not done.
    """


class WalMissing(WalError):
    """The WAL topic does not exist and the caller may not create it: no sidecar has run, nothing is tiered."""


class WalGap(WalError):
    """Records the reader needs are gone from the WAL: retention or ``delete_records`` removed them, the
    log was truncated, or the topic was deleted and created again. Applying what follows would build a
    wrong state, so the reader stops; recovery needs a snapshot that covers the gap."""


class MetadataWal:
    def __init__(
        self, bootstrap: str, topic: str = "__tiering_metadata", partitions: int = 50, *,
        timeout: float = 30.0, client_config: dict[str, Any] | None = None,
    ) -> None:  # fmt: skip
        self.bootstrap = bootstrap
        self.topic = topic
        self.partitions = partitions
        self.timeout = timeout
        self.client_config = {**kafka_logging(), **(client_config or {})}
        self.integrity_check_seconds = 10.0  # how often a follower checks the WAL still holds what it read
        self.topic_id: str | None = None  # the WAL topic's Kafka id, known after ensure_topic()
        self._producer: Producer | None = None
        self._producer_lock = threading.Lock()
        self._admin_client: AdminClient | None = None
        self._retired_admin: AdminClient | None = None  # the client ``_replace_admin`` replaced
        self._poller: threading.Thread | None = None
        self._closed = threading.Event()
        self._reading = 0  # read() calls whose consumer is not closed yet
        self._read_done = threading.Condition()
        _OPEN.add(self)

    # -- topic -------------------------------------------------------------------------------
    def _admin(self) -> AdminClient:
        if self._closed.is_set():
            raise WalError(f"the metadata WAL {self.topic} is closed")
        if self._admin_client is None:
            self._admin_client = admin_client({"bootstrap.servers": self.bootstrap, **self.client_config})
        return self._admin_client

    def ensure_topic(self, create: bool = True) -> int:
        """Create the WAL topic if it does not exist; return its partition count (idempotent).

        ``create=False`` (readers, which never write): a missing topic raises WalError instead. The topic
        is looked up by name with DescribeTopics (its id and leaders in one answer), not by listing the
        cluster's topics: on a cluster of thousands of topics that listing was most of a reader's start.
        """
        found = self._describe(missing_ok=True)
        if found is None:
            if not create:
                raise WalMissing(
                    f"metadata topic {self.topic} does not exist at {self.bootstrap}: no sidecar has run yet"
                )
            replication = self._create()
            found = self._describe(missing_ok=False)
            log.info("metadata topic ready", topic=self.topic, partitions=found[0], replication=replication)
        self.partitions, self.topic_id = found
        return self.partitions

    def _create(self) -> int:
        """Create the topic (replication min(3, brokers)); return its replication factor."""
        admin = self._admin()
        try:
            brokers = len(admin.describe_cluster(request_timeout=self.timeout).result(self.timeout).nodes)
        except KafkaException as exc:
            raise WalError(f"cannot reach the Kafka cluster at {self.bootstrap}: {exc.args[0].str()}") from exc
        replication = min(3, brokers)
        topic = NewTopic(
            self.topic,
            num_partitions=self.partitions,
            replication_factor=replication,
            config={
                "cleanup.policy": "delete",
                "retention.ms": "-1",
                "retention.bytes": "-1",
                "min.insync.replicas": str(min(2, replication)),
            },
        )
        future = admin.create_topics([topic])[self.topic]
        try:
            future.result(self.timeout)
        except Exception as exc:  # the topic may have been created concurrently by another sidecar
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise WalError(f"creating metadata topic {self.topic}: {exc}") from exc
        return replication

    def _refresh_leaders(self) -> None:
        """Wait until every partition has a leader, then refresh the admin client's own view of the leaders
        (a Metadata request for the topic: DescribeTopics answers do not update librdkafka's cache), so
        that the next ListOffsets goes to the current leaders."""
        self._describe(missing_ok=False)
        try:
            self._admin().list_topics(topic=self.topic, timeout=self.timeout)
        except KafkaException as exc:
            raise WalError(f"cannot reach the Kafka cluster at {self.bootstrap}: {exc.args[0].str()}") from exc

    def _describe(self, missing_ok: bool) -> tuple[int, str] | None:
        """(partition count, topic id) once every partition of the topic has a leader; None if the topic
        does not exist and ``missing_ok``. Otherwise a missing topic (a broker that has not learned of a
        just-created one) is asked again until the timeout."""
        deadline = time.monotonic() + self.timeout
        while True:
            future = self._admin().describe_topics(TopicCollection([self.topic]), request_timeout=self.timeout)
            try:
                found = future[self.topic].result(self.timeout)
            except KafkaException as exc:
                error = exc.args[0]
                if error.code() < 0:  # librdkafka's own: transport, timeout, authentication
                    raise WalError(f"cannot reach the Kafka cluster at {self.bootstrap}: {error.str()}") from exc
                if error.code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                    raise WalError(
                        f"describing metadata topic {self.topic} at {self.bootstrap}: {error.str()}"
                    ) from exc
                if missing_ok:
                    return None
                found = None
            except Exception as exc:
                raise WalError(f"describing metadata topic {self.topic} at {self.bootstrap}: {exc}") from exc
            if found is not None and found.partitions and all(p.leader is not None for p in found.partitions):
                return len(found.partitions), topic_id_str(topic_id_bytes(str(found.topic_id)))
            if time.monotonic() > deadline:
                state = "does not exist" if found is None else "has partitions without a leader"
                raise WalError(f"metadata topic {self.topic} {state} after {self.timeout:.0f}s")
            time.sleep(0.1)

    def partition_for(self, record: MetadataRecord) -> int:
        """The WAL partition of ``record``: by topic id + partition, by topic id, or 0 (cluster)."""
        if isinstance(record, ClusterRecord):
            return 0
        user_partition = record.partition if isinstance(record, PartitionRecord) else None
        return self.partition_of(topic_id_bytes(record.topic_id), user_partition)

    def partition_of(self, topic_id: bytes, partition: int | None) -> int:
        """The WAL partition of a user partition's records (``partition`` None: of the topic's records)."""
        key = topic_id if partition is None else topic_id + partition.to_bytes(4, "big")
        return crc32c.crc32c(key) % self.partitions

    # -- writing -----------------------------------------------------------------------------
    def _ensure_producer(self) -> Producer:
        with self._producer_lock:
            if self._producer is not None:
                return self._producer
            if self._closed.is_set():
                raise WalError(f"the metadata WAL {self.topic} is closed")
            producer = self._producer = make_client(
                Producer,
                {
                    "bootstrap.servers": self.bootstrap,
                    "enable.idempotence": True,
                    "acks": "all",
                    "linger.ms": 1,
                    "compression.type": "lz4",
                    **self.client_config,
                },
            )
            self._poller = threading.Thread(
                target=self._poll_loop, args=(producer,), name="wal-producer-poll", daemon=True
            )
            self._poller.start()
            return producer

    def _poll_loop(self, producer: Producer) -> None:
        while not self._closed.is_set() and self._producer is producer:
            producer.poll(0.1)

    def _discard_producer(self, producer: Producer, why: object) -> None:
        """After a fatal error (e.g. the idempotent producer was fenced) the next write uses a new one."""
        with self._producer_lock:
            if self._producer is producer:
                self._producer = None
                log.error("metadata WAL producer failed fatally; a new one will be created", error=str(why))

    def append(self, record: MetadataRecord) -> tuple[int, int]:
        """Write ``record`` durably; return its (WAL partition, offset). Raises WalError."""
        return self.append_payload(self.partition_for(record), record.encode())

    def append_payload(self, partition: int, payload: bytes) -> tuple[int, int]:
        """Write one payload to WAL ``partition``; return (partition, offset) once it is durable
        (acks=all and the delivery report checked).

        Raises WalError when the write failed, or when it was not acknowledged in time (it may still
        land): retrying writes it again, which the state machine treats as an idempotent retry.
        """
        producer = self._ensure_producer()
        done = threading.Event()
        outcome: dict[str, Any] = {}

        def report(err: KafkaError | None, msg: Message) -> None:
            outcome["err"] = err
            outcome["offset"] = None if err else msg.offset()
            done.set()

        try:
            producer.produce(self.topic, value=payload, partition=partition, on_delivery=report)
        except (KafkaException, BufferError) as exc:
            raise WalError(f"write to {self.topic}[{partition}] not queued: {exc}") from exc
        if not done.wait(self.timeout):
            raise WalError(f"write to {self.topic}[{partition}] not acknowledged within {self.timeout:.0f}s")
        err = outcome["err"]
        if err is not None:
            if err.fatal():
                self._discard_producer(producer, err)
            raise WalError(f"write to {self.topic}[{partition}] failed: {err}")
        return partition, int(outcome["offset"])

    def produce_async(self, partition: int, payload: bytes) -> None:
        """Queue a write without waiting (bulk loading, benchmarks); ``flush`` waits for all of them."""
        producer = self._ensure_producer()
        produce_waiting(producer, self.topic, value=payload, partition=partition)

    def flush(self) -> None:
        if self._producer is not None and self._producer.flush(self.timeout * 4) != 0:
            raise WalError(f"writes to {self.topic} still pending after flush")

    # -- reading -----------------------------------------------------------------------------
    def end_offsets(self, partitions: Iterable[int] | None = None) -> dict[int, int]:
        """The next offset to be written in each WAL partition (high watermarks; ``partitions``: only
        those, default all), in one request."""
        return self._list_offsets(OffsetSpec.latest(), "end", partitions)

    def start_offsets(self, partitions: Iterable[int] | None = None) -> dict[int, int]:
        """The first offset still stored in each WAL partition (log start offsets; ``partitions``: only
        those, default all), in one request."""
        return self._list_offsets(OffsetSpec.earliest(), "start", partitions)

    def _list_offsets(self, spec: OffsetSpec, what: str, partitions: Iterable[int] | None) -> dict[int, int]:
        """The offsets of ``spec``, asked again after each refresh of the leaders until ``timeout`` passes, and at
        least once. A request nobody answered went to a leader whose broker stopped: librdkafka's admin client
        keeps such a broker as the leader, and as the controller its DescribeTopics waits for, until its
        periodic refresh; it is replaced by a fresh client, which learns both from the live brokers."""
        deadline = time.monotonic() + self.timeout
        chosen = range(self.partitions) if partitions is None else sorted(partitions)
        wanted = {TopicPartition(self.topic, p): spec for p in chosen}
        refreshed = False
        while True:
            unanswered: list[int] = []
            try:
                futures = self._admin().list_offsets(wanted, request_timeout=self.timeout)
                found = {tp.partition: f.result().offset for tp, f in futures.items()}
            except KafkaException as exc:
                problem = str(exc)
            else:  # a request that timed out answers OFFSET_INVALID (-1001), not an error
                unanswered = sorted(p for p, offset in found.items() if offset < 0)
                if not unanswered:
                    return found
                problem = f"no answer for partitions {unanswered} within {self.timeout:.0f}s"
            if refreshed and time.monotonic() > deadline:  # a new topic: leaders may still be moving
                raise WalError(f"reading the {what} offsets of {self.topic}: {problem}")
            if unanswered:
                self._replace_admin()
            self._refresh_leaders()
            refreshed = True

    def _replace_admin(self) -> None:
        """Use a fresh admin client from now on. The old one is kept until the next replacement or ``close()``:
        dropping it would destroy its handle under a request another thread may have in flight on it."""
        self._retired_admin, self._admin_client = self._admin_client, None

    def gap(self, partition: int, expected: int, found: str) -> WalGap:
        """The error for records missing before ``expected`` in ``partition``: what was found instead."""
        return WalGap(
            f"metadata WAL {self.topic}[{partition}]: the next record should be at offset {expected}, but {found}; "
            "records were removed (retention, delete_records or truncation) or the topic was created again. "
            "Applying what follows would build a wrong state: recovery needs a snapshot covering offset "
            f"{expected} of partition {partition} (keep retention.ms=-1 on {self.topic})"
        )

    def _consumer(self) -> Consumer:
        return make_client(
            Consumer,
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": f"{self.topic}-reader",
                "enable.auto.commit": False,
                "enable.partition.eof": False,
                "auto.offset.reset": "error",  # a position the WAL no longer holds is a gap, not a restart
                "fetch.max.bytes": 64 * 1024 * 1024,
                "max.partition.fetch.bytes": 8 * 1024 * 1024,
                "queued.max.messages.kbytes": 256 * 1024,
                "fetch.wait.max.ms": 100,
                **self.client_config,
            },
        )

    def read(self, start: dict[int, int], stop: threading.Event | None = None, batch: int = 10000,
             until: dict[int, int] | None = None, partitions: Iterable[int] | None = None,
             ) -> Iterator[list[Message]]:  # fmt: skip
        """Yield batches of WAL messages from ``start`` offsets (missing partitions: from the beginning).

        With ``until``, stops once every partition reached its offset there; otherwise follows the
        WAL until ``stop`` is set, yielding empty batches while idle. ``partitions``: read only these
        WAL partitions (default all). Offsets must follow each other with no gap (the WAL is written
        without transactions, so every offset holds a record): a skipped offset, or a position the WAL
        no longer holds, raises WalGap naming the partition and offsets. Raises WalError on a fatal
        consumer error.
        """
        with self._read_done:
            self._reading += 1
        try:
            yield from self._read(start, stop, batch, until, partitions)
        finally:
            with self._read_done:
                self._reading -= 1
                self._read_done.notify_all()

    def _read(self, start: dict[int, int], stop: threading.Event | None, batch: int,
              until: dict[int, int] | None, partitions: Iterable[int] | None) -> Iterator[list[Message]]:  # fmt: skip
        consumer = self._consumer()
        chosen = range(self.partitions) if partitions is None else sorted(partitions)
        expected = {p: start.get(p, 0) for p in chosen}
        consumer.assign([TopicPartition(self.topic, p, o) for p, o in expected.items()])
        remaining = {p: o for p, o in (until or {}).items() if o > start.get(p, 0)}
        next_check = time.monotonic() + self.integrity_check_seconds
        suspects: set[int] = set()
        try:
            while True:
                if until is not None and not remaining:
                    return
                if (stop is not None and stop.is_set()) or self._closed.is_set():
                    return
                if until is None and time.monotonic() >= next_check:
                    next_check = time.monotonic() + self.integrity_check_seconds
                    self._check_still_holds(expected, suspects)
                messages = consumer.consume(1, 0.2)  # wait for the first message only, then
                if messages:  # take what has already arrived: no waiting for a full batch
                    messages += consumer.consume(batch - 1, 0)
                good = []
                for m in messages:
                    err = m.error()
                    if err is None:
                        p, o = m.partition(), m.offset()
                        if o != expected[p]:
                            raise self.gap(p, expected[p], f"the next record read is at offset {o}")
                        expected[p] = o + 1
                        good.append(m)
                    elif err.code() == KafkaError._AUTO_OFFSET_RESET:
                        p = m.partition()
                        raise self.gap(p, expected[p], f"the WAL does not hold it ({self._held(consumer, p)}: {err})")
                    elif err.fatal():
                        raise WalError(f"reading {self.topic}: {err}")
                if good or until is None:  # when following, empty batches let the caller act on time
                    if remaining:
                        last = {m.partition(): m.offset() for m in good}
                        for p, o in last.items():
                            if o + 1 >= remaining.get(p, 0):
                                remaining.pop(p, None)
                    yield good
        finally:
            consumer.close()

    def _check_still_holds(self, expected: dict[int, int], suspects: set[int]) -> None:
        """Raise WalGap when the WAL no longer holds what a follower read: the topic was deleted and created
        again (another id), or a partition ends below the next offset expected in two checks in a row
        (``suspects`` carries the partitions seen short last time). librdkafka does not always report a
        reset when a topic is re-created under a consumer, so a follower asks now and then. When Kafka
        does not answer, nothing can be told: the next check asks again."""
        try:
            # both requests end when their answers are given up on: a request left to librdkafka's default
            # timeout (socket.timeout.ms, 60 s) stays queued for a dead broker after the check has moved on
            asked = self._admin().describe_topics(TopicCollection([self.topic]), request_timeout=5)
            described = asked[self.topic].result(5)
            topic_id = topic_id_str(topic_id_bytes(str(described.topic_id)))
            wanted = {TopicPartition(self.topic, p): OffsetSpec.latest() for p in expected}
            futures = self._admin().list_offsets(wanted, request_timeout=5)
            ends = {tp.partition: f.result().offset for tp, f in futures.items()}
        except Exception:  # unknown now (Kafka down, the topic being re-created): asked again later
            return
        if self.topic_id is not None and topic_id != self.topic_id:
            p = min(expected, key=lambda q: (expected[q] == 0, q))  # a partition that had records, if any
            raise self.gap(p, expected[p], f"the topic was created again (id {topic_id}, was {self.topic_id})")
        short = {p for p, end in ends.items() if 0 <= end < expected[p]}
        for p in sorted(short & suspects):  # twice in a row: a new leader's high watermark lags only briefly
            raise self.gap(p, expected[p], f"the WAL now ends at offset {ends[p]}")
        suspects.clear()
        suspects.update(short)

    def _held(self, consumer: Consumer, partition: int) -> str:
        try:
            low, high = consumer.get_watermark_offsets(TopicPartition(self.topic, partition), timeout=5)
        except KafkaException as exc:
            return f"its offsets are unknown: {exc}"
        return f"it holds offsets {low}..{high - 1}" if high > low else f"it is empty at offset {high}"

    def close(self, flush_seconds: float | None = None) -> None:
        """Stop the readers and the producer and drop the admin client (idempotent; afterwards writes and
        admin requests raise WalError, and ``read`` ends at once). Writes still queued get ``flush_seconds``
        (default ``timeout``), then are dropped (their ``append`` already failed, or will: not acknowledged).
        The librdkafka handles are destroyed here, not later by the garbage collector: a client left polling,
        or destroyed, during interpreter exit calls its Python log callback from a half torn-down interpreter,
        which can crash it (SIGSEGV). AdminClient has no ``close()``: dropping the last reference destroys it."""
        self._closed.set()
        _OPEN.discard(self)
        with self._producer_lock:
            producer, self._producer = self._producer, None
        if self._poller is not None:
            self._poller.join(timeout=2)
        if producer is not None:
            if producer.flush(self.timeout if flush_seconds is None else flush_seconds):
                producer.purge()
                producer.poll(0)
            producer.close()
        with self._read_done:  # every read() returns within one poll once closed, closing its consumer
            self._read_done.wait_for(lambda: self._reading == 0, timeout=5)
        self._admin_client = self._retired_admin = None  # last: a reader's integrity check may still be using it


_OPEN: weakref.WeakSet[MetadataWal] = weakref.WeakSet()


@atexit.register
def _close_open_wals() -> None:
    """A WAL nobody closed is closed at interpreter exit, while the interpreter is whole (see ``close``)."""
    for wal in list(_OPEN):
        wal.close(flush_seconds=1.0)
