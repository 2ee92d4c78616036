"""The broker's answers the proxy completes for tiered data: ApiVersions, ListOffsets, OffsetForLeaderEpoch.

Each function takes the broker's parsed answer (and the client's request where the answer depends on
it) and returns the answer a client must see. Only partitions with remote data change; every other
field is the broker's. Both requests name topics (no ids), so the copies answered from are those of the
name's live incarnation, asked of the cluster for the answer (never a deleted topic's of the same name).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kio.schema.errors import ErrorCode
from kio.static.primitive import i16, i32, i64

from reader.errors import RemoteReadError
from reader.proxy.protocol import API_VERSIONS, build, nested, response_type, supported_versions
from reader.proxy.tiered import TieredView, TopicKey
from tiering_core.kafka_cluster import KafkaClusterError
from tiering_core.logs import get_logger

log = get_logger(__name__)
EARLIEST, LATEST_TIERED = -2, -5
# share groups' APIs carry broker addresses the proxy does not rewrite (ShareFetch, ShareAcknowledge) and
# SaslHandshake v0 is followed by raw SASL tokens that are not Kafka requests: left out of what clients see
_LEFT_OUT = frozenset({76, 77, 78, 79})
_MIN_VERSION = {17: 1}


def api_versions(answer: Any) -> Any:
    """The broker's versions intersected with those the proxy can parse, so that no client sends a
    version the proxy cannot read; APIs it cannot parse at all are left out."""
    if answer.error_code != ErrorCode.none:
        return answer
    ours = supported_versions()
    keys = []
    for k in answer.api_keys:
        key = int(k.api_key)
        if key in _LEFT_OUT or key not in ours:
            continue
        low = max(int(k.min_version), ours[key][0], _MIN_VERSION.get(key, 0))
        high = min(int(k.max_version), ours[key][1])
        if low <= high:
            keys.append(dataclasses.replace(k, min_version=i16(low), max_version=i16(high)))
    return dataclasses.replace(answer, api_keys=tuple(keys))


def unsupported_api_versions() -> Any:
    """The answer to an ApiVersions request of a version the proxy cannot read (Kroxylicious'
    ``ApiVersionsDowngrader``): UNSUPPORTED_VERSION at v0 with the ApiVersions versions it can read, so the
    client asks again with one of them. Passing the broker's answer through instead would show the client
    versions the proxy cannot rewrite (and, in their answers, the brokers' own addresses)."""
    body = response_type(API_VERSIONS, 0)
    low, high = supported_versions()[API_VERSIONS]
    entry = build(nested(body, "api_keys"), api_key=i16(API_VERSIONS), min_version=i16(low), max_version=i16(high))
    return build(body, error_code=ErrorCode.unsupported_version, api_keys=(entry,))


def list_offsets(request: Any, answer: Any, view: TieredView) -> Any:
    """EARLIEST is the remote start where remote data is below the broker's; LATEST_TIERED the remote
    end; a timestamp whose first record is below the broker's log start is found in the copies."""
    asked = {(t.name, int(p.partition_index)): int(p.timestamp) for t in request.topics for p in t.partitions}
    live = _LiveKeys(view)
    tiered = view.tiered_names()  # nothing else is asked of the cluster for the others
    wanted = []
    for t in answer.topics:
        for p in t.partitions:
            spec = asked.get((t.name, int(p.partition_index)))
            if (
                t.name in tiered
                and spec is not None
                and p.error_code == ErrorCode.none
                and (spec >= 0 or spec in (EARLIEST, LATEST_TIERED))
            ):
                wanted.append((t.name, p, spec))
    by_time = [(topic, int(p.partition_index)) for name, p, spec in wanted if spec >= 0
               if (topic := _live_or_none(live, name)) is not None]  # fmt: skip
    if len(by_time) > 1:  # their log starts asked together, one ListOffsets per leader
        try:
            view.refresh_offsets(by_time)
        except KafkaClusterError as exc:  # each partition asks again on its own and fails alone
            log.info("asking the broker's offsets failed", partitions=len(by_time), error=str(exc))
    changed = {(name, int(p.partition_index)): _list_offset(view, live, name, p, spec) for name, p, spec in wanted}
    if not changed:
        return answer
    topics = []
    for t in answer.topics:
        parts = tuple(changed.get((t.name, int(p.partition_index)), p) for p in t.partitions)
        topics.append(dataclasses.replace(t, partitions=parts))
    return dataclasses.replace(answer, topics=tuple(topics))


def _live_or_none(live: _LiveKeys, name: str) -> TopicKey | None:
    try:
        return live.get(name)
    except KafkaClusterError:
        return None  # ``_list_offset`` asks again and leaves the broker's answer


def _list_offset(view: TieredView, live: _LiveKeys, name: str, p: Any, spec: int) -> Any:
    partition = int(p.partition_index)
    try:
        topic = live.get(name)
        if topic is None:
            return p
        if spec == EARLIEST:
            found = view.earliest(topic, partition)
            if found is not None and found[0] < int(p.offset):
                return _offset(p, found[0], -1, found[1])
        elif spec == LATEST_TIERED:
            found = view.latest_tiered(topic, partition)
            if found is not None:
                return _offset(p, found[0], -1, found[1])
        elif spec >= 0:
            log_start = view.broker_offsets(topic, partition).log_start
            hit = view.offset_for_time(topic, partition, spec, log_start)
            if hit is not None:
                return _offset(p, hit[0], hit[1], hit[2])
    except (RemoteReadError, KafkaClusterError) as exc:
        log.warning("answering ListOffsets from remote storage failed; the broker's answer stands", topic=name,
                    partition=partition, spec=spec, error=str(exc))  # fmt: skip
    return p


def _offset(p: Any, offset: int, timestamp: int, epoch: int) -> Any:
    changes: dict[str, Any] = {"offset": i64(offset), "timestamp": i64(timestamp)}
    if hasattr(p, "leader_epoch"):
        changes["leader_epoch"] = i32(epoch)
    return dataclasses.replace(p, **changes)


def offset_for_leader_epoch(request: Any, answer: Any, view: TieredView) -> Any:
    """Where an asked epoch ended inside the remote data, the end offset the copies' checkpoints give."""
    asked = {(t.topic, int(p.partition)): int(p.leader_epoch) for t in request.topics for p in t.partitions}
    live = _LiveKeys(view)
    topics = []
    for t in answer.topics:
        parts = []
        for p in t.partitions:
            epoch = asked.get((t.topic, int(p.partition)))
            if epoch is not None and p.error_code == ErrorCode.none:
                try:
                    topic = live.get(t.topic)
                    found = None if topic is None else view.end_offset_for_epoch(topic, int(p.partition), epoch)
                except (RemoteReadError, KafkaClusterError) as exc:
                    log.warning("answering OffsetForLeaderEpoch from remote storage failed", topic=t.topic,
                                partition=int(p.partition), error=str(exc))  # fmt: skip
                    found = None
                if found is not None and (int(p.end_offset) < 0 or found[1] < int(p.end_offset)):
                    p = dataclasses.replace(p, leader_epoch=i32(found[0]), end_offset=i64(found[1]))
            parts.append(p)
        topics.append(dataclasses.replace(t, partitions=tuple(parts)))
    return dataclasses.replace(answer, topics=tuple(topics))


class _LiveKeys:
    """The live incarnation of each name an answer needs, asked of the cluster once per answer."""

    def __init__(self, view: TieredView) -> None:
        self.view = view
        self.keys: dict[str, TopicKey | None] = {}

    def get(self, name: str) -> TopicKey | None:
        """None when the cluster has no such topic. Raises KafkaClusterError (the broker's answer stands)."""
        if name not in self.keys:
            self.keys[name] = self.view.live_key(name)
        return self.keys[name]
