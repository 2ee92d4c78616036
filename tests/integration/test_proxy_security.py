"""The proxy with security: SASL/PLAIN passes through to a SASL broker (clients log in as themselves), TLS
towards clients, and its Prometheus metrics."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from deploy.procs import free_port
from deploy.stack import Endpoints
from reader.proxy import ProxyTls
from tests.proxy_harness import proxy_bootstrap, proxy_for
from tests.sasl_broker import PASSWORD, USER, SaslBroker, sasl_broker
from tests.sidecar_harness import write_config
from tests.tls import self_signed

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SaslBroker]:
    with sasl_broker(tmp_path_factory.mktemp("proxy-sasl")) as b:
        yield b


def produce_and_read(config: dict[str, str], topic: str, count: int = 200) -> list[bytes]:
    producer = Producer({**config, "enable.idempotence": True})
    for i in range(count):
        producer.produce(topic, value=f"record-{i}".encode(), partition=0)
    assert producer.flush(60) == 0
    consumer = Consumer({**config, "group.id": f"g-{time.monotonic_ns()}", "auto.offset.reset": "earliest"})
    consumer.assign([TopicPartition(topic, 0, 0)])
    values: list[bytes] = []
    deadline = time.monotonic() + 60
    while len(values) < count and time.monotonic() < deadline:
        values += [m.value() for m in consumer.consume(500, 1.0) if m.error() is None]
    consumer.close()
    return values


def test_sasl_plain_passes_through(stack: Endpoints, broker: SaslBroker, tmp_path: Path) -> None:
    """Clients authenticate to the broker through the proxy (SaslHandshake, SaslAuthenticate forwarded as
    they are): the right password produces and consumes, a wrong one is refused by the broker."""
    config = write_config(stack, tmp_path, bootstrap_servers=broker.bootstrap, kafka_client={
        "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN", "sasl.username": USER,
        "sasl.password": PASSWORD})  # fmt: skip
    with proxy_for(config, broker.bootstrap, admin_config=broker.client_config()) as proxy:
        through = {**broker.client_config(), "bootstrap.servers": proxy_bootstrap(proxy)}
        topic = f"sasl-{time.monotonic_ns()}"
        admin = AdminClient(through)
        admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
        assert produce_and_read(through, topic) == [f"record-{i}".encode() for i in range(200)]
        errors: list[str] = []
        wrong = {**broker.client_config("wrong-password"), "bootstrap.servers": proxy_bootstrap(proxy),
                 "error_cb": lambda e: errors.append(e.str())}  # fmt: skip
        refused = AdminClient(wrong)
        with pytest.raises(KafkaException):
            refused.list_topics(timeout=10)
        refused.poll(2)  # serves the error callbacks
        assert any("Authentication failed: Invalid username or password" in e for e in errors), errors


def test_tls_towards_clients_and_metrics(stack: Endpoints, tmp_path: Path) -> None:
    """Clients connect with security.protocol=SSL (the proxy's certificate verified) to a plaintext cluster;
    a plaintext client is not served; /metrics counts the requests by API and source."""
    cert, key = self_signed(tmp_path, "proxy")
    metrics_port = free_port()
    config = write_config(stack, tmp_path)
    with proxy_for(config, stack.bootstrap, tls=ProxyTls(cert_file=cert, key_file=key),
                   metrics_port=metrics_port) as proxy:  # fmt: skip
        tls = {"bootstrap.servers": proxy_bootstrap(proxy), "security.protocol": "SSL",
               "ssl.ca.location": str(cert)}  # fmt: skip
        topic = f"tls-{time.monotonic_ns()}"
        admin = AdminClient(tls)
        admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
        assert produce_and_read(tls, topic) == [f"record-{i}".encode() for i in range(200)]
        plain = AdminClient({"bootstrap.servers": proxy_bootstrap(proxy), "socket.timeout.ms": 3000})
        with pytest.raises(KafkaException):
            plain.create_topics([NewTopic(f"{topic}-plain", 1, 1)])[f"{topic}-plain"].result(15)
        text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
    assert 'tiering_proxy_requests_total{api="produce",source="broker"}' in text
    assert 'tiering_proxy_requests_total{api="fetch",source="broker"}' in text
    assert "tiering_proxy_connections " in text and "tiering_reader_memory_pool_bytes" in text
