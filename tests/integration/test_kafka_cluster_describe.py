"""What a sidecar's tick asks Kafka about the cluster: the tiered topics by name (a deleted one left out, not an
error) and the live brokers, on the real broker."""

from __future__ import annotations

import uuid

import pytest

from deploy.stack import Endpoints
from tests.conftest import create_topic
from tiering_core.kafka_cluster import KafkaCluster, KafkaClusterError

pytestmark = pytest.mark.integration


def test_a_missing_topic_is_left_out_only_when_asked_to(stack: Endpoints) -> None:
    present = create_topic(stack.bootstrap, partitions=3)
    missing = f"missing-{uuid.uuid4().hex[:8]}"
    with KafkaCluster(stack.bootstrap, timeout=10) as cluster:
        found = cluster.topics([present, missing], missing_ok=True)
        assert set(found) == {present}
        assert [p.partition for p in found[present].partitions] == [0, 1, 2]
        assert found[present].topic_id == cluster.topic_ids([present])[present]
        with pytest.raises(KafkaClusterError, match=f"describe topic {missing}"):
            cluster.topics([present, missing])


def test_broker_ids_are_the_live_brokers_from_one_describe_cluster(stack: Endpoints) -> None:
    requests: list[str] = []
    with KafkaCluster(stack.bootstrap, timeout=10, on_request=requests.append) as cluster:
        assert cluster.broker_ids() == [b.id for b in stack.brokers]
    assert requests == ["DescribeCluster"]
