"""KafkaCluster asks for fresh metadata and sends ListOffsets again when leadership moved under it."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from tiering_core.kafka_cluster import KafkaCluster, KafkaClusterError


class Answer:
    def __init__(self, offset: int) -> None:
        self.offset = offset
        self.leader_epoch = 3


class FakeAdmin:
    """Answers ListOffsets with ``error`` until ``list_topics`` was called ``refreshes_needed`` times."""

    def __init__(self, error: int, refreshes_needed: int = 1) -> None:
        self.error = error
        self.refreshes_needed = refreshes_needed
        self.calls: list[str] = []

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> None:
        self.calls.append(f"Metadata {topic}")
        self.refreshes_needed -= 1

    def list_offsets(self, request: dict[TopicPartition, Any], **_: Any) -> dict[TopicPartition, Future]:
        self.calls.append("ListOffsets")
        futures = {}
        for tp in request:
            future: Future = Future()
            if self.refreshes_needed > 0:
                future.set_exception(KafkaException(KafkaError(self.error)))
            else:
                future.set_result(Answer(42))
            futures[tp] = future
        return futures


def cluster_with(admin: FakeAdmin) -> KafkaCluster:
    cluster = KafkaCluster("127.0.0.1:1", timeout=1)
    cluster._admin = admin  # type: ignore[assignment]
    return cluster


@pytest.mark.parametrize("code", [KafkaError.FENCED_LEADER_EPOCH, KafkaError.NOT_LEADER_FOR_PARTITION])
def test_a_stale_leader_is_refreshed_and_asked_again(code: int) -> None:
    admin = FakeAdmin(code)
    cluster = cluster_with(admin)
    assert cluster.log_start_offsets([("t", 0), ("t", 1)]) == {("t", 0): 42, ("t", 1): 42}
    assert admin.calls == ["ListOffsets", "Metadata t", "ListOffsets"]


def test_still_stale_after_one_refresh_is_an_error_naming_the_partition() -> None:
    cluster = cluster_with(FakeAdmin(KafkaError.FENCED_LEADER_EPOCH, refreshes_needed=2))
    with pytest.raises(KafkaClusterError, match=r"list offsets of t-0 .*FENCED_LEADER_EPOCH"):
        cluster.log_start_offsets([("t", 0)])


def test_other_errors_are_not_retried() -> None:
    admin = FakeAdmin(KafkaError.UNKNOWN_TOPIC_OR_PART)
    with pytest.raises(KafkaClusterError, match="UNKNOWN_TOPIC_OR_PART"):
        cluster_with(admin).log_start_offsets([("t", 0)])
    assert admin.calls == ["ListOffsets"]
