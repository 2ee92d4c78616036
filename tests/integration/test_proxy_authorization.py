"""The access layer serves remote data only where the broker would: a KRaft broker with SASL (PLAIN and
SCRAM-SHA-512) and the StandardAuthorizer, the sidecar and the proxy's own clients as a super user, ``alice``
with READ on the tiered topic (and her groups), ``bob`` with none. Through the proxy, from offset 0, where
most of the topic is only in the remote copies: alice reads every record (librdkafka with either mechanism,
Kafka's Java console consumer); bob reads none; bob with DESCRIBE but not READ sending a raw Fetch is
refused as the broker refuses him; a socket that never logged in gets no record byte; an ACL removed while
alice reads the remote part is in force on her next fetch. Raw requests (``tests/kafka_wire.py``) are
answered by the broker directly too, as the reference the proxy must match."""

from __future__ import annotations

import contextlib
import datetime
import struct
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)
from kio.static.primitive import i32

from deploy.kafka import run_kafka_tool
from deploy.stack import Endpoints
from reader.proxy import ProxyServer
from reader.proxy.protocol import build, nested, request_type
from reader.proxy.tiered import TopicKey
from tests.integration.test_proxy_fetch_ahead import _after_last_batch
from tests.integration.test_sidecar_policies import SEGMENT, cli, running
from tests.kafka_wire import RawKafka, partition_errors, record_bytes
from tests.proxy_harness import console_consume, proxy_bootstrap, proxy_for, read_all
from tests.sasl_broker import CLIENTS, PASSWORD, USER, SaslBroker, sasl_broker
from tests.sidecar_harness import wait_for, write_config
from tiering_core.formats.records import iter_batches

pytestmark = pytest.mark.integration
TOPIC_AUTHORIZATION_FAILED = 29
COUNT = 6_000


@dataclass(frozen=True)
class Tiered:
    broker: SaslBroker
    proxy: ProxyServer
    topic: str
    topic_id: uuid.UUID
    produced: list[bytes]
    log_start: int  # the broker's log start once tiered: offsets below are only in the remote copies

    @property
    def proxy_broker(self) -> str:
        """The proxy's port that stands for the broker (node 1)."""
        return f"127.0.0.1:{self.proxy.router.port_for(1)}"

    def client(self, user: str, mechanism: str = "PLAIN", via_proxy: bool = True) -> dict[str, str]:
        config = self.broker.client_config(CLIENTS[user], user, mechanism)
        return {**config, "bootstrap.servers": proxy_bootstrap(self.proxy)} if via_proxy else config


def acl(user: str, resource: ResourceType, name: str, operation: AclOperation,
        pattern: ResourcePatternType = ResourcePatternType.LITERAL) -> AclBinding:  # fmt: skip
    return AclBinding(resource, name, pattern, f"User:{user}", "*", operation, AclPermissionType.ALLOW)


@pytest.fixture(scope="module")
def tiered(stack: Endpoints, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tiered]:
    tmp = tmp_path_factory.mktemp("proxy-authz")
    with sasl_broker(tmp / "kafka", authorizer=True) as broker:
        admin = AdminClient(broker.client_config())
        topic = f"authz-{uuid.uuid4().hex[:8]}"
        admin.create_topics([NewTopic(topic, 1, 1, config={"internal.segment.bytes": str(SEGMENT)})])[topic].result(60)
        produced = [f"authz-{i}-".encode() * 8 for i in range(COUNT)]
        producer = Producer({**broker.client_config(), "linger.ms": 5, "batch.size": 16384, "enable.idempotence": True})
        for value in produced:
            producer.produce(topic, value=value, partition=0)
            producer.poll(0)
        assert producer.flush(60) == 0
        _wait(admin.create_acls([acl("alice", ResourceType.TOPIC, topic, AclOperation.READ),
                                 acl("alice", ResourceType.GROUP, "alice-", AclOperation.READ,
                                     ResourcePatternType.PREFIXED)]))  # fmt: skip
        client = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN", "sasl.username": USER,
                  "sasl.password": PASSWORD}  # fmt: skip
        config = write_config(stack, tmp, bootstrap_servers=broker.bootstrap, log_dirs=[str(broker.log_dir)],
                              kafka_client=client)  # fmt: skip
        cli("topic", "enable", topic, "--local-retention-bytes", str(2 * SEGMENT), "--config", str(config))
        with running(config) as (ctx, sidecar):

            def released() -> bool:
                return ctx.cluster.local_offsets([(topic, 0)])[(topic, 0)].lx > COUNT // 2

            wait_for(released, 180, "uploads and local retention on the SASL broker", step=sidecar.tick)
            log_start = ctx.cluster.local_offsets([(topic, 0)])[(topic, 0)].lx
        with proxy_for(config, broker.bootstrap, admin_config=broker.client_config()) as proxy:
            # the proxy learns the topic's id and log start from the broker's answers, as from any client
            with RawKafka(f"127.0.0.1:{proxy.router.port_for(1)}") as raw:
                assert raw.sasl_plain("alice", CLIENTS["alice"]) == 0
                topic_id = raw.metadata(topic).topics[0].topic_id
                answer = raw.fetch(12, topic, topic_id, 0, log_start, 1024)
                assert answer is not None and partition_errors(answer) == [0]
            assert proxy.view.routes_remote(TopicKey(topic, topic_id), 0, 0), "offset 0 is not routed to remote"
            yield Tiered(broker, proxy, topic, topic_id, produced, log_start)


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-512"])
def test_alice_reads_every_record_through_the_proxy(tiered: Tiered, mechanism: str) -> None:
    got = read_all(proxy_bootstrap(tiered.proxy), tiered.topic, {0: COUNT},
                   **{**tiered.client("alice", mechanism), "group.id": f"alice-{mechanism}"})  # fmt: skip
    assert [m.offset() for m in got[0]] == list(range(COUNT)), "an offset is missing or repeated"
    assert [m.value() for m in got[0]] == tiered.produced, "records differ from those produced"


