"""What the suite's leak check (``tests/kafka_clients.py``) counts as open, the holder it names, and
``KafkaCluster.close``. The cluster is unreachable on purpose: no client ever connects."""

from __future__ import annotations

import gc
import weakref

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient

from tests.kafka_clients import holders, is_open, open_clients
from tiering_core.kafka_cluster import KafkaCluster, KafkaClusterError

UNREACHABLE = {"bootstrap.servers": "127.0.0.1:1", "log_level": 0}


class Holder:
    def __init__(self) -> None:
        self.admin = AdminClient(UNREACHABLE)


class Keeper:
    def __init__(self) -> None:
        self.holder = Holder()


def test_closed_consumers_and_producers_are_released_an_admin_client_only_when_collected() -> None:
    consumer = Consumer({**UNREACHABLE, "group.id": "g"})
    producer = Producer(UNREACHABLE)
    assert is_open(consumer) and is_open(producer)
    consumer.close()
    producer.close()
    assert not is_open(consumer) and not is_open(producer)
    keeper = Keeper()
    gc.collect()
    found = [client for client in open_clients() if client is keeper.holder.admin]
    assert len(found) == 1
    assert holders(found[0], ignore=(found,)).startswith("Holder.admin <- Keeper.holder <- ")
    gone = weakref.ref(found[0])
    del found, keeper
    gc.collect()
    assert gone() is None


def test_a_closed_cluster_drops_its_admin_client() -> None:
    with KafkaCluster(UNREACHABLE["bootstrap.servers"]) as cluster:
        assert isinstance(cluster.admin, AdminClient)
    with pytest.raises(KafkaClusterError, match="closed"):
        cluster.broker_ids()
    cluster.close()  # idempotent
