"""What the sidecar asks of the Kafka cluster, through confluent-kafka's AdminClient.

Topic ids and configs, partition leaders, the three local offsets (Lx, Ly, Lz) and
``delete_records`` (how local retention advances the log start offset). Every call has a timeout
and failures surface as ``KafkaClusterError`` naming the topic or partition.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from confluent_kafka import IsolationLevel, KafkaError, KafkaException, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, OffsetSpec

from tiering_core.errors import TieringError
from tiering_core.kafka_logs import admin_client


class KafkaClusterError(TieringError):
    """A request to the Kafka cluster failed or timed out. Retry later; nothing was changed."""


@dataclass(frozen=True, slots=True)
class PartitionLeader:
    partition: int
    leader: int | None
    replicas: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class TopicInfo:
    """A topic's id (Kafka's base64 Uuid string), partitions and the configs tiering reads."""

    name: str
    topic_id: str
    partitions: tuple[PartitionLeader, ...]
    configs: dict[str, str]

    @property
    def compacted(self) -> bool:
        return "compact" in self.configs.get("cleanup.policy", "delete")

    def config_int(self, name: str, default: int) -> int:
        value = self.configs.get(name)
        return default if value is None else int(value)


@dataclass(frozen=True, slots=True)
class LocalOffsets:
    """Lx (log start), Ly (last stable), Lz (log end) and the current leader epoch of a partition."""

    lx: int
    ly: int
    lz: int
    leader_epoch: int


_TOPIC_CONFIGS = (
    "cleanup.policy",
    "retention.ms",
    "retention.bytes",
    "segment.bytes",
    "remote.storage.enable",
)


def kafka_error_text(error: object) -> str:
    """A KafkaError as a sentence, "Broker: Unknown topic or partition (UNKNOWN_TOPIC_OR_PART)", instead of
    its repr "KafkaError{code=UNKNOWN_TOPIC_OR_PART,val=3,str=...}"; anything else as str()."""
    if isinstance(error, KafkaError):
        return f"{error.str()} ({error.name()})"
    return str(error)


def _wait(future: Future, what: str, timeout: float, bootstrap: str) -> Any:
    try:
        return future.result(timeout=timeout)
    except KafkaException as exc:
        raise KafkaClusterError(f"could not {what} (Kafka at {bootstrap}): {kafka_error_text(exc.args[0])}") from exc
    except TimeoutError as exc:
        raise KafkaClusterError(f"could not {what} (Kafka at {bootstrap}): no answer within {timeout:.0f}s") from exc


_LEADERSHIP_MOVED = {
    KafkaError.FENCED_LEADER_EPOCH,
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.UNKNOWN_LEADER_EPOCH,
    KafkaError.LEADER_NOT_AVAILABLE,
    # "Failed to query partition leaders: No leaders found": the admin client's cached metadata says no leader
    # (it was refreshed during an election), and it refreshes nothing on its own
    KafkaError._NOENT,
}


_NOT_LISTED = {KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError.TOPIC_AUTHORIZATION_FAILED}


def _not_listed(exc: KafkaClusterError) -> bool:
    """Whether Kafka answered that the topic does not exist, or that this principal may not see it: a listing
    of the cluster's topics would not have named it either."""
    refused = exc.__cause__
    return isinstance(refused, KafkaException) and refused.args[0].code() in _NOT_LISTED


def _leader_stale(future: Future, timeout: float) -> bool:
    """Whether ``future`` (a ListOffsets answer) failed because the client's idea of the partition's leader
    may be out of date: the old leader answered that it no longer leads, the client knows no leader, or
    nobody answered. The second is
    a leader that went away: librdkafka's admin client keeps no topics of its own, so a broker going down
    refreshes none of its cached leaders, and it queues the request to the stopped broker until the
    request times out (answered OFFSET_INVALID, not an error)."""
    try:
        error = future.exception(timeout=timeout)
    except TimeoutError:
        return True
    if error is None:
        return bool(future.result().offset < 0)
    return isinstance(error, KafkaException) and error.args[0].code() in _LEADERSHIP_MOVED


