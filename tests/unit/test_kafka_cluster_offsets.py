"""KafkaCluster asks for fresh metadata and sends ListOffsets again when leadership moved under it, or when
the leader it knows did not answer (its broker stopped)."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import pytest
from confluent_kafka import IsolationLevel, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import OffsetSpec

from tiering_core.kafka_cluster import KafkaCluster, KafkaClusterError


class Answer:
    def __init__(self, offset: int) -> None:
        self.offset = offset
        self.leader_epoch = 3


class FakeAdmin:
    """Answers ListOffsets with ``error`` (None: OFFSET_INVALID, as librdkafka answers a request that timed out)
    until ``list_topics`` was called ``refreshes_needed`` times."""

    def __init__(self, error: int | None, refreshes_needed: int = 1) -> None:
        self.error = error
        self.refreshes_needed = refreshes_needed
        self.unreachable = False
        self.calls: list[str] = []

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> None:
        self.calls.append(f"Metadata {topic}")
        if self.unreachable:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT))
        self.refreshes_needed -= 1

    def list_offsets(self, request: dict[TopicPartition, Any], **_: Any) -> dict[TopicPartition, Future]:
        self.calls.append("ListOffsets")
        futures = {}
        for tp in request:
            future: Future = Future()
            if self.refreshes_needed > 0 and self.error is None:
                future.set_result(Answer(-1001))
            elif self.refreshes_needed > 0:
                future.set_exception(KafkaException(KafkaError(self.error)))
            else:
                future.set_result(Answer(42))
            futures[tp] = future
        return futures


def cluster_with(admin: FakeAdmin) -> KafkaCluster:
    cluster = KafkaCluster("127.0.0.1:1", timeout=1)
    cluster._admin = admin  # type: ignore[assignment]
    return cluster


@pytest.mark.parametrize("code", [KafkaError.FENCED_LEADER_EPOCH, KafkaError.NOT_LEADER_FOR_PARTITION, None])
def test_a_stale_leader_is_refreshed_and_asked_again(code: int | None) -> None:
    admin = FakeAdmin(code)
    cluster = cluster_with(admin)
    assert cluster.log_start_offsets([("t", 0), ("t", 1)]) == {("t", 0): 42, ("t", 1): 42}
    assert admin.calls == ["ListOffsets", "Metadata t", "ListOffsets"]


def test_still_stale_after_one_refresh_is_an_error_naming_the_partition() -> None:
    cluster = cluster_with(FakeAdmin(KafkaError.FENCED_LEADER_EPOCH, refreshes_needed=2))
    with pytest.raises(KafkaClusterError, match=r"list offsets of t-0 .*FENCED_LEADER_EPOCH"):
        cluster.log_start_offsets([("t", 0)])


def test_still_unanswered_after_one_refresh_is_an_error_naming_the_partition() -> None:
    admin = FakeAdmin(None, refreshes_needed=2)
    with pytest.raises(KafkaClusterError, match=r"list offsets of t-0: no answer within 1s"):
        cluster_with(admin).log_start_offsets([("t", 0)])
    assert admin.calls == ["ListOffsets", "Metadata t", "ListOffsets"]


def test_an_unreachable_cluster_is_a_cluster_error() -> None:
    admin = FakeAdmin(None)
    admin.unreachable = True
    with pytest.raises(KafkaClusterError, match=r"could not refresh the leaders of t .*_TRANSPORT"):
        cluster_with(admin).log_start_offsets([("t", 0)])


def test_other_errors_are_not_retried() -> None:
    admin = FakeAdmin(KafkaError.UNKNOWN_TOPIC_OR_PART)
    with pytest.raises(KafkaClusterError, match="UNKNOWN_TOPIC_OR_PART"):
        cluster_with(admin).log_start_offsets([("t", 0)])
    assert admin.calls == ["ListOffsets"]


class OffsetsAdmin:
    """Answers ListOffsets: earliest 0, latest ``ends`` (``stable`` under read_committed), leader epoch ``epoch``;
    records which partitions each read_committed request named."""

    def __init__(self, ends: dict[int, int], stable: dict[int, int]) -> None:
        self.ends, self.stable, self.epoch = ends, stable, 3
        self.committed_asks: list[list[int]] = []

    def list_offsets(self, request: dict[TopicPartition, Any], isolation_level: Any, **_: Any) -> dict:
        committed = isolation_level == IsolationLevel.READ_COMMITTED
        if committed:
            self.committed_asks.append(sorted(tp.partition for tp in request))
        futures = {}
        for tp, spec in request.items():
            latest = spec == OffsetSpec.latest()
            answer = Answer((self.stable if committed else self.ends)[tp.partition] if latest else 0)
            answer.leader_epoch = self.epoch
            future: Future = Future()
            future.set_result(answer)
            futures[tp] = future
        return futures


def test_settled_partitions_are_not_asked_for_their_stable_offset_again() -> None:
    admin = OffsetsAdmin(ends={0: 10, 1: 20, 2: 30}, stable={0: 10, 1: 15, 2: 30})
    cluster = cluster_with(admin)  # type: ignore[arg-type]
    parts = [("t", 0), ("t", 1), ("t", 2)]
    first = cluster.local_offsets(parts)
    assert [(o.lx, o.ly, o.lz) for o in first.values()] == [(0, 10, 10), (0, 15, 20), (0, 30, 30)]
    settled = {key: got for key, got in first.items() if got.ly == got.lz}

    again = cluster.local_offsets(parts, settled)
    assert again == first
    assert admin.committed_asks[-1] == [1], "a settled partition's Ly was asked again, or an open one's was not"

    admin.ends[2] = 31  # new records in 2 (a transaction may have opened there)
    admin.stable[2] = 30
    moved = cluster.local_offsets(parts, settled)
    assert admin.committed_asks[-1] == [1, 2]
    assert (moved[("t", 2)].ly, moved[("t", 2)].lz) == (30, 31)

    admin.epoch = 4  # a new leader: nothing earlier is trusted
    cluster.local_offsets(parts, settled)
    assert admin.committed_asks[-1] == [0, 1, 2]

    admin.epoch = 3
    cluster.local_offsets(parts, first)  # an answer with Ly < Lz given as settled is not trusted
    assert admin.committed_asks[-1] == [1, 2]


def test_a_stable_offset_answered_after_the_end_is_capped_at_that_end() -> None:
    """Ly is asked last; records committed between the two answers must not give Ly > Lz."""
    admin = OffsetsAdmin(ends={0: 10}, stable={0: 12})
    got = cluster_with(admin).local_offsets([("t", 0)])[("t", 0)]  # type: ignore[arg-type]
    assert (got.ly, got.lz) == (10, 10)
