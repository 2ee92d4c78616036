"""The metadata WAL on the real broker, recovery from snapshots, and leases in the real etcd."""

from __future__ import annotations

import json
import logging
import time
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner
from confluent_kafka.admin import AdminClient, ConfigResource
from etcd3gw.lease import Lease

from deploy.stack import Endpoints
from metadata import (
    EtcdLeases,
    LocalDirSnapshotStore,
    MetadataManager,
    MetadataWal,
    SegmentRecord,
    TopicRecord,
)
from metadata.snapshot import local_snapshots
from segment_fsm import SegmentState, TopicAction
from tests.metadata_factory import TOPIC_ID, seg
from tiering.cli.main import main

pytestmark = pytest.mark.integration
S = SegmentState


def new_wal(stack: Endpoints, topic: str) -> MetadataWal:
    return MetadataWal(stack.bootstrap, topic=topic, partitions=8)


def history(n_segments: int, partitions: int = 4, epoch: int = 1) -> list[SegmentRecord]:
    records = []
    for i in range(n_segments):
        sid = uuid.uuid4()
        p = i % partitions
        base = (i // partitions) * 100
        records.append(seg(sid, S.COPY_SEGMENT_STARTED, base, base + 99, partition=p, epoch=epoch))
        records.append(seg(sid, S.COPY_SEGMENT_FINISHED, base, base + 99, partition=p, epoch=epoch))
        if i % 7 == 0:
            records.append(seg(sid, S.DELETE_SEGMENT_STARTED, base, base + 99, partition=p, epoch=epoch))
    return records


def bulk(wal: MetadataWal, records: list) -> None:
    for r in records:
        wal.produce_async(wal.partition_for(r), r.encode())
    wal.flush()


def replay(
    stack: Endpoints, topic: str, snapshot_dir: Path, remote: LocalDirSnapshotStore | None = None
) -> MetadataManager:
    manager = MetadataManager(new_wal(stack, topic), snapshot_dir, remote=remote)
    manager.start(follow=False)
    manager.wal.close()
    return manager


def test_recovery_from_snapshot_and_tail_equals_full_replay(stack: Endpoints, tmp_path: Path) -> None:
    topic = f"__tiering_metadata_{uuid.uuid4().hex[:8]}"
    writer = MetadataManager(new_wal(stack, topic), tmp_path / "snap")
    writer.start()
    enable = TopicRecord(
        topic="orders", topic_id=TOPIC_ID, action=TopicAction.ENABLE, local_retention_ms=60_000, event_time=1
    )
    assert writer.publish(enable).accepted
    bulk(writer.wal, history(300))
    sid = uuid.uuid4()
    assert writer.publish(seg(sid, S.COPY_SEGMENT_STARTED, 10**6, 10**6 + 9)).accepted
    rejected = writer.publish(seg(sid, S.DELETE_SEGMENT_FINISHED, 10**6, 10**6 + 9))
    assert not rejected.accepted and "illegal" in (rejected.reason or "")
    writer.snapshot_now()
    bulk(writer.wal, history(200, epoch=2))
    assert writer.publish(seg(sid, S.COPY_SEGMENT_FINISHED, 10**6, 10**6 + 9, epoch=2)).accepted
    # a publish waits for its own WAL partition only: the bulk records of the others may still be on their way in
    writer.catch_up()
    expected = writer.state.digest()
    writer.close()  # the consumer side goes away; a new one recovers

    recovered = replay(stack, topic, tmp_path / "snap")
    assert recovered.recovered_from.endswith(".tsnap")
    full = replay(stack, topic, tmp_path / "empty")
    assert full.recovered_from == "empty"
    assert recovered.state.digest() == full.state.digest() == expected
    assert full.state.counters.applied > recovered.state.counters.applied  # the snapshot saved work


def test_publish_reaches_every_replica_and_the_facade_answers(stack: Endpoints, tmp_path: Path) -> None:
    topic = f"__tiering_metadata_{uuid.uuid4().hex[:8]}"
    leader, follower = (MetadataManager(new_wal(stack, topic), tmp_path / name) for name in ("a", "b"))
    leader.start()
    follower.start()
    enable = TopicRecord(topic="orders", topic_id=TOPIC_ID, action=TopicAction.ENABLE, event_time=1)
    assert leader.publish(enable).accepted
    old, new = uuid.uuid4(), uuid.uuid4()
    for sid, base, end, epoch in ((old, 0, 99, 1), (new, 50, 149, 2)):
        assert leader.publish(seg(sid, S.COPY_SEGMENT_STARTED, base, end, epoch=epoch)).accepted
        assert leader.publish(seg(sid, S.COPY_SEGMENT_FINISHED, base, end, epoch=epoch)).accepted
    stale = follower.publish(seg(uuid.uuid4(), S.COPY_SEGMENT_STARTED, 150, 199, epoch=1, broker=2))
    assert not stale.accepted and "leader epoch 1 < 2" in (stale.reason or "")
    # the follower applied its own record, so it has applied everything before it in that WAL partition
    for replica in (leader, follower):
        state = replica.partition_state(TOPIC_ID, 0)
        assert state is not None
        assert (state.remote_start_offset, state.remote_end_offset, state.remote_size) == (0, 149, 1500)
        assert state.stored_size == 2000  # offsets 50..99 are in both copies: stored twice, counted once
        assert replica.segment_for_offset(TOPIC_ID, 0, 49).segment_id == old.bytes
        assert replica.segment_for_offset(TOPIC_ID, 0, 60).segment_id == new.bytes  # higher epoch wins
        assert replica.segment_for_offset(TOPIC_ID, 0, 150) is None
        finished = replica.segments(TOPIC_ID, 0, [S.COPY_SEGMENT_FINISHED])
        assert [s.segment_id for s in finished] == [old.bytes, new.bytes]
        topic_state = replica.topic_state("orders")
        assert topic_state is not None and topic_state[0] == TOPIC_ID and topic_state[1].uploads_allowed
        assert replica.partition_state(TOPIC_ID, 1) is None
    leader.close()
    follower.close()


def test_garbage_record_is_skipped_and_replay_continues(
    stack: Endpoints, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    topic = f"__tiering_metadata_{uuid.uuid4().hex[:8]}"
    wal = new_wal(stack, topic)
    wal.ensure_topic()
    good = seg(uuid.uuid4(), S.COPY_SEGMENT_STARTED, 0, 9)
    part = wal.partition_for(good)
    _, garbage_offset = wal.append_payload(part, b"this is not a metadata record")
    wal.append_payload(part, b"\xa7\x01\x01truncated")
    wal.append_payload(part, b"\xa7\x09\x01a record from a newer sidecar")
    wal.append(good)
    wal.close()
    with caplog.at_level(logging.ERROR, logger="metadata.manager"):
        manager = replay(stack, topic, tmp_path)
    assert manager.state.counters.garbage == 2 and manager.state.counters.unknown_version == 1
    p = manager.state.partition(TOPIC_ID, 0)
    assert p is not None and p.state_of(good.segment_id.bytes, 0) == S.COPY_SEGMENT_STARTED
    logged = [r.fields for r in caplog.records if getattr(r, "event", "") == "skipping an undecodable metadata record"]
    assert len(logged) == 2 and logged[0]["wal_partition"] == part and logged[0]["offset"] == garbage_offset


def test_wal_topic_settings_and_periodic_snapshots(stack: Endpoints, tmp_path: Path) -> None:
    topic = f"__tiering_metadata_{uuid.uuid4().hex[:8]}"
    manager = MetadataManager(new_wal(stack, topic), tmp_path, snapshot_every_records=100, keep_snapshots=2)
    manager.start()
    admin = AdminClient({"bootstrap.servers": stack.bootstrap})
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    configs = admin.describe_configs([resource])[resource].result(30)
    assert {k: configs[k].value for k in ("cleanup.policy", "retention.ms", "retention.bytes")} == {
        "cleanup.policy": "delete", "retention.ms": "-1", "retention.bytes": "-1",
    }  # fmt: skip
    assert len(admin.list_topics(topic, timeout=30).topics[topic].partitions) == 8
    for round_ in range(4):  # 4 x 150 records: a snapshot after each round of >= 100
        bulk(manager.wal, history(50, epoch=round_ + 1))
        manager.publish(seg(uuid.uuid4(), S.COPY_SEGMENT_STARTED, 10**6 + round_, 10**6 + round_, epoch=round_ + 1))
    for _ in range(100):  # the follower writes them after applying batches: bounded wait, 10 s at most
        if local_snapshots(tmp_path):
            break
        time.sleep(0.1)
    expected = manager.state.digest()
    manager.close()
    assert 1 <= len(local_snapshots(tmp_path)) <= 2  # older ones were pruned
    recovered = replay(stack, topic, tmp_path)
    assert recovered.recovered_from == str(local_snapshots(tmp_path)[0])
    assert recovered.state.digest() == expected


def test_corrupt_snapshots_fall_back_to_older_then_remote(stack: Endpoints, tmp_path: Path) -> None:
    topic = f"__tiering_metadata_{uuid.uuid4().hex[:8]}"
    remote = LocalDirSnapshotStore(tmp_path / "remote")
    writer = MetadataManager(new_wal(stack, topic), tmp_path / "local", remote=remote)
    writer.start()
    bulk(writer.wal, history(50))
    writer.publish(seg(uuid.uuid4(), S.COPY_SEGMENT_STARTED, 10**5, 10**5 + 1))
    older = writer.snapshot_now()
    bulk(writer.wal, history(50, epoch=3))
    writer.publish(seg(uuid.uuid4(), S.COPY_SEGMENT_STARTED, 10**6, 10**6 + 1, epoch=3))
    newest = writer.snapshot_now()
    expected = writer.state.digest()
    writer.close()

    newest.write_bytes(newest.read_bytes()[:-100])  # truncated
    fallback = replay(stack, topic, tmp_path / "local")
    assert fallback.recovered_from == str(older)
    assert fallback.state.digest() == expected

    for path in (tmp_path / "local").iterdir():
        data = bytearray(path.read_bytes())
        data[40] ^= 0xFF
        path.write_bytes(bytes(data))
    from_remote = replay(stack, topic, tmp_path / "local", remote=remote)
    assert from_remote.recovered_from.startswith("remote:")
    assert from_remote.state.digest() == expected


def test_a_snapshot_of_another_wal_is_not_loaded(stack: Endpoints, tmp_path: Path) -> None:
    first, second = (f"__tiering_metadata_{uuid.uuid4().hex[:8]}" for _ in range(2))
    for topic, segments in ((first, 1), (second, 40)):  # second: as if the WAL topic was created again
        wal = new_wal(stack, topic)
        wal.ensure_topic()
        bulk(wal, history(segments))
        wal.close()
    replay(stack, first, tmp_path).snapshot_now()
    recovered = replay(stack, second, tmp_path)
    assert recovered.recovered_from == "empty"
    assert recovered.state.digest() == replay(stack, second, tmp_path / "none").state.digest()
    assert recovered.state.segment_count() == 40


def test_two_sidecars_compete_for_a_lease_and_the_loser_is_fenced(stack: Endpoints, tmp_path: Path) -> None:
    lost: list[tuple[str, int]] = []
    prefix = f"/tiering-test-{uuid.uuid4().hex[:8]}"
    a = EtcdLeases(stack.etcd.url, "broker-1", ttl=3, prefix=prefix, on_lost=lambda t, p: lost.append((t, p)))
    b = EtcdLeases(stack.etcd.url, "broker-2", ttl=3, prefix=prefix)
    token_a = a.acquire(TOPIC_ID, 0)
    assert token_a is not None
    assert b.acquire(TOPIC_ID, 0) is None
    assert a.acquire(TOPIC_ID, 0) == token_a
    assert a.acquire(TOPIC_ID, 1) is not None  # a second key: the check (the keys bound to the lease) keeps it

    b.client.delete(a.key(TOPIC_ID, 0))  # the key disappears (an operator, or an expiry) ...
    for _ in range(100):  # ... and a notices within a refresh period: bounded wait, 10 s at most
        if lost:  # the callback comes last, after is_held turned false
            break
        time.sleep(0.1)
    assert not a.is_held(TOPIC_ID, 0) and lost == [(TOPIC_ID, 0)]
    assert a.is_held(TOPIC_ID, 1)
    token_b = b.acquire(TOPIC_ID, 0)
    assert token_b is not None and token_b > token_a

    topic = f"__tiering_metadata_{uuid.uuid4().hex[:8]}"
    wal = new_wal(stack, topic)
    wal.ensure_topic()
    winner = seg(uuid.uuid4(), S.COPY_SEGMENT_STARTED, 0, 99, epoch=1, token=token_b, broker=2)
    late = seg(uuid.uuid4(), S.COPY_SEGMENT_STARTED, 100, 199, epoch=1, token=token_a, broker=1)
    wal.append(winner)
    wal.append(late)
    wal.close()
    replicas = [replay(stack, topic, tmp_path / f"r{i}") for i in range(2)]
    for replica in replicas:
        p = replica.state.partition(TOPIC_ID, 0)
        assert p is not None
        assert p.state_of(winner.segment_id.bytes, 0) == S.COPY_SEGMENT_STARTED
        assert p.state_of(late.segment_id.bytes, 100) is None
        assert replica.state.counters.rejected == 1
        assert "lease token" in (replica.state.last_rejection or "")
    a.close()
    b.close()


def test_an_expired_lease_stops_its_holder(stack: Endpoints) -> None:
    lost: list[tuple[str, int]] = []
    prefix = f"/tiering-test-{uuid.uuid4().hex[:8]}"
    a = EtcdLeases(stack.etcd.url, "broker-1", ttl=3, prefix=prefix, on_lost=lambda t, p: lost.append((t, p)))
    b = EtcdLeases(stack.etcd.url, "broker-2", ttl=3, prefix=prefix)
    assert a.acquire(TOPIC_ID, 7) is not None and a.lease_id is not None
    Lease(a.lease_id, b.client).revoke()  # etcd ends the lease, as it does when keepalives stop arriving
    for _ in range(100):  # the holder notices at its next refresh: bounded wait, 10 s at most
        if lost:
            break
        time.sleep(0.1)
    assert lost == [(TOPIC_ID, 7)] and not a.is_held(TOPIC_ID, 7)
    assert b.acquire(TOPIC_ID, 7) is not None  # the key went with the lease
    a.close()
    b.close()


def test_bench_metadata_prints_its_measurements(stack: Endpoints) -> None:
    args = ["bench", "metadata", "--segments", "2000", "--partitions", "20", "--stack-dir", stack.stack_dir]
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.output.splitlines() if line.startswith("{")]
    summary = lines[-1]
    assert {"ratio", "bytes_per_segment", "replay_records_s"} <= summary.keys()
    history = next(line for line in lines if line.get("measure") == "history")
    assert history["records"] == 4000 and history["tail_records"] == 40
    memory = next(line for line in lines if line.get("measure") == "memory")
    assert memory["segments_loaded"] == 1980  # the snapshot holds the history before the tail
