"""Which topics are never tiered: the rule ``tiering topic enable`` and the sidecar's loop share."""

from __future__ import annotations

import pytest

from tiering.policy.tierable import name_refusal, refusal
from tiering_core.kafka_cluster import TopicInfo

WAL = "tiering-wal"


def info(name: str, cleanup_policy: str = "delete") -> TopicInfo:
    return TopicInfo(name, "AAAAAAAAAAAAAAAAAAAAAA", (), {"cleanup.policy": cleanup_policy})


@pytest.mark.parametrize(
    ("name", "why"),
    [
        (WAL, "metadata WAL"),
        ("__tiering_metadata", "internal topic"),
        ("__consumer_offsets", "internal topic"),
        ("__transaction_state", "internal topic"),
        ("__cluster_metadata", "internal topic"),
        ("__share_group_state", "internal topic"),
        ("__remote_log_metadata", "internal topic"),
        ("wordcount-KSTREAM-AGGREGATE-STATE-STORE-0000000003-repartition", "Kafka Streams"),
        ("wordcount-counts-store-changelog", "Kafka Streams"),
        ("app-KTABLE-FK-JOIN-SUBSCRIPTION-REGISTRATION-0000000006-topic", "Kafka Streams"),
        ("app-orders-join-subscription-response-topic", "Kafka Streams"),
    ],
)
def test_internal_and_streams_topics_are_refused_by_name(name: str, why: str) -> None:
    reason = name_refusal(name, WAL)
    assert reason is not None and reason.startswith(f"cannot tier {name}: ") and why in reason
    assert "\n" not in reason
    assert refusal(info(name), WAL) == reason


@pytest.mark.parametrize("name", ["orders", "_schemas_backup", "orders-changelogs", "repartition-orders", "a__b"])
def test_ordinary_names_are_tiered(name: str) -> None:
    assert name_refusal(name, WAL) is None
    assert refusal(info(name), WAL) is None


@pytest.mark.parametrize("policy", ["compact", "compact,delete", "delete,compact"])
def test_compacted_topics_are_refused_connects_under_any_name(policy: str) -> None:
    for name in ("connect-offsets", "my-cluster-connect-configs", "orders"):
        reason = refusal(info(name, policy), WAL)
        assert reason == (f"cannot tier {name}: it has cleanup.policy={policy}, and compacted topics cannot be "
                          "tiered (Kafka's KIP-405 does not support them either)")  # fmt: skip
