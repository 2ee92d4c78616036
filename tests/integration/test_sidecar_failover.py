"""Leader failover on three brokers: the new leader's sidecar continues from Ry + 1 with its own segment
boundaries, no offset is missing, overlapping copies agree, and the old leader's late records are fenced."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from confluent_kafka import Producer

from deploy import stack as stack_mod
from deploy.stack import Endpoints
from metadata import SegmentRecord
from segment_fsm import SegmentState
from tests.conftest import create_topic
from tests.integration.test_sidecar_policies import cli
from tests.sidecar_harness import decoded_offsets, settings, sidecars_running, wait_for, write_config
from tiering.sidecar.context import SidecarContext
from tiering_core.kafka_cluster import KafkaClusterError
from tiering_core.objects import SegmentRef

pytestmark = [pytest.mark.integration, pytest.mark.slow]
FINISHED = [SegmentState.COPY_SEGMENT_FINISHED]


def produce(bootstrap: str, topic: str, start: int, count: int, produced: dict[int, bytes]) -> None:
    errors: list[object] = []

    def report(err: object, msg: object) -> None:
        if err:
            errors.append(err)
        else:
            produced[msg.offset()] = msg.value()  # type: ignore[attr-defined]

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "batch.size": 16384,
                         "enable.idempotence": True})  # fmt: skip
    for i in range(start, start + count):
        producer.produce(topic, value=f"record-{i}-".encode() * 6, on_delivery=report)
        if i % 2000 == 0:
            producer.poll(0)
    assert producer.flush(240) == 0 and not errors, errors[:3]


def tiered_on_three_brokers(
    stack3: Endpoints, tmp_path: Path, produced: dict[int, bytes]
) -> tuple[str, dict[int, Path]]:
    """A topic replicated on the three brokers (64 KiB segments) holding 20,000 records, tiered with a local
    retention of four segments, and a sidecar config per broker (one prefix and metadata topic, 400 kB/s
    uploads): the topic's name and the configs by broker id."""
    topic = create_topic(stack3.bootstrap, replication=3, internal_segment_bytes=64 * 1024, min_insync_replicas=2)
    produce(stack3.bootstrap, topic, 0, 20_000, produced)
    shared = {"prefix": f"it-{uuid.uuid4().hex[:8]}", "metadata_topic": f"__tiering_metadata_{uuid.uuid4().hex[:8]}"}
    configs = {
        b.id: write_config(stack3, tmp_path, broker=b.id, upload_bytes_per_second=400_000, **shared)
        for b in stack3.brokers
    }
    cli("topic", "enable", topic, "--local-retention-bytes", str(4 * 64 * 1024), "--config", str(configs[1]))
    return topic, configs


def partition_leader(observer: SidecarContext, topic: str) -> tuple[str, int]:
    """The topic's id and its partition 0's leader, once the sidecars' metadata has the topic."""
    wait_for(lambda: observer.manager.topic_state(topic) is not None, 60, "the sidecars to start")
    info = observer.cluster.topics([topic])[topic]
    leader = info.partitions[0].leader
    assert leader is not None
    return info.topic_id, leader


def test_new_leader_continues_from_remote_end_and_old_leader_is_fenced(stack3: Endpoints, tmp_path: Path) -> None:
    produced: dict[int, bytes] = {}
    topic, configs = tiered_on_three_brokers(stack3, tmp_path, produced)
    with sidecars_running(configs) as sidecars:
        observer = SidecarContext.build(settings(configs[1]), writes_snapshots=False)  # outlives any one sidecar
        observer.manager.start()
        try:
            topic_id, old_leader = partition_leader(observer, topic)
            old_epoch = observer.cluster.local_offsets([(topic, 0)])[(topic, 0)].leader_epoch
            wait_for(lambda: len(observer.manager.segments(topic_id, 0, FINISHED)) >= 3, 120, "the leader to upload")
            # The leader's broker goes away while its sidecar is still uploading (rate limited). SIGTERM: a
            # controlled shutdown, as in a rolling restart; a SIGKILL of a KRaft voter on two loaded cores
            # can leave the controller quorum flapping for minutes, which tests Kafka, not the sidecar.
            stack_mod.kill_broker(stack3, old_leader, hard=False)
            sidecars[old_leader].stop()
            ry_at_failover = observer.manager.partition_state(topic_id, 0).remote_end_offset
            produce(stack3.bootstrap, topic, 20_000, 10_000, produced)
            # the controller may still be settling after the broker left (the stop no longer waits a request
            # timeout per remaining operation): ask until it answers with a new leader
            leaders: list[int | None] = []

            def led_elsewhere() -> bool:
                try:
                    leaders.append(observer.cluster.topics([topic])[topic].partitions[0].leader)
                except KafkaClusterError:
                    return False
                return leaders[-1] not in (None, old_leader)

            wait_for(led_elsewhere, 120, "a new leader of the partition")
            wait_for(
                lambda: observer.manager.partition_state(topic_id, 0).remote_end_offset > ry_at_failover + 5_000,
                240, "the new leader's sidecar to continue the uploads",
            )  # fmt: skip
            late = SegmentRecord(
                topic=topic, topic_id=topic_id, partition=0, segment_id=uuid.uuid4(),
                state=SegmentState.COPY_SEGMENT_STARTED, broker_id=old_leader, leader_epoch=old_epoch,
                event_time=0, base_offset=ry_at_failover + 1, end_offset=ry_at_failover + 10, size=1,
            )  # fmt: skip
            result = observer.manager.publish(late)
            assert not result.accepted and "fenced" in (result.reason or "")
            finished = observer.manager.segments(topic_id, 0, FINISHED)
        finally:
            observer.close()
            stack_mod.restart_broker(stack3, old_leader)

    epochs = {s.leader_epoch for s in finished}
    assert len(epochs) >= 2, "no copy was made by the new leader"
    remote: dict[int, bytes | None] = {}
    previous_end = -1
    for seg in finished:
        assert seg.base_offset <= previous_end + 1, f"hole before remote segment {seg.base_offset}"
        previous_end = max(previous_end, seg.end_offset)
        ref = SegmentRef(topic, topic_id, 0, seg.base_offset, uuid.UUID(bytes=seg.segment_id))
        body = observer.store.get_bytes(ref.key("log"))
        for offset, (_, value, _, _) in decoded_offsets(body, ref.key("log")).items():
            assert remote.setdefault(offset, value) == value, f"overlapping copies disagree at {offset}"
    ry = max(s.end_offset for s in finished)
    assert all(remote[o] == produced[o] for o in range(ry + 1) if o in produced)
    assert set(range(ry + 1)) <= set(remote), "an offset below Ry is in no remote copy"
