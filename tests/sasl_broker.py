"""A single KRaft Kafka broker whose only client listener needs SASL (``SASL_PLAINTEXT``), for the tests of
the ``kafka_client`` settings and of what the access layer lets through. Started from the local stack's jars
by the tests that need it only, so the shared stack stays as it is.

With ``authorizer=True`` it enforces ACLs as a production cluster does: Kafka's StandardAuthorizer, SASL/PLAIN
and SCRAM-SHA-512, the sidecar's user (``tiering``) a super user, and two client principals with no ACL to
begin with, ``alice`` and ``bob`` (PLAIN passwords in the JAAS file, SCRAM credentials made through the
Admin API). The controller listener is plaintext on loopback; its anonymous principal is a super user so
the combined node can register itself."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka.admin import AdminClient, ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion

from deploy import kafka
from deploy.procs import free_port, stop_groups, wait_ready

USER, PASSWORD = "tiering", "tiering-s3cret"
CLIENTS = {"alice": "alice-s3cret", "bob": "bob-s3cret"}
_JAAS = (
    'org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" password="admin-s3cret" '
    f'user_admin="admin-s3cret" user_{USER}="{PASSWORD}"'
    + "".join(f' user_{name}="{secret}"' for name, secret in CLIENTS.items())
    + ";"
)


@dataclass(frozen=True)
class SaslBroker:
    bootstrap: str
    log_dir: Path

    def client_config(self, password: str = PASSWORD, user: str = USER, mechanism: str = "PLAIN") -> dict[str, str]:
        """librdkafka properties of a client that logs in as ``user`` (the sidecar's super user by default)."""
        return {"bootstrap.servers": self.bootstrap, "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": mechanism,
                "sasl.username": user, "sasl.password": password}  # fmt: skip


@contextmanager
def sasl_broker(node_dir: Path, authorizer: bool = False) -> Iterator[SaslBroker]:
    """Start the broker in ``node_dir``, wait until it answers a logged-in client, stop it on exit."""
    port, controller = free_port(), free_port()
    listeners = {
        "controller.quorum.voters": f"1@127.0.0.1:{controller}",
        "listeners": f"SASL_PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}",
        "advertised.listeners": f"SASL_PLAINTEXT://127.0.0.1:{port}",
        "inter.broker.listener.name": "SASL_PLAINTEXT",
        "listener.security.protocol.map": "SASL_PLAINTEXT:SASL_PLAINTEXT,CONTROLLER:PLAINTEXT",
        "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-512" if authorizer else "PLAIN",
        "sasl.mechanism.inter.broker.protocol": "PLAIN",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": _JAAS,
    }
    if authorizer:
        listeners |= {
            "listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config":
                "org.apache.kafka.common.security.scram.ScramLoginModule required;",
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users": f"User:admin;User:{USER};User:ANONYMOUS",
        }  # fmt: skip
    kafka.write_node_files(node_dir, kafka.node_properties(1, 1, node_dir, listeners), node_dir)
    kafka.format_storage(node_dir, kafka.new_cluster_id())
    broker = SaslBroker(f"127.0.0.1:{port}", node_dir / "data")
    pid = kafka.start_node(node_dir)
    try:
        admin = AdminClient({**broker.client_config(), "socket.timeout.ms": 2000, "log_level": 0})  # quiet start
        wait_ready("SASL broker", pid, lambda: bool(admin.list_topics(timeout=2).brokers), node_dir / "server.log",
                   timeout=120)  # fmt: skip
        if authorizer:
            upserts = [UserScramCredentialUpsertion(name, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192),
                                                    secret.encode()) for name, secret in CLIENTS.items()]  # fmt: skip
            for future in admin.alter_user_scram_credentials(upserts).values():
                future.result(30)
        yield broker
    finally:
        stop_groups([pid], timeout=30)
