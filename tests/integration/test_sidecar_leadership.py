"""Leases follow leadership, records carry the epoch of the partition's own leader, and a segment finished twice
is reconciled (one copy deleted through DELETE_SEGMENT_*, the size counted once)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from deploy import stack as stack_mod
from deploy.stack import Endpoints
from metadata import EtcdLeases, SegmentRecord
from segment_fsm import SegmentState
from tests.conftest import create_topic
from tests.integration.test_sidecar_failover import produce as produce_acked
from tests.integration.test_sidecar_policies import FINISHED, SEGMENT, cli, produce, refs, running
from tests.metadata_factory import TOPIC_ID
from tests.sidecar_harness import settings, sidecars_running, snapshot_segments, wait_for, write_config
from tiering.copier import LocalSegment
from tiering.policy import CopyDecision
from tiering.sidecar.context import SidecarContext
from tiering.sidecar.copy import CorruptSegments, copy_segment
from tiering.sidecar.facts import PartitionFacts, local_segments
from tiering.sidecar.partition_task import PartitionTask
from tiering.sidecar.retry import Scope
from tiering.sidecar.runner import Sidecar
from tiering.sidecar.writer import PartitionWriter
from tiering_core.formats import list_segments
from tiering_core.kafka_cluster import KafkaCluster
from tiering_core.objects import SegmentRef

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@dataclass
class Uploaded:
    topic: str
    topic_id: str
    partition_dir: Path
    originals: dict[int, bytes]  # the local segments before tiering, by base offset
    ctx: SidecarContext
    sidecar: Sidecar


@contextmanager
def uploaded(stack: Endpoints, tmp_path: Path, records: int, copies: int) -> Iterator[Uploaded]:
    """A topic of ``records`` records, tiering enabled, and a sidecar (running until the block ends) that
    has uploaded at least ``copies`` segments."""
    topic = create_topic(stack.bootstrap, internal_segment_bytes=SEGMENT)
    produce(stack.bootstrap, topic, records)
    partition_dir = Path(stack.broker(1).log_dir) / f"{topic}-0"
    originals = snapshot_segments(partition_dir, tmp_path / "originals")
    config = write_config(stack, tmp_path)
    cli("topic", "enable", topic, "--config", str(config))
    with running(config) as (ctx, sidecar):
        topic_id = ctx.cluster.topics([topic])[topic].topic_id
        wait_for(lambda: len(refs(ctx, topic, topic_id)) >= copies, 120, "uploads", step=sidecar.tick)
        yield Uploaded(topic, topic_id, partition_dir, originals, ctx, sidecar)


def test_a_segment_finished_twice_is_reconciled_and_its_size_counted_once(stack: Endpoints, tmp_path: Path) -> None:
    with uploaded(stack, tmp_path, 10_000, copies=3) as up:
        topic, topic_id, partition_dir, ctx, sidecar = up.topic, up.topic_id, up.partition_dir, up.ctx, up.sidecar
        first = ctx.manager.segments(topic_id, 0, FINISHED)[0]
        # What a crash left behind: a FINISHED record that landed late, for a copy of exactly the offsets
        # that the retry copied and finished too.
        segments = list_segments(partition_dir)
        files = next(f for f in segments if f.base_offset == first.base_offset)
        following = min(f.base_offset for f in segments if f.base_offset > first.base_offset)
        late = SegmentRef(topic, topic_id, 0, first.base_offset, uuid.uuid4())

        def record(state: SegmentState) -> SegmentRecord:
            return SegmentRecord(
                topic=topic, topic_id=topic_id, partition=0, segment_id=late.segment_id, state=state, broker_id=1,
                leader_epoch=first.leader_epoch, event_time=ctx.now_ms(), base_offset=first.base_offset,
                end_offset=first.end_offset, max_timestamp=first.max_timestamp, size=first.size,
            )  # fmt: skip

        assert ctx.manager.publish(record(SegmentState.COPY_SEGMENT_STARTED)).accepted
        ctx.copier.copy(late, LocalSegment(files, following), size=first.size)
        assert ctx.manager.publish(record(SegmentState.COPY_SEGMENT_FINISHED)).accepted
        same = [s for s in ctx.manager.segments(topic_id, 0, FINISHED) if s.base_offset == first.base_offset]
        assert len(same) == 2

        def reconciled() -> bool:
            copies = ctx.manager.segments(topic_id, 0, FINISHED)
            return [s.base_offset for s in copies].count(first.base_offset) == 1

        wait_for(reconciled, 60, "the duplicate copy to be deleted", step=sidecar.tick)
        sidecar.tick()  # the metrics after a full step
        finished = ctx.manager.segments(topic_id, 0, FINISHED)
        kept = next(s for s in finished if s.base_offset == first.base_offset)
        gone_id = late.segment_id.bytes if kept.segment_id == first.segment_id else first.segment_id
        gone = SegmentRef(topic, topic_id, 0, first.base_offset, uuid.UUID(bytes=gone_id))
        every = {s.segment_id: s.state for s in ctx.manager.segments(topic_id, 0)}
        assert every[gone.segment_id.bytes] == SegmentState.DELETE_SEGMENT_FINISHED
        objects = set(ctx.store.list_keys(""))
        assert not set(gone.object_keys()) & objects, "the duplicate's objects remain"
        ref = SegmentRef(topic, topic_id, 0, kept.base_offset, uuid.UUID(bytes=kept.segment_id))
        assert ctx.store.get_bytes(ref.key("log")) == up.originals[kept.base_offset]
        size = ctx.metrics.registry.get_sample_value(
            "tiering_remote_log_size_bytes", {"topic": topic, "partition": "0"}
        )
        assert size == sum(s.size for s in finished), "RemoteLogSizeBytes counts a segment twice"
        state = ctx.manager.partition_state(topic_id, 0)
        assert state is not None and state.remote_size == state.stored_size == size


def test_release_deletes_only_the_holders_own_lease_key(stack: Endpoints) -> None:
    prefix = f"/tiering-test-{uuid.uuid4().hex[:8]}"
    a = EtcdLeases(stack.etcd.url, "broker-1", ttl=30, prefix=prefix)
    b = EtcdLeases(stack.etcd.url, "broker-2", ttl=30, prefix=prefix)
    try:
        token_a = a.acquire(TOPIC_ID, 0)
        assert token_a is not None and b.acquire(TOPIC_ID, 0) is None
        a.release(TOPIC_ID, 0)  # a stops leading the partition: b may take it at once
        token_b = b.acquire(TOPIC_ID, 0)
        assert token_b is not None and token_b > token_a
        assert a.acquire(TOPIC_ID, 0) is None
        b.client.delete(b.key(TOPIC_ID, 0))  # b's key vanishes (an operator); a takes the partition again ...
        token_a2 = a.acquire(TOPIC_ID, 0)
        assert token_a2 is not None
        b.release(TOPIC_ID, 0)  # ... and b, which has not noticed yet, lets go of what it thinks it holds
        found = a.client.get(a.key(TOPIC_ID, 0), metadata=True)
        assert found and int(found[0][1]["create_revision"]) == token_a2, "a release deleted another holder's key"
        assert a.is_held(TOPIC_ID, 0)
    finally:
        a.close()
        b.close()


def shared_configs(stack3: Endpoints, tmp_path: Path, **overrides: object) -> dict[int, Path]:
    shared = {"prefix": f"it-{uuid.uuid4().hex[:8]}", "metadata_topic": f"__tiering_metadata_{uuid.uuid4().hex[:8]}"}
    return {b.id: write_config(stack3, tmp_path, broker=b.id, **shared, **overrides) for b in stack3.brokers}


def test_a_deposed_leader_never_writes_with_the_new_leaders_epoch(stack3: Endpoints, tmp_path: Path) -> None:
    topic = create_topic(stack3.bootstrap, replication=3, internal_segment_bytes=SEGMENT, min_insync_replicas=2)
    produce_acked(stack3.bootstrap, topic, 0, 10_000, {})
    configs = shared_configs(stack3, tmp_path)
    cli("topic", "enable", topic, "--config", str(configs[1]))
    cluster = KafkaCluster(stack3.bootstrap)
    info = cluster.topics([topic])[topic]
    old_leader = info.partitions[0].leader
    assert old_leader is not None
    deposed = SidecarContext.build(settings(configs[old_leader]))
    deposed.manager.start()
    try:
        old_epoch = cluster.local_offsets([(topic, 0)])[(topic, 0)].leader_epoch
        stack_mod.kill_broker(stack3, old_leader, hard=False)  # leadership moves to another broker
        wait_for(lambda: cluster.topics([topic])[topic].partitions[0].leader not in (None, old_leader),
                 60, "a new leader")  # fmt: skip
        # The deposed leader's sidecar still believes it leads (its view of the cluster is one answer
        # old): it runs the partition's step with what Kafka answers now.
        offsets = deposed.cluster.local_offsets([(topic, 0)])[(topic, 0)]
        assert offsets.leader_epoch > old_epoch  # the answer came from the new leader
        task = PartitionTask(deposed, topic, info.topic_id, 0)
        facts = PartitionFacts(
            topic=info, partition=0, partition_dir=Path(stack3.broker(old_leader).log_dir) / f"{topic}-0",
            offsets=offsets, tiering=deposed.manager.topic_state(topic)[1], uploads_allowed=True,
            tiered=True,
        )  # fmt: skip
        task.step(facts)
        written = deposed.manager.segments(info.topic_id, 0)
        assert written == [], f"the deposed leader wrote {len(written)} copies with epoch {offsets.leader_epoch}"
        assert "another broker leads the partition" in (task.status.last_error or "")
    finally:
        deposed.close()
        stack_mod.restart_broker(stack3, old_leader)


def test_the_lease_follows_leadership_to_the_new_leaders_sidecar(stack3: Endpoints, tmp_path: Path) -> None:
    topic = create_topic(stack3.bootstrap, replication=3, internal_segment_bytes=SEGMENT, min_insync_replicas=2)
    produced: dict[int, bytes] = {}
    produce_acked(stack3.bootstrap, topic, 0, 20_000, produced)
    configs = shared_configs(stack3, tmp_path, etcd_url=stack3.etcd.url, upload_bytes_per_second=400_000)
    cli("topic", "enable", topic, "--config", str(configs[1]))
    with sidecars_running(configs) as sidecars:
        observer = SidecarContext.build(settings(configs[1]), writes_snapshots=False)
        observer.manager.start()
        old_leader = None
        try:
            info = observer.cluster.topics([topic])[topic]
            topic_id, old_leader = info.topic_id, info.partitions[0].leader
            assert old_leader is not None
            wait_for(lambda: len(observer.manager.segments(topic_id, 0, FINISHED)) >= 3, 120, "the leader to upload")
            # The leader's broker stops; its sidecar keeps running (and its etcd lease alive), as when the broker
            # is restarted or its leadership moves to a preferred replica.
            stack_mod.kill_broker(stack3, old_leader, hard=False)
            produce_acked(stack3.bootstrap, topic, 20_000, 10_000, produced)  # offsets only the new leader has
            new_leader = observer.cluster.topics([topic])[topic].partitions[0].leader
            assert new_leader not in (None, old_leader)
            wait_for(
                lambda: observer.manager.partition_state(topic_id, 0).remote_end_offset > 22_000,
                180, "the new leader's sidecar to take the lease and upload what only it has",
            )  # fmt: skip
            # A tick that fails (the stopped broker makes some request time out) releases every lease until the
            # next tick confirms leadership again, so the key is looked for until then, not read once.
            leases = sidecars[new_leader].ctx.leases
            assert leases is not None
            key = leases.key(topic_id, 0)

            def holder() -> str | None:
                found = leases.client.get(key, metadata=True)
                return found[0][0].decode() if found else None

            wait_for(lambda: holder() == f"broker-{new_leader}", 60, f"broker {new_leader}'s sidecar to hold {key}")
            assert (topic_id, 0) not in sidecars[old_leader].tasks
            finished = observer.manager.segments(topic_id, 0, FINISHED)
            assert max(s.leader_epoch for s in finished) > min(s.leader_epoch for s in finished)
        finally:
            observer.close()
            if old_leader is not None:
                stack_mod.restart_broker(stack3, old_leader)


def test_a_copy_decided_on_a_stale_view_is_abandoned_before_any_upload(stack: Endpoints, tmp_path: Path) -> None:
    """The race of a leader change: the deposed leader's in-flight copy finishes just before the new leader, whose
    metadata had not applied that record yet, decides to copy the same offsets. The new leader's STARTED is applied
    after the FINISHED, so it sees the copy and uploads nothing; there is never a second FINISHED copy."""
    with uploaded(stack, tmp_path, 6_000, copies=2) as up:
        topic, topic_id, partition_dir, ctx = up.topic, up.topic_id, up.partition_dir, up.ctx
        first = ctx.manager.segments(topic_id, 0, FINISHED)[0]
        local = local_segments(partition_dir)
        seg = next(s for s, _ in local if s.base_offset == first.base_offset)
        before = set(ctx.store.list_keys(""))
        writer = PartitionWriter(ctx, Scope(topic, topic_id, 0), first.leader_epoch, 0)
        stale = CopyDecision(seg, first.end_offset, after_hole=False)  # what a view without the FINISHED record decides

        assert copy_segment(writer, stale, local, CorruptSegments())

        copies = ctx.manager.segments(topic_id, 0)
        finished = [s for s in copies if s.state == SegmentState.COPY_SEGMENT_FINISHED]
        assert [s.base_offset for s in finished].count(first.base_offset) == 1, "a second FINISHED copy"
        ours = [s for s in copies if s.base_offset == first.base_offset and s.segment_id != first.segment_id]
        assert [s.state for s in ours] == [SegmentState.DELETE_SEGMENT_FINISHED]
        assert set(ctx.store.list_keys("")) == before, "objects were uploaded for the stale decision"
