"""A single KRaft Kafka broker whose only client listener needs SASL/PLAIN (``SASL_PLAINTEXT``), for the
tests of the ``kafka_client`` settings. Started from the local stack's jars by the tests that need it only,
so the shared stack stays as it is."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka.admin import AdminClient

from deploy import kafka
from deploy.procs import free_port, stop_groups, wait_ready

USER, PASSWORD = "tiering", "tiering-s3cret"
_JAAS = (
    'org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" password="admin-s3cret" '
    f'user_admin="admin-s3cret" user_{USER}="{PASSWORD}";'
)


@dataclass(frozen=True)
class SaslBroker:
    bootstrap: str
    log_dir: Path

    def client_config(self, password: str = PASSWORD) -> dict[str, str]:
        """librdkafka properties of a client that logs in as the test user."""
        return {"bootstrap.servers": self.bootstrap, "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
                "sasl.username": USER, "sasl.password": password}  # fmt: skip


@contextmanager
def sasl_broker(node_dir: Path) -> Iterator[SaslBroker]:
    """Start the broker in ``node_dir``, wait until it answers a logged-in client, stop it on exit."""
    port, controller = free_port(), free_port()
    listeners = {
        "controller.quorum.voters": f"1@127.0.0.1:{controller}",
        "listeners": f"SASL_PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}",
        "advertised.listeners": f"SASL_PLAINTEXT://127.0.0.1:{port}",
        "inter.broker.listener.name": "SASL_PLAINTEXT",
        "listener.security.protocol.map": "SASL_PLAINTEXT:SASL_PLAINTEXT,CONTROLLER:PLAINTEXT",
        "sasl.enabled.mechanisms": "PLAIN",
        "sasl.mechanism.inter.broker.protocol": "PLAIN",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": _JAAS,
    }
    kafka.write_node_files(node_dir, kafka.node_properties(1, 1, node_dir, listeners), node_dir)
    kafka.format_storage(node_dir, kafka.new_cluster_id())
    broker = SaslBroker(f"127.0.0.1:{port}", node_dir / "data")
    pid = kafka.start_node(node_dir)
    try:
        admin = AdminClient({**broker.client_config(), "socket.timeout.ms": 2000, "log_level": 0})  # quiet start
        wait_ready("SASL broker", pid, lambda: bool(admin.list_topics(timeout=2).brokers), node_dir / "server.log",
                   timeout=120)  # fmt: skip
        yield broker
    finally:
        stop_groups([pid], timeout=30)