def test_alice_reads_every_record_with_kafka_console_consumer(tiered: Tiered, tmp_path: Path) -> None:
    properties = _java_client_properties(tmp_path, "alice")
    lines = console_consume(proxy_bootstrap(tiered.proxy), tiered.topic, COUNT,
                            extra=("--command-config", str(properties), "--group", "alice-console"))  # fmt: skip
    assert [offset for _, offset, _, _ in lines] == list(range(COUNT))
    assert [value for _, _, _, value in lines] == tiered.produced


def test_bob_without_acls_reads_nothing(tiered: Tiered, tmp_path: Path) -> None:
    errors: list[str] = []
    consumer = Consumer({**tiered.client("bob"), "group.id": "bob-group", "enable.auto.commit": False,
                         "error_cb": lambda e: errors.append(e.str())})  # fmt: skip
    try:
        consumer.assign([TopicPartition(tiered.topic, 0, 0)])
        records, deadline = [], time.monotonic() + 15
        while time.monotonic() < deadline:
            for m in consumer.consume(100, 0.5):
                if m.error() is None:
                    records.append(m.offset())
                else:
                    errors.append(m.error().str())
    finally:
        consumer.close()
    assert records == [], f"bob, with no ACL, got {len(records)} records"
    assert any("authoriz" in e.lower() for e in errors), errors[:5]

    properties = _java_client_properties(tmp_path, "bob")
    result = run_kafka_tool(
        "org.apache.kafka.tools.consumer.ConsoleConsumer", "--bootstrap-server", proxy_bootstrap(tiered.proxy),
        "--topic", tiered.topic, "--from-beginning", "--max-messages", "1", "--timeout-ms", "20000",
        "--command-config", str(properties), "--group", "bob-console", timeout=180,
    )  # fmt: skip
    values = {v.decode() for v in tiered.produced}
    output = result.stdout + result.stderr
    assert not [line for line in output.splitlines() if line in values], "records printed for bob"
    assert "Processed a total of 0 messages" in output and "TopicAuthorizationException" in output, output[-2000:]


@pytest.mark.parametrize("version", [12, 13])
def test_bob_with_describe_only_is_refused_a_raw_fetch(tiered: Tiered, version: int) -> None:
    """A raw Fetch for the tiered topic at offset 0 (no client library to hide it): the broker's own refusal,
    TOPIC_AUTHORIZATION_FAILED, and no record byte, through the proxy as from the broker."""
    admin = AdminClient(tiered.broker.client_config())
    _wait(admin.create_acls([acl("bob", ResourceType.TOPIC, tiered.topic, AclOperation.DESCRIBE)]))
    for address in (tiered.broker.bootstrap, tiered.proxy_broker):
        with RawKafka(address) as raw:
            assert raw.sasl_plain("bob", CLIENTS["bob"]) == 0
            answer = raw.fetch(version, tiered.topic, tiered.topic_id, 0, 0)
        assert answer is not None, f"{address} closed the connection"
        assert partition_errors(answer) == [TOPIC_AUTHORIZATION_FAILED], (address, answer)
        assert record_bytes(answer) == 0


@pytest.mark.parametrize("version", [12, 13])
def test_a_socket_that_never_logged_in_gets_no_record(tiered: Tiered, version: int) -> None:
    """Fetch before any SASL handshake: the broker closes the connection, and so the proxy's client is closed
    too, with nothing sent but what the broker sent."""
    for address in (tiered.broker.bootstrap, tiered.proxy_broker):
        with RawKafka(address) as raw:
            answer = raw.fetch(version, tiered.topic, tiered.topic_id, 0, 0)
            assert answer is None or record_bytes(answer) == 0, f"{address} answered records before login"
            assert raw.received < 1024, f"{address} sent {raw.received} bytes to a socket that never logged in"


