"""When a ListOffsets answer means the admin client's idea of the leader is out of date, so the topic's metadata
is asked for again before one more try (tiering_core/kafka_cluster.py ``_leader_stale``): a TieredConsumer
handing over to the broker after the leader's broker stopped asks the log start this way."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace

import pytest
from confluent_kafka import KafkaError, KafkaException

from tiering_core.kafka_cluster import _leader_stale


def failed(code: int, text: str) -> Future:
    future: Future = Future()
    future.set_exception(KafkaException(KafkaError(code, text)))
    return future


def answered(offset: int) -> Future:
    future: Future = Future()
    future.set_result(SimpleNamespace(offset=offset))
    return future


@pytest.mark.parametrize(
    ("code", "text"),
    [
        (KafkaError._NOENT, "Failed to query partition leaders: No leaders found"),  # cached during an election
        (KafkaError.NOT_LEADER_FOR_PARTITION, "Broker: Not leader for partition"),
        (KafkaError.FENCED_LEADER_EPOCH, "Broker: Leader epoch is older than the broker's"),
        (KafkaError.LEADER_NOT_AVAILABLE, "Broker: Leader not available"),
    ],
)
def test_an_answer_about_leadership_asks_the_metadata_again(code: int, text: str) -> None:
    assert _leader_stale(failed(code, text), 1.0)


def test_no_answer_in_time_or_an_invalid_offset_asks_again_and_a_real_answer_does_not() -> None:
    assert _leader_stale(Future(), 0.05)  # queued for a stopped broker
    assert _leader_stale(answered(-1), 1.0)
    assert not _leader_stale(answered(5_000), 1.0)
    assert not _leader_stale(failed(KafkaError.TOPIC_AUTHORIZATION_FAILED, "Broker: Topic authorization failed"), 1.0)