def kafka_topic_id(text: str) -> str:
    """A topic id as Kafka prints it (URL-safe base64, no padding, as in partition.metadata).

    confluent-kafka's ``Uuid.__str__`` uses the standard alphabet ('+', '/'); Kafka uses '-', '_'.
    """
    return text.replace("+", "-").replace("/", "_").rstrip("=")


class KafkaCluster:
    """A thin, typed view of the cluster for the sidecar and the CLI."""

    def __init__(
        self, bootstrap: str, *, timeout: float = 15.0, client_config: Mapping[str, str] | None = None,
        on_request: Callable[[str], None] | None = None,
    ) -> None:  # fmt: skip
        """``client_config``: further librdkafka properties (``kafka_client``: security...). ``on_request`` is
        told the Kafka API of every admin call made (Metadata, DescribeConfigs, ListOffsets, DeleteRecords): one
        call is one request per broker that leads the partitions asked about (librdkafka batches them)."""
        self.bootstrap = bootstrap
        self.timeout = timeout
        self.on_request = on_request
        self._config = {"bootstrap.servers": bootstrap, **(client_config or {})}
        self._admin: AdminClient | None = admin_client(self._config)
        self._retired: AdminClient | None = None  # the client a timed-out describe replaced (see ``topics``)

    @property
    def admin(self) -> AdminClient:
        """The admin client (KafkaClusterError once ``close()`` was called)."""
        if self._admin is None:
            raise KafkaClusterError(f"the client of Kafka at {self.bootstrap} is closed")
        return self._admin

    def close(self) -> None:
        """Release the admin client (idempotent). AdminClient has no ``close()``: its librdkafka handle
        (threads, connections) is destroyed when the last reference goes, so this drops ours; a client left
        alive keeps reconnecting after the cluster is gone."""
        self._admin = self._retired = None

    def __enter__(self) -> KafkaCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def topics(self, names: Iterable[str], *, missing_ok: bool = False) -> dict[str, TopicInfo]:
        """Describe topics; a missing topic raises KafkaClusterError naming it, or with ``missing_ok`` is left
        out of the answer, as is one this principal may not see (what a listing of the cluster's topics would
        leave out: a sidecar's tick asks for the tiered topics this way instead of listing every topic and
        partition of the cluster first).

        After a broker dies, librdkafka's admin client may keep waiting for it as the controller; a
        timed-out describe is retried once on a fresh client, which learns the live brokers anew.
        """
        names = list(names)
        if not names:
            return {}
        try:
            return self._describe(names, missing_ok)
        except KafkaClusterError as exc:
            if "Timed out" not in str(exc) and "no answer" not in str(exc):
                raise
            # the old client is kept until the next replacement or close(): dropping it would destroy the
            # handle under a call another thread (the lag monitor, a CLI command) has in flight on it
            self._retired, self._admin = self._admin, admin_client(self._config)
            return self._describe(names, missing_ok)

    def _request(self, api: str) -> None:
        if self.on_request is not None:
            self.on_request(api)

    def _describe(self, names: list[str], missing_ok: bool) -> dict[str, TopicInfo]:
        self._request("Metadata")
        self._request("DescribeConfigs")
        described = self.admin.describe_topics(TopicCollection(names), request_timeout=self.timeout)
        resources = [ConfigResource("topic", n) for n in names]
        configs = self.admin.describe_configs(resources, request_timeout=self.timeout)
        result: dict[str, TopicInfo] = {}
        for resource, future in configs.items():
            name = resource.name
            try:
                desc = _wait(described[name], f"describe topic {name}", self.timeout, self.bootstrap)
            except KafkaClusterError as exc:
                if missing_ok and _not_listed(exc):
                    continue
                raise
            entries = _wait(future, f"describe configs of topic {name}", self.timeout, self.bootstrap)
            result[name] = TopicInfo(
                name=name,
                topic_id=kafka_topic_id(str(desc.topic_id)),
                partitions=tuple(
                    PartitionLeader(
                        p.id, p.leader.id if p.leader is not None else None, tuple(r.id for r in p.replicas)
                    )
                    for p in sorted(desc.partitions, key=lambda p: p.id)
                ),
                configs={k: v.value for k, v in entries.items() if k in _TOPIC_CONFIGS and v.value is not None},
            )
        return result

    def topic_ids(self, names: Iterable[str]) -> dict[str, str | None]:
        """Each named topic's id as Kafka answers a describe of it now, or None where Kafka answered
        that no such topic exists (UNKNOWN_TOPIC_OR_PART).

        A name whose describe failed in any other way (no Describe permission, a timeout) is left out:
        that answer says nothing about whether the topic exists. Asking by name matters: a principal
        without Describe on a topic does not see it in a listing of all topics, but is told
        TOPIC_AUTHORIZATION_FAILED when it asks for it.
        """
        names = sorted(set(names))
        if not names:
            return {}
        self._request("Metadata")
        described = self.admin.describe_topics(TopicCollection(names), request_timeout=self.timeout)
        out: dict[str, str | None] = {}
        for name, future in described.items():
            try:
                out[name] = kafka_topic_id(str(future.result(timeout=self.timeout).topic_id))
            except KafkaException as exc:
                if exc.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                    out[name] = None
            except TimeoutError:
                continue
        return out

    def topic_names(self) -> list[str]:
        self._request("Metadata")
        metadata = self.admin.list_topics(timeout=self.timeout)
        return sorted(metadata.topics)

    def broker_ids(self) -> list[int]:
        """The live brokers' ids, from one DescribeCluster request (a Metadata request for all topics would
        also describe every partition of the cluster, thousands of them on a large broker)."""
        self._request("DescribeCluster")
        future = self.admin.describe_cluster(request_timeout=self.timeout)
        return sorted(node.id for node in _wait(future, "describe the cluster", self.timeout, self.bootstrap).nodes)

    def local_offsets(
        self, partitions: Iterable[tuple[str, int]], settled: Mapping[tuple[str, int], LocalOffsets] | None = None
    ) -> dict[tuple[str, int], LocalOffsets]:
        """Lx, Ly and Lz of each partition, from ListOffsets requests to the leaders (one per leader and kind).

        ``settled`` holds earlier answers in which Ly was Lz (no transaction open). Where Lz and the leader epoch
        are still those, Ly is Lz again and is not asked for: Ly = min(first unstable offset, high watermark), and
        a transaction that opens appends at or above the log end, so it cannot bring Ly below an unchanged high
        watermark (and the marker that ends one moves Lz). The stable offset is asked for last and capped at the Lz
        given with it (whatever is stable then was decided below Lz too), so Lx <= Ly <= Lz holds across the
        requests. An idle broker's sidecar then looks up two offsets per partition, not three."""
        tps = [TopicPartition(t, p) for t, p in partitions]
        if not tps:
            return {}
        earliest = self._list_offsets(tps, OffsetSpec.earliest(), IsolationLevel.READ_UNCOMMITTED)
        end = self._list_offsets(tps, OffsetSpec.latest(), IsolationLevel.READ_UNCOMMITTED)
        epochs = {key: info.leader_epoch if info.leader_epoch is not None else -1 for key, info in end.items()}
        known = settled or {}

        def still_settled(key: tuple[str, int]) -> bool:
            before = known.get(key)
            if before is None or before.leader_epoch != epochs[key]:
                return False
            return before.ly == before.lz == end[key].offset

        unsettled = [tp for tp in tps if not still_settled((tp.topic, tp.partition))]
        stable = self._list_offsets(unsettled, OffsetSpec.latest(), IsolationLevel.READ_COMMITTED) if unsettled else {}
        return {
            key: LocalOffsets(
                lx=earliest[key].offset,
                ly=min(stable[key].offset, end[key].offset) if key in stable else end[key].offset,
                lz=end[key].offset,
                leader_epoch=epochs[key],
            )
            for key in end
        }

    def leader_epoch(self, topic: str, partition: int) -> int:
        """The partition's current leader epoch, from the leader's answer to one ListOffsets (latest)."""
        found = self._list_offsets([TopicPartition(topic, partition)], OffsetSpec.latest(),
                                   IsolationLevel.READ_UNCOMMITTED)[(topic, partition)]  # fmt: skip
        return found.leader_epoch if found.leader_epoch is not None else -1

    def log_start_offsets(self, partitions: Iterable[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """Lx (the log start offset) of each partition, in one ListOffsets request per leader."""
        tps = [TopicPartition(t, p) for t, p in partitions]
        if not tps:
            return {}
        found = self._list_offsets(tps, OffsetSpec.earliest(), IsolationLevel.READ_UNCOMMITTED)
        return {key: info.offset for key, info in found.items()}

    def _list_offsets(
        self, tps: list[TopicPartition], spec: OffsetSpec, isolation: IsolationLevel
    ) -> dict[tuple[str, int], Any]:
        """One ListOffsets request per leader. Right after leadership moved (a reassignment, a broker
        restart) the leaders answer FENCED_LEADER_EPOCH or NOT_LEADER_OR_FOLLOWER to a client whose
        metadata is older, and librdkafka's admin client does not refresh it on that answer (it waits for
        its periodic refresh, 5 minutes); when the old leader's broker is stopped, nothing answers at all
        (the request waits for that broker until it times out), and nothing ever refreshes it. Either
        way the topics' metadata is then asked for once and the request sent again, so a sidecar on the
        new leader, or a TieredConsumer handing a partition over to the broker, does not stall."""
        self._request("ListOffsets")
        futures = self.admin.list_offsets(
            {tp: spec for tp in tps}, isolation_level=isolation, request_timeout=self.timeout
        )
        stale = [f for f in futures.values() if _leader_stale(f, self.timeout)]
        if stale:
            for topic in sorted({tp.topic for tp in tps}):
                self._request("Metadata")
                try:
                    self.admin.list_topics(topic=topic, timeout=self.timeout)  # updates librdkafka's cache
                except KafkaException as exc:  # nothing answers (the cluster is unreachable): the caller's error
                    raise KafkaClusterError(
                        f"could not refresh the leaders of {topic} (Kafka at {self.bootstrap}): "
                        f"{kafka_error_text(exc.args[0])}"
                    ) from exc
            self._request("ListOffsets")
            futures = self.admin.list_offsets(
                {tp: spec for tp in tps}, isolation_level=isolation, request_timeout=self.timeout
            )
        found = {}
        for tp, future in futures.items():
            what = f"list offsets of {tp.topic}-{tp.partition}"
            info = found[(tp.topic, tp.partition)] = _wait(future, what, self.timeout, self.bootstrap)
            if info.offset < 0:  # a request that timed out answers OFFSET_INVALID (-1001), not an error
                raise KafkaClusterError(f"{what}: no answer within {self.timeout:.0f}s")
        return found

    def delete_records_before(self, topic: str, partition: int, offset: int) -> int:
        """Advance the log start offset of ``topic-partition`` to ``offset`` (exclusive end).

        Idempotent: asking for an offset at or below the current log start changes nothing.
        Returns the log start offset the broker reports afterwards.
        """
        self._request("DeleteRecords")
        futures = self.admin.delete_records([TopicPartition(topic, partition, offset)], request_timeout=self.timeout)
        (future,) = futures.values()
        deleted = _wait(future, f"delete records of {topic}-{partition} before {offset}", self.timeout, self.bootstrap)
        return int(deleted.low_watermark)