def test_requests_before_login_are_bounded_as_on_the_broker(tiered: Tiered) -> None:
    """Kafka's sasl.server.max.receive.size (512 KiB): a larger request before login closes the connection;
    after login the same request is forwarded and answered."""
    big = b"\0" * (600 * 1024)
    before = tiered.proxy.metrics.closed_bad.labels("oversized")._value.get()
    with RawKafka(tiered.proxy_broker) as raw:
        raw.sock.settimeout(15)
        try:
            raw.sock.sendall(struct.pack(">i", len(big)) + big)
            closed = raw.sock.recv(1) == b""
        except ConnectionError:  # reset: the proxy closed it with the rest of the frame unread
            closed = True
        assert closed, "the proxy kept a connection that sent 600 KiB before logging in"
    assert tiered.proxy.metrics.closed_bad.labels("oversized")._value.get() == before + 1
    with RawKafka(tiered.proxy_broker) as raw:
        assert raw.sasl_plain("alice", CLIENTS["alice"]) == 0
        answer = raw.fetch(12, tiered.topic, tiered.topic_id, 0, 0, max_bytes=1 << 20)
        assert answer is not None and partition_errors(answer) == [0]
        produced = raw.request(0, 9, transactional_id=None, acks=1, timeout=datetime.timedelta(seconds=5),
                               topic_data=_produce_data(tiered.topic, big))  # fmt: skip
        assert produced is not None, "a 600 KiB request after login was refused"


def test_an_acl_removed_while_alice_reads_remote_data_holds_on_her_next_fetch(tiered: Tiered) -> None:
    admin = AdminClient(tiered.broker.client_config())
    with RawKafka(tiered.proxy_broker) as raw:
        assert raw.sasl_plain("alice", CLIENTS["alice"]) == 0
        first = raw.fetch(12, tiered.topic, tiered.topic_id, 0, 0, max_bytes=64 * 1024)
        assert first is not None and partition_errors(first) == [0] and record_bytes(first) > 0
        read_acl = acl("alice", ResourceType.TOPIC, tiered.topic, AclOperation.READ)
        _wait(admin.delete_acls([AclBindingFilter(read_acl.restype, read_acl.name, read_acl.resource_pattern_type,
                                                  read_acl.principal, read_acl.host, read_acl.operation,
                                                  read_acl.permission_type)]))  # fmt: skip
        try:
            with RawKafka(tiered.broker.bootstrap) as direct:  # the broker itself refuses her now
                assert direct.sasl_plain("alice", CLIENTS["alice"]) == 0

                def refused() -> bool:
                    answer = direct.fetch(12, tiered.topic, tiered.topic_id, 0, tiered.log_start, 1024)
                    return answer is not None and partition_errors(answer) == [TOPIC_AUTHORIZATION_FAILED]

                wait_for(refused, 30, "the broker applying the removed ACL")
            assert tiered.log_start > 100  # the next offset is still only in the remote copies
            after = raw.fetch(12, tiered.topic, tiered.topic_id, 0, 100, max_bytes=64 * 1024)
            assert after is not None and partition_errors(after) == [TOPIC_AUTHORIZATION_FAILED]
            assert record_bytes(after) == 0
        finally:
            _wait(admin.create_acls([read_acl]))


def test_an_acl_removed_after_alice_read_local_data_on_a_native_lane_holds_on_her_next_fetch(tiered: Tiered) -> None:
    """alice reads the broker's part (past its log start), each Fetch where the last answer's last batch ended (the
    one predicted), so her cycle runs on a native lane (reader/proxy/lane.py); once the broker refuses her, her next
    Fetch through the proxy is refused too, with no record byte. (With the default max age of 0.1 s her lane has
    given the connection back before the ACL is removed: what this shows is that nothing the lane held outlives it.)"""
    served = tiered.proxy.metrics.fetch_ahead.labels("served")
    runs = tiered.proxy.metrics.native_lane
    with RawKafka(tiered.proxy_broker) as raw:
        assert raw.sasl_plain("alice", CLIENTS["alice"]) == 0
        before, lanes_before = served._value.get(), sum(c._value.get() for c in runs._metrics.values())
        offset = tiered.log_start
        for _ in range(5):
            answer = raw.fetch(12, tiered.topic, tiered.topic_id, 0, offset, max_bytes=1024)
            assert answer is not None and partition_errors(answer) == [0] and record_bytes(answer) > 0
            offset = _after_last_batch(answer.responses[0].partitions[0].records)
        # a lane counts what it served when it ends (here: nothing asked within the max age)
        wait_for(lambda: served._value.get() - before >= 3, 30, "alice's answers served from answers asked ahead")
        with _read_acl_removed(tiered, offset):
            time.sleep(2 * tiered.proxy.settings.proxy.fetch_ahead_max_age_seconds)
            after = raw.fetch(12, tiered.topic, tiered.topic_id, 0, offset, max_bytes=1024)
            assert after is not None and partition_errors(after) == [TOPIC_AUTHORIZATION_FAILED]
            assert record_bytes(after) == 0
    assert sum(c._value.get() for c in runs._metrics.values()) > lanes_before, "no native lane ran"


