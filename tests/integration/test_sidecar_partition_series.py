"""A partition's metric series and status entry live on its current leader's sidecar only: they go when the
leadership moves to another broker, when the topic is deleted, and when it is rolled back with nothing
remote left (while copies are left, retention still runs there and nothing counts as copy lag)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient
from prometheus_client.parser import text_string_to_metric_families

from deploy import stack as stack_mod
from deploy.procs import free_port
from deploy.stack import Endpoints
from tests.conftest import create_topic
from tests.integration.test_sidecar_failover import produce as produce_acked
from tests.integration.test_sidecar_policies import SEGMENT, cli, produce, refs, running
from tests.integration.test_sidecar_visibility import get
from tests.sidecar_harness import sidecars_running, wait_for, write_config

pytestmark = pytest.mark.integration


def series(port: int, topic: str) -> dict[tuple[str, str], float]:
    """The samples about ``topic`` on the sidecar's /metrics: (name, partition) -> value."""
    status, _, text = get(port, "/metrics")
    assert status == 200
    return {
        (s.name, s.labels["partition"]): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.labels.get("topic") == topic
    }


def status_rows(port: int) -> dict[str, dict]:
    """Every partition /status shows, led or not, by ``<topicId>/<partition>``."""
    status, _, body = get(port, "/status")
    assert status == 200
    doc = json.loads(body)
    return {**doc["partitions"], **doc["other_partitions"]}


def test_the_old_leaders_sidecar_drops_the_partitions_series_and_status(stack3: Endpoints, tmp_path: Path) -> None:
    topic = create_topic(stack3.bootstrap, replication=3, internal_segment_bytes=SEGMENT, min_insync_replicas=2)
    produce_acked(stack3.bootstrap, topic, 0, 10_000, {})
    shared = {"prefix": f"it-{uuid.uuid4().hex[:8]}", "metadata_topic": f"__tiering_metadata_{uuid.uuid4().hex[:8]}"}
    ports = {b.id: free_port() for b in stack3.brokers}
    configs = {b: write_config(stack3, tmp_path, broker=b, metrics_port=port, **shared) for b, port in ports.items()}
    cli("topic", "enable", topic, "--config", str(configs[1]))
    old_leader = None
    with sidecars_running(configs) as sidecars:
        try:
            ctx = sidecars[1].ctx
            info = ctx.cluster.topics([topic])[topic]
            topic_id, old_leader = info.topic_id, info.partitions[0].leader
            assert old_leader is not None
            key = f"{topic_id}/0"
            wait_for(lambda: len(refs(ctx, topic, topic_id)) >= 2, 120, "the leader to upload")
            wait_for(lambda: key in status_rows(ports[old_leader]), 60, "the leader's status row")
            before = series(ports[old_leader], topic)
            assert before[("tiering_remote_copy_segments_total", "0")] >= 1
            assert ("tiering_remote_copy_lag_bytes", "0") in before
            stack_mod.kill_broker(stack3, old_leader, hard=False)  # a controlled shutdown: leadership moves
            new_leader = ctx.cluster.topics([topic])[topic].partitions[0].leader
            assert new_leader not in (None, old_leader)
            wait_for(lambda: not series(ports[old_leader], topic) and key not in status_rows(ports[old_leader]),
                     120, "the old leader's sidecar to drop the partition's series and status")  # fmt: skip
            assert (topic_id, 0) not in sidecars[old_leader].tasks and (topic_id, 0) not in sidecars[old_leader].led
            wait_for(lambda: ("tiering_remote_copy_lag_bytes", "0") in series(ports[new_leader], topic), 120,
                     "the new leader's sidecar to show the partition")  # fmt: skip
            assert key in status_rows(ports[new_leader])
            others = [b for b in ports if b != new_leader]
            assert all(not series(ports[b], topic) and key not in status_rows(ports[b]) for b in others)
        finally:
            if old_leader is not None:
                stack_mod.restart_broker(stack3, old_leader)


def test_deleted_and_rolled_back_topics_leave_no_frozen_series(stack: Endpoints, tmp_path: Path) -> None:
    rolled, deleted = (create_topic(stack.bootstrap, internal_segment_bytes=SEGMENT) for _ in range(2))
    for topic in (rolled, deleted):
        produce(stack.bootstrap, topic, 6_000)
    port = free_port()
    config = write_config(stack, tmp_path, metrics_port=port)
    for topic in (rolled, deleted):
        cli("topic", "enable", topic, "--config", str(config))
    with running(config) as (ctx, sidecar):
        infos = ctx.cluster.topics([rolled, deleted])
        ids = {t: infos[t].topic_id for t in (rolled, deleted)}
        wait_for(lambda: all(len(refs(ctx, t, ids[t])) >= 2 for t in ids), 120, "uploads", step=sidecar.tick)
        assert all(f"{ids[t]}/0" in status_rows(port) and series(port, t) for t in ids)

        admin = AdminClient({"bootstrap.servers": stack.bootstrap})
        admin.delete_topics([deleted])[deleted].result(60)
        wait_for(lambda: not series(port, deleted) and f"{ids[deleted]}/0" not in status_rows(port), 60,
                 "the deleted topic's series and status to go", step=sidecar.tick)  # fmt: skip

        cli("topic", "rollback", rolled, "--config", str(config))
        produce(stack.bootstrap, rolled, 6_000)  # rolled segments that will never be copied
        sidecar.tick()
        assert (ids[rolled], 0) in sidecar.tasks, "remote copies are left: their retention still runs"
        assert series(port, rolled)[("tiering_remote_copy_lag_segments", "0")] == 0
        assert status_rows(port)[f"{ids[rolled]}/0"]["copy_lag_segments"] == 0
        cli("topic", "rollback", rolled, "--delete-remote", "--yes", "--config", str(config))
        wait_for(lambda: not series(port, rolled) and f"{ids[rolled]}/0" not in status_rows(port), 60,
                 "the rolled-back topic's series and status to go", step=sidecar.tick)  # fmt: skip
        assert (ids[rolled], 0) not in sidecar.tasks
