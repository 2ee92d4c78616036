"""The local stack really runs: Kafka round-trips records, MinIO serves ranged GETs, etcd stores keys."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import etcd3gw
import pytest
from click.testing import CliRunner, Result
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient

from deploy import stack as stack_mod
from deploy.stack import Endpoints
from tests.conftest import create_topic, stack_backend
from tiering.cli.main import main

pytestmark = [pytest.mark.integration, pytest.mark.containers]


def _produce(bootstrap: str, topic: str, count: int) -> list[tuple[bytes, bytes]]:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    sent = [(f"k{i}".encode(), uuid.uuid4().bytes * (i + 1)) for i in range(count)]
    for key, value in sent:
        producer.produce(topic, value=value, key=key)
    assert producer.flush(30) == 0
    return sent


def _consume(bootstrap: str, topic: str, count: int) -> list[tuple[bytes, bytes]]:
    """Read up to ``count`` records of ``topic`` from the start (gives up after ~60 s of polling)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex, "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    got: list[tuple[bytes, bytes]] = []
    for _ in range(120):
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is None:
            got.append((msg.key(), msg.value()))
        if len(got) == count:
            break
    consumer.close()
    return got


def test_kafka_round_trips_records(stack: Endpoints) -> None:
    topic = create_topic(stack.bootstrap)
    sent = _produce(stack.bootstrap, topic, 20)
    assert _consume(stack.bootstrap, topic, len(sent)) == sent


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
    assert [(b.pid, b.container) for b in again.brokers] == [(b.pid, b.container) for b in stack.brokers]


def test_dev_cli_restarts_a_stopped_stack_on_its_data(stack: Endpoints, tmp_path: Path) -> None:
    # ``stack`` first: if the components cannot start at all, this skips (or fails under CI) there.
    stack_dir = tmp_path / "dev"

    def dev(*args: str) -> Result:
        return CliRunner().invoke(main, ["dev", *args, "--dir", str(stack_dir)])

    try:
        assert (up := dev("up", "--backend", stack_backend())).exit_code == 0, up.output
        first = Endpoints.load(stack_dir / stack_mod.ENDPOINTS)
        topic = create_topic(first.bootstrap)
        sent = _produce(first.bootstrap, topic, 5)
        body = uuid.uuid4().bytes * 1000
        stack_mod.s3_client(first).put_object(Bucket=first.s3.bucket, Key="kept", Body=body)

        assert (down := dev("down")).exit_code == 0, down.output
        status = json.loads(dev("status", "--json").output)
        assert status["running"] is False and not any(status["alive"].values())
        wrong = dev("up", "--brokers", "3")
        assert wrong.exit_code != 0 and "has 1 broker(s)" in wrong.output

        assert (up := dev("up")).exit_code == 0, up.output
        second = Endpoints.load(stack_dir / stack_mod.ENDPOINTS)
        assert second.cluster_id == first.cluster_id and second.backend == stack_backend()
        assert _consume(second.bootstrap, topic, len(sent)) == sent
        got = stack_mod.s3_client(second).get_object(Bucket=second.s3.bucket, Key="kept")["Body"].read()
        assert got == body
    finally:
        stack_mod.stop(stack_dir)


def test_three_broker_cluster(stack3: Endpoints) -> None:
    admin = AdminClient({"bootstrap.servers": stack3.bootstrap})
    assert sorted(admin.list_topics(timeout=30).brokers) == [1, 2, 3]
    topic = create_topic(stack3.bootstrap, partitions=3, replication=3)
    partitions = admin.list_topics(topic, timeout=30).topics[topic].partitions
    assert all(sorted(p.replicas) == [1, 2, 3] for p in partitions.values())


def test_killed_broker_restarts_on_its_data(stack3: Endpoints) -> None:
    topic = create_topic(stack3.bootstrap, partitions=1, replication=3, min_insync_replicas=2)
    producer = Producer({"bootstrap.servers": stack3.bootstrap, "acks": "all"})
    producer.produce(topic, value=b"before-crash")
    assert producer.flush(30) == 0
    stack_mod.kill_broker(stack3, 3, hard=True)
    assert not stack_mod.components_alive(stack3)["kafka-3"]

    stack_mod.restart_broker(stack3, 3)
    assert stack_mod.components_alive(stack3)["kafka-3"]
    saved = Endpoints.load(Path(stack3.stack_dir) / stack_mod.ENDPOINTS).broker(3)
    assert (saved.pid, saved.container) == (stack3.broker(3).pid, stack3.broker(3).container)
    assert _wait_in_isr(stack3.bootstrap, topic, 3), "the restarted broker did not rejoin the ISR"


def _wait_in_isr(bootstrap: str, topic: str, broker_id: int, attempts: int = 120) -> bool:
    """Poll (0.5 s apart) until ``broker_id`` is in the ISR of partition 0 of ``topic``."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for _ in range(attempts):
        if broker_id in admin.list_topics(topic, timeout=10).topics[topic].partitions[0].isrs:
            return True
        time.sleep(0.5)
    return False