def test_an_acl_removed_after_alice_read_remote_data_on_a_remote_lane_holds_on_her_next_fetch(tiered: Tiered) -> None:
    """alice catches up from remote storage (below the broker's log start), each Fetch where the last answer's last
    batch ended (the one predicted), so her cycle runs on a remote lane (reader/proxy/remote_lane.py) and she reads
    every record byte for byte from it; once the broker refuses her, her next Fetch through the proxy is refused
    too, with no record byte: the lane's probe is the broker's decision on every answer."""
    runs = tiered.proxy.metrics.remote_lane
    with RawKafka(tiered.proxy_broker) as raw:
        assert raw.sasl_plain("alice", CLIENTS["alice"]) == 0
        lanes_before = sum(c._value.get() for c in runs._metrics.values())
        offset, values = 0, {}
        while offset < tiered.log_start:
            answer = raw.fetch(12, tiered.topic, tiered.topic_id, 0, offset, max_bytes=4096)
            assert answer is not None and partition_errors(answer) == [0] and record_bytes(answer) > 0
            records = answer.responses[0].partitions[0].records
            values.update((r.offset, r.value) for batch in iter_batches("answer", records) for r in batch.records)
            offset = _after_last_batch(records)
        assert all(values[o] == tiered.produced[o] for o in range(offset)), "records differ or are missing"
        wait_for(lambda: sum(c._value.get() for c in runs._metrics.values()) > lanes_before, 30,
                 "a remote lane run ending")  # fmt: skip
        assert runs.labels("failed")._value.get() == 0
        with _read_acl_removed(tiered, tiered.log_start):
            time.sleep(2 * tiered.proxy.settings.proxy.fetch_ahead_max_age_seconds)
            after = raw.fetch(12, tiered.topic, tiered.topic_id, 0, 0, max_bytes=4096)
            assert after is not None and partition_errors(after) == [TOPIC_AUTHORIZATION_FAILED]
            assert record_bytes(after) == 0


@contextlib.contextmanager
def _read_acl_removed(tiered: Tiered, offset: int) -> Iterator[None]:
    """alice's READ on the topic removed, until the broker refuses her a Fetch at ``offset``; given back after."""
    admin = AdminClient(tiered.broker.client_config())
    read_acl = acl("alice", ResourceType.TOPIC, tiered.topic, AclOperation.READ)
    _wait(admin.delete_acls([AclBindingFilter(read_acl.restype, read_acl.name, read_acl.resource_pattern_type,
                                              read_acl.principal, read_acl.host, read_acl.operation,
                                              read_acl.permission_type)]))  # fmt: skip
    try:
        with RawKafka(tiered.broker.bootstrap) as direct:
            assert direct.sasl_plain("alice", CLIENTS["alice"]) == 0

            def refused() -> bool:
                answer = direct.fetch(12, tiered.topic, tiered.topic_id, 0, offset, 1024)
                return answer is not None and partition_errors(answer) == [TOPIC_AUTHORIZATION_FAILED]

            wait_for(refused, 30, "the broker applying the removed ACL")
        yield
    finally:
        _wait(admin.create_acls([read_acl]))


def _wait(futures: dict) -> None:  # type: ignore[type-arg]
    for future in futures.values():
        future.result(30)


def _java_client_properties(tmp_path: Path, user: str) -> Path:
    path = tmp_path / f"{user}.properties"
    jaas = (f'org.apache.kafka.common.security.plain.PlainLoginModule required username="{user}" '
            f'password="{CLIENTS[user]}";')  # fmt: skip
    path.write_text(f"security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\nsasl.jaas.config={jaas}\n")
    return path


def _produce_data(topic: str, records: bytes) -> tuple[Any, ...]:
    """Produce v9's topic_data: ``records`` for partition 0 of ``topic``."""
    topic_type = nested(request_type(0, 9), "topic_data")
    part_type = nested(topic_type, "partition_data")
    return (build(topic_type, name=topic, partition_data=(build(part_type, index=i32(0), records=records),)),)
