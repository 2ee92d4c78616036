"""Through the proxy on the real stack: a consumer group of three while producing (transactions included)
moves the local boundary, admin calls, and Kafka's GetOffsetShell asking earliest and by timestamp."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from deploy.kafka import run_kafka_tool
from deploy.stack import Endpoints
from tests.fault_proxy import TcpProxy
from tests.proxy_harness import check_exact, proxy_bootstrap, proxy_for, read_all
from tests.reader_harness import TieredTopic, expected, tiered_topic
from tests.sidecar_harness import produce_mixed

pytestmark = pytest.mark.integration
PARTITIONS = 3


@pytest.fixture(scope="module")
def tiered(stack: Endpoints, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TieredTopic]:
    with tiered_topic(
        stack, tmp_path_factory.mktemp("proxy-clients"), records=8_000, partitions=PARTITIONS, local_retention=64 * 1024
    ) as t:
        yield t


class Member(threading.Thread):
    """A group member through the proxy; commits its positions when partitions are revoked."""

    def __init__(self, bootstrap: str, group: str, topic: str, got: dict[int, list[tuple[int, tuple]]],
                 lock: threading.Lock, stop: threading.Event) -> None:  # fmt: skip
        super().__init__(daemon=True)
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                                  "enable.auto.commit": False, "session.timeout.ms": 10_000})  # fmt: skip
        self.topic, self.got, self.lock, self.stop = topic, got, lock, stop
        self.rebalances = 0

    def _revoked(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.rebalances += 1
        positions = [tp for tp in consumer.position(partitions) if tp.offset >= 0]
        if positions:
            consumer.commit(offsets=positions, asynchronous=False)

    def run(self) -> None:
        self.consumer.subscribe([self.topic], on_revoke=self._revoked)
        try:
            while not self.stop.is_set():
                messages = self.consumer.consume(500, 0.5)
                with self.lock:
                    for m in messages:
                        assert m.error() is None, m.error()
                        self.got.setdefault(m.partition(), []).append(
                            (m.offset(), (m.key(), m.value(), list(m.headers() or [])))
                        )
                if messages:
                    self.consumer.commit(asynchronous=False)
        finally:
            self.consumer.close()


def test_group_of_three_while_producing_through_the_proxy(stack: Endpoints, tiered: TieredTopic) -> None:
    """Three members of one group read every record exactly once (commits on revoke), byte for byte, from
    offset 0 while a producer writes through the proxy (idempotent and transactional) and the sidecar
    moves the broker's log start under them."""
    with proxy_for(tiered.config, stack.bootstrap) as proxy:
        bootstrap = proxy_bootstrap(proxy)
        got: dict[int, list[tuple[int, tuple]]] = {}
        lock, stop = threading.Lock(), threading.Event()
        group = f"proxy-group-{time.monotonic_ns()}"
        members = [Member(bootstrap, group, tiered.topic, got, lock, stop) for _ in range(3)]
        for m in members:
            m.start()
            time.sleep(1)
        starts = {p: tiered.log_start(p) for p in range(PARTITIONS)}
        more = {p: produce_mixed(bootstrap, tiered.topic, 3_000, seed=100_000 + p * 10_000, partition=p)
                for p in range(PARTITIONS)}  # fmt: skip
        ends = {p: tiered.end_offset(p) for p in range(PARTITIONS)}
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            with lock:
                if all(len({o for o, _ in got.get(p, [])}) >= len(expected({**tiered.by_partition[p], **more[p]}, True))
                       for p in range(PARTITIONS)):  # fmt: skip
                    break
            time.sleep(1)
        stop.set()
        for m in members:
            m.join(60)
        remote = proxy.metrics.fetch_partitions.labels("remote")._value.get()
    assert remote > 0
    assert sum(m.rebalances for m in members) >= 1
    moved = [p for p in range(PARTITIONS) if tiered.log_start(p) > starts[p]]
    assert moved, "the sidecar did not move any log start while the group read"
    for p in range(PARTITIONS):
        want = expected({**tiered.by_partition[p], **more[p]}, read_committed=True)  # librdkafka's default
        assert max(want) < ends[p]
        check_exact(sorted(got.get(p, [])), want)


