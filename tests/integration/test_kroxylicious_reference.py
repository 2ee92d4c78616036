"""The reference proxy of ``tiering bench proxy``: Kroxylicious from its Maven Central jars
(``deploy/kroxylicious.py``), in front of the three-node stack. What it serves must be what the brokers hold,
or the benchmark's ratio compares us with something that does not read the same records."""

from __future__ import annotations

import psutil
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from deploy.kroxylicious import start_kroxylicious
from deploy.stack import Endpoints
from tests.conftest import create_topic

pytestmark = pytest.mark.integration


def test_kroxylicious_serves_every_partition_of_three_brokers_byte_for_byte_on_loopback_only(
    stack3: Endpoints, tmp_path
) -> None:
    topic = create_topic(stack3.bootstrap, partitions=6, replication=3)
    produced: dict[tuple[int, int], bytes] = {}

    def delivered(err, msg) -> None:  # type: ignore[no-untyped-def]
        assert err is None, err
        produced[(msg.partition(), msg.offset())] = msg.value()

    producer = Producer({"bootstrap.servers": stack3.bootstrap, "acks": "all"})
    for i in range(600):
        producer.produce(topic, value=f"record {i} ".encode() * (1 + i % 7), partition=i % 6, on_delivery=delivered)
    assert producer.flush(60) == 0
    proxy = start_kroxylicious(tmp_path / "kroxylicious", stack3.bootstrap, [b.id for b in stack3.brokers])
    try:
        listening = [c.laddr for c in psutil.Process(proxy.pid).net_connections("tcp") if c.status == "LISTEN"]
        assert len(listening) == 1 + len(stack3.brokers), listening  # bootstrap and one port per node
        assert {addr.ip.removeprefix("::ffff:") for addr in listening} == {"127.0.0.1"}, listening
        consumer = Consumer({"bootstrap.servers": proxy.bootstrap, "group.id": "reference",
                             "enable.auto.commit": False})  # fmt: skip
        metadata = consumer.list_topics(topic, timeout=30)
        leaders = {p.leader for p in metadata.topics[topic].partitions.values()}
        assert leaders == {b.id for b in stack3.brokers}, leaders  # every node's port is read from
        assert {(b.host, b.port) for b in metadata.brokers.values()} <= {(a.ip.removeprefix("::ffff:"), a.port)
                                                                        for a in listening}  # fmt: skip
        consumer.assign([TopicPartition(topic, p, 0) for p in range(6)])
        read: dict[tuple[int, int], bytes] = {}
        while len(read) < len(produced):
            message = consumer.poll(30)
            assert message is not None, f"{len(read)} of {len(produced)} records read through Kroxylicious"
            assert message.error() is None, message.error()
            read[(message.partition(), message.offset())] = message.value()
        consumer.close()
    finally:
        proxy.stop()
    assert read == produced
