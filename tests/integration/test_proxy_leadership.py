"""Through the proxy on three brokers: a consumer reads a tiered topic from offset 0 while its leader goes away
(a controlled shutdown) and comes back; producing continues through the proxy; nothing is missed or repeated. A
Fetch at a broker that does not lead the partition gets the leader's address at the proxy, or none (KIP-951),
never the broker's."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from deploy import stack as stack_mod
from deploy.stack import Endpoints
from tests.conftest import create_topic
from tests.integration.test_sidecar_failover import produce
from tests.integration.test_sidecar_policies import cli
from tests.kafka_wire import RawKafka
from tests.proxy_harness import check_exact, proxy_bootstrap, proxy_for
from tests.sidecar_harness import sidecars_running, wait_for, write_config
from tiering_core.kafka_cluster import KafkaCluster, KafkaClusterError

pytestmark = [pytest.mark.integration, pytest.mark.slow]
NOT_LEADER_OR_FOLLOWER = 6


@pytest.mark.parametrize("fetch_ahead", [False, True], ids=["spliced", "read-for-fetch-ahead"])
@pytest.mark.parametrize("advertised", ["127.0.0.1", "a-proxy-name-longer-than-the-brokers.example"])
def test_a_fetch_at_a_broker_that_does_not_lead_names_the_leader_at_the_proxy(stack3: Endpoints, tmp_path: Path,
                                                                              advertised: str,
                                                                              fetch_ahead: bool) -> None:  # fmt: skip
    """Fetch v16+ answers NOT_LEADER_OR_FOLLOWER with the leader's id and address (KIP-951): the client must never
    get the broker's address (it would take it around the proxy). Spliced, the answer goes on as it arrives, its
    size fixed before the address comes (reader/proxy/splice.py): for a proxy host as long as the broker's
    (127.0.0.1) the endpoint is the proxy's; for a longer one it is left out (the client asks Metadata for the
    leader, as before KIP-951). Read whole (fetch ahead reads the answers it predicts from), it is rewritten to
    the proxy's address at any length. The answer parses either way."""
    topic = create_topic(stack3.bootstrap, partitions=1, replication=1)
    leaders: list[int] = []
    with KafkaCluster(stack3.bootstrap) as cluster:

        def described() -> bool:  # a broker may not know the new topic yet (UNKNOWN_TOPIC_OR_PART)
            try:
                leaders.append(cluster.topics([topic])[topic].partitions[0].leader)
            except KafkaClusterError:
                return False
            return True

        wait_for(described, 30, "the new topic in the cluster's metadata")
    leader = leaders[-1]
    other = next(b.id for b in stack3.brokers if b.id != leader)
    config = write_config(stack3, tmp_path, broker=1)
    with (
        proxy_for(config, stack3.bootstrap, advertised_host=advertised, fetch_ahead=fetch_ahead) as proxy,
        RawKafka(f"127.0.0.1:{proxy.router.port_for(other)}") as raw,
    ):
        described = raw.metadata(topic)
        assert described is not None
        for version in (16, 17):
            answer = raw.fetch(version, topic, described.topics[0].topic_id, 0, 0)
            assert answer is not None, f"Fetch v{version}: the answer did not parse"
            partition = answer.responses[0].partitions[0]
            assert partition.error_code == NOT_LEADER_OR_FOLLOWER and partition.current_leader.leader_id == leader
            assert proxy.router.broker_address(leader) is not None
            assert proxy.router.broker_address(leader)[0] == "127.0.0.1"  # the two cases are the ones named above
            endpoints = {int(e.node_id): (e.host, int(e.port)) for e in answer.node_endpoints}
            if advertised == "127.0.0.1" or fetch_ahead:
                assert endpoints == {leader: (advertised, proxy.router.port_for(leader))}
            else:
                assert endpoints == {}


def test_reading_through_the_proxy_while_leadership_moves(stack3: Endpoints, tmp_path: Path) -> None:
    topic = create_topic(stack3.bootstrap, replication=3, internal_segment_bytes=64 * 1024, min_insync_replicas=2)
    produced: dict[int, bytes] = {}
    produce(stack3.bootstrap, topic, 0, 20_000, produced)
    shared = {"prefix": f"it-{uuid.uuid4().hex[:8]}", "metadata_topic": f"__tiering_metadata_{uuid.uuid4().hex[:8]}"}
    configs = {b.id: write_config(stack3, tmp_path, broker=b.id, **shared) for b in stack3.brokers}
    cli("topic", "enable", topic, "--local-retention-bytes", str(4 * 64 * 1024), "--config", str(configs[1]))
    cluster = KafkaCluster(stack3.bootstrap)
    with sidecars_running(configs) as sidecars:
        wait_for(lambda: cluster.local_offsets([(topic, 0)])[(topic, 0)].lx > 5_000, 240, "tiering and local deletion")
        with proxy_for(configs[1], stack3.bootstrap) as proxy:
            bootstrap = proxy_bootstrap(proxy)
            got: list[tuple[int, bytes]] = []
            stop = threading.Event()

            def read() -> None:
                consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"lead-{uuid.uuid4().hex[:6]}",
                                     "enable.auto.commit": False, "auto.offset.reset": "earliest"})  # fmt: skip
                consumer.assign([TopicPartition(topic, 0, 0)])
                while not stop.is_set():
                    for m in consumer.consume(200, 0.5):
                        assert m.error() is None or m.error().retriable(), m.error()
                        if m.error() is None:
                            got.append((m.offset(), m.value()))
                    time.sleep(0.05)  # a slow reader: the move happens while it is in the remote part
                consumer.close()

            reader = threading.Thread(target=read, daemon=True)
            reader.start()
            wait_for(lambda: len(got) > 2_000, 120, "the reader to start")
            leader = cluster.topics([topic])[topic].partitions[0].leader
            assert leader is not None
            stack_mod.kill_broker(stack3, leader, hard=False)
            sidecars[leader].stop()
            try:
                produce(bootstrap, topic, 20_000, 5_000, produced)  # through the proxy, to the new leader
                wait_for(lambda: len(got) >= len(produced) or (got and got[-1][0] >= max(produced)), 300,
                         "the reader to reach the end")  # fmt: skip
            finally:
                stop.set()
                reader.join(60)
                stack_mod.restart_broker(stack3, leader)
    check_exact([(o, (v,)) for o, v in got], {o: (v,) for o, v in produced.items()})