def test_read_committed_with_aborted_transactions_in_remote_data(stack: Endpoints, tiered: TieredTopic) -> None:
    """The aborted transaction is below the broker's log start: only the remote copies' transaction index
    can tell a read_committed client to drop it; the proxy's answer does, and the committed one is kept."""
    produced = tiered.by_partition[0]
    aborted = [o for o, r in produced.items() if (r[0] or b"").startswith(b"txn-False-")]
    assert aborted and max(aborted) < tiered.log_start(0), "the aborted transaction is not remote only"
    with proxy_for(tiered.config, stack.bootstrap) as proxy:
        messages = read_all(proxy_bootstrap(proxy), tiered.topic, {0: max(produced) + 1},
                            **{"isolation.level": "read_committed"})[0]  # fmt: skip
    first_round = [m for m in messages if m.offset() <= max(produced)]  # the group test produced more after
    check_exact([(m.offset(), (m.key(), m.value(), list(m.headers() or []))) for m in first_round],
                expected(produced, read_committed=True))  # fmt: skip


def test_admin_calls_through_the_proxy(stack: Endpoints, tiered: TieredTopic) -> None:
    """Create, describe and delete a topic and describe the cluster through the proxy: the cluster's answers,
    with every broker address the proxy's own."""
    with proxy_for(tiered.config, stack.bootstrap) as proxy:
        bootstrap = proxy_bootstrap(proxy)
        admin = AdminClient({"bootstrap.servers": bootstrap})
        name = f"proxy-admin-{time.monotonic_ns()}"
        admin.create_topics([NewTopic(name, 2, 1)])[name].result(30)
        metadata = admin.list_topics(timeout=30)
        assert name in metadata.topics and len(metadata.topics[name].partitions) == 2
        assert all(b.host == "127.0.0.1" and b.port in proxy.settings.proxy.broker_ports.values()
                   for b in metadata.brokers.values())  # fmt: skip
        cluster = admin.describe_cluster(request_timeout=30).result(30)
        assert {n.port for n in cluster.nodes} <= set(proxy.settings.proxy.broker_ports.values())
        admin.delete_topics([name])[name].result(30)


