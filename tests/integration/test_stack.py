"""The local stack really runs: Kafka round-trips records, MinIO serves ranged GETs, etcd stores keys."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import etcd3gw
import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient

from deploy import stack as stack_mod
from deploy.stack import Endpoints
from tests.conftest import create_topic

pytestmark = pytest.mark.integration


def test_kafka_round_trips_records(stack: Endpoints) -> None:
    topic = create_topic(stack.bootstrap)
    producer = Producer({"bootstrap.servers": stack.bootstrap, "enable.idempotence": True})
    sent = [(f"k{i}".encode(), uuid.uuid4().bytes * (i + 1)) for i in range(20)]
    for key, value in sent:
        producer.produce(topic, value=value, key=key)
    assert producer.flush(30) == 0
    consumer = Consumer(
        {"bootstrap.servers": stack.bootstrap, "group.id": topic, "auto.offset.reset": "earliest"}
    )
    consumer.subscribe([topic])
    got: list[tuple[bytes, bytes]] = []
    for _ in range(120):
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is None:
            got.append((msg.key(), msg.value()))
        if len(got) == len(sent):
            break
    consumer.close()
    assert got == sent


def test_s3_ranged_get_returns_exact_bytes(stack: Endpoints, s3: Any) -> None:
    body = bytes(range(256)) * 4096
    key = f"stack-test/{uuid.uuid4().hex}"
    s3.put_object(Bucket=stack.s3.bucket, Key=key, Body=body)
    got = s3.get_object(Bucket=stack.s3.bucket, Key=key, Range="bytes=1000-4999")["Body"].read()
    assert got == body[1000:5000]
    s3.delete_object(Bucket=stack.s3.bucket, Key=key)


def test_etcd_put_get(stack: Endpoints) -> None:
    host, port = stack.etcd.url.removeprefix("http://").split(":")
    client = etcd3gw.client(host=host, port=int(port))
    key = f"/stack-test/{uuid.uuid4().hex}"
    client.put(key, "value-1")
    assert client.get(key) == [b"value-1"]


def test_start_is_idempotent(stack: Endpoints) -> None:
    again = stack_mod.start(Path(stack.stack_dir), brokers=len(stack.brokers))
    assert again.bootstrap == stack.bootstrap
    assert [b.pid for b in again.brokers] == [b.pid for b in stack.brokers]


def test_three_broker_cluster(stack3: Endpoints) -> None:
    admin = AdminClient({"bootstrap.servers": stack3.bootstrap})
    assert sorted(admin.list_topics(timeout=30).brokers) == [1, 2, 3]
    topic = create_topic(stack3.bootstrap, partitions=3, replication=3)
    partitions = admin.list_topics(topic, timeout=30).topics[topic].partitions
    assert all(sorted(p.replicas) == [1, 2, 3] for p in partitions.values())
