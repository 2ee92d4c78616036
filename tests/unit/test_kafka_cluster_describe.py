"""A describe that timed out is retried on a fresh admin client, and the old one stays alive for calls other
threads have in flight on it (dropping it would destroy its handle under them: _DESTROY)."""

from __future__ import annotations

import gc
import weakref
from concurrent.futures import Future
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from tiering_core import kafka_cluster
from tiering_core.kafka_cluster import KafkaCluster


class TimingOutAdmin:
    """Answers every describe with librdkafka's local timeout."""

    def describe_topics(self, topics: Any, **_: Any) -> dict[str, Future]:
        return {name: self._timed_out() for name in topics.topic_names}

    def describe_configs(self, resources: list, **_: Any) -> dict[Any, Future]:
        return {resource: self._timed_out() for resource in resources}

    @staticmethod
    def _timed_out() -> Future:
        future: Future = Future()
        future.set_exception(KafkaException(KafkaError(KafkaError._TIMED_OUT)))
        return future


def test_the_replaced_client_lives_until_the_next_replacement_or_close(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kafka_cluster, "admin_client", lambda config: TimingOutAdmin())
    cluster = KafkaCluster("127.0.0.1:1", timeout=1)
    first = weakref.ref(cluster.admin)
    with pytest.raises(kafka_cluster.KafkaClusterError, match="Timed out"):
        cluster.topics(["t"])
    gc.collect()
    assert first() is not None and first() is not cluster.admin, "the replaced client was dropped at once"
    with pytest.raises(kafka_cluster.KafkaClusterError, match="Timed out"):
        cluster.topics(["t"])
    gc.collect()
    assert first() is None, "an older client than the last replaced one is kept"
    second = weakref.ref(cluster._retired)  # type: ignore[arg-type]
    cluster.close()
    gc.collect()
    assert second() is None