def test_get_offset_shell_earliest_and_by_time(stack: Endpoints, tiered: TieredTopic) -> None:
    """Kafka's GetOffsetShell (Java admin ListOffsets) through the proxy: earliest is the remote start (0), not
    the broker's log start; a timestamp of a record below the log start finds that record's offset."""
    ends = {0: tiered.end_offset(0)}
    log_start = tiered.log_start(0)
    with proxy_for(tiered.config, stack.bootstrap) as proxy:
        bootstrap = proxy_bootstrap(proxy)
        messages = read_all(bootstrap, tiered.topic, ends)[0]
        middle = next(m for m in messages if m.offset() >= log_start // 2)
        ts = middle.timestamp()[1]
        want = min(m.offset() for m in messages if m.timestamp()[1] >= ts)
        earliest = _offset_shell(bootstrap, tiered.topic, "-2")
        by_time = _offset_shell(bootstrap, tiered.topic, str(ts))
    assert earliest == 0 < log_start
    assert by_time == want < log_start


def _offset_shell(bootstrap: str, topic: str, time_spec: str) -> int:
    result = run_kafka_tool("org.apache.kafka.tools.GetOffsetShell", "--bootstrap-server", bootstrap,
                            "--topic", topic, "--partitions", "0", "--time", time_spec, timeout=120)  # fmt: skip
    line = next((x for x in result.stdout.splitlines() if x.startswith(f"{topic}:0:")), None)
    assert line is not None, f"GetOffsetShell printed {result.stdout!r} {result.stderr[-1500:]}"
    return int(line.rsplit(":", 1)[1])


def test_store_outage_is_retried_by_the_client_and_nothing_is_skipped(stack: Endpoints, tiered: TieredTopic) -> None:
    """The store goes away while a consumer reads the remote part through the proxy: the proxy answers
    KAFKA_STORAGE_ERROR for the partition (the connection stays), the client retries the same offset, and
    after the store is back every record arrives once."""
    target = urlparse(stack.s3.endpoint_url)
    store = TcpProxy(target.hostname or "127.0.0.1", target.port or 80)
    settings = yaml.safe_load(tiered.config.read_text())
    settings["remote_storage"]["endpoint_url"] = f"http://127.0.0.1:{store.port}"
    settings.update(read_attempts=2, read_retry_backoff_seconds=0.1, fetch_window_bytes=64 * 1024, prefetch_windows=0)
    config = tiered.config.with_name("proxy-outage.yaml")
    config.write_text(yaml.safe_dump(settings))
    produced = tiered.by_partition[1]
    end = max(produced) + 1
    try:
        with proxy_for(config, stack.bootstrap) as proxy:
            consumer = Consumer({"bootstrap.servers": proxy_bootstrap(proxy), "group.id": f"o-{time.monotonic_ns()}",
                                 "enable.auto.commit": False, "isolation.level": "read_uncommitted",
                                 "max.partition.fetch.bytes": 16384})  # fmt: skip
            consumer.assign([TopicPartition(tiered.topic, 1, 0)])
            got: list[Any] = []
            while len(got) < 300:
                got += [m for m in consumer.consume(100, 1.0) if m.error() is None]
            store.cut()
            deadline = time.monotonic() + 8
            while time.monotonic() < deadline:
                got += [m for m in consumer.consume(100, 0.5) if m.error() is None]
            errors = proxy.metrics.remote_errors._value.get()
            store.restore()
            deadline = time.monotonic() + 120
            while (not got or got[-1].offset() < end - 1) and time.monotonic() < deadline:
                got += [m for m in consumer.consume(500, 1.0) if m.error() is None]
            consumer.close()
    finally:
        store.close()
    assert errors > 0, "the outage never reached a remote read"
    records = [(m.offset(), (m.key(), m.value(), list(m.headers() or []))) for m in got if m.offset() < end]
    check_exact(records, expected(produced, read_committed=False))


def test_consumer_groups_reset_to_earliest_reaches_the_remote_start(stack: Endpoints, tiered: TieredTopic) -> None:
    """kafka-consumer-groups --reset-offsets --to-earliest through the proxy commits the remote start (0), not
    the broker's log start."""
    group = f"reset-{time.monotonic_ns()}"
    with proxy_for(tiered.config, stack.bootstrap) as proxy:
        result = run_kafka_tool("org.apache.kafka.tools.consumer.group.ConsumerGroupCommand", "--bootstrap-server",
                                proxy_bootstrap(proxy), "--group", group, "--topic", f"{tiered.topic}:0",
                                "--reset-offsets", "--to-earliest", "--execute", timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    line = next(x for x in result.stdout.splitlines() if tiered.topic in x)
    assert line.split()[-1] == "0" and tiered.log_start(0) > 0, result.stdout


def test_a_group_continues_through_another_proxy_instance(stack: Endpoints, tiered: TieredTopic) -> None:
    """Stateless: a group member reads part of the remote data through one instance and commits; the group
    continues through a second instance (the first one stopped) from the committed offset: every record once."""
    produced = tiered.by_partition[2]
    want = expected(produced, read_committed=True)
    end = max(produced) + 1
    split = tiered.log_start(2) // 2  # the first instance stops in the remote part
    config = {"group.id": f"two-{time.monotonic_ns()}", "enable.auto.commit": False, "auto.offset.reset": "earliest"}
    got: list[tuple[int, tuple]] = []
    for first in (True, False):
        with proxy_for(tiered.config, stack.bootstrap) as proxy:
            consumer = Consumer({"bootstrap.servers": proxy_bootstrap(proxy), **config})
            consumer.assign([TopicPartition(tiered.topic, 2)])  # at the committed offset (none yet: earliest)
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not (got and got[-1][0] >= (split if first else max(want))):
                for m in consumer.consume(1, 1.0):
                    if m.error() is None and m.offset() < end:
                        got.append((m.offset(), (m.key(), m.value(), list(m.headers() or []))))
            consumer.commit(offsets=[TopicPartition(tiered.topic, 2, got[-1][0] + 1)], asynchronous=False)
            consumer.close()
    check_exact(got, want)
