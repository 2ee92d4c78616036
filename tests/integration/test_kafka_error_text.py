"""Kafka's errors reach the user as sentences naming what was asked, of which topic and partition, and which
cluster answered, never as librdkafka's ``KafkaError{code=...,val=...,str=...}``."""

from __future__ import annotations

import re
import uuid

import pytest

from deploy.stack import Endpoints
from tiering_core.kafka_cluster import KafkaCluster, KafkaClusterError

pytestmark = pytest.mark.integration


def test_a_kafka_error_is_a_sentence_naming_topic_partition_and_cluster(stack: Endpoints) -> None:
    missing = f"missing-{uuid.uuid4().hex[:8]}"
    with pytest.raises(KafkaClusterError) as raised:
        KafkaCluster(stack.bootstrap, timeout=10).delete_records_before(missing, 0, 5)
    text = str(raised.value)
    assert "KafkaError{" not in text, text
    assert text.startswith(f"could not delete records of {missing}-0 before 5 (Kafka at {stack.bootstrap}): "), text
    assert re.search(r": [A-Z][^{}]+ \([A-Z_]+\)$", text), text  # librdkafka's sentence, then the code's name
