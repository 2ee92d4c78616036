"""The metadata follower on the real broker: bad values are garbage, gaps are loud, a dead follower stops the
sidecar, and the WAL lag is measured per WAL partition."""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from deploy.stack import Endpoints
from metadata import (
    ClusterRecord,
    MetadataManager,
    MetadataWal,
    PartitionDeleteRecord,
    SegmentRecord,
    TopicRecord,
    WalGap,
)
from metadata.records import topic_id_bytes, unparse
from segment_fsm import SegmentState
from tests.integration.test_metadata_wal import bulk, history, new_wal, replay
from tests.integration.test_sidecar_policies import cli
from tests.metadata_factory import TOPIC_ID, seg
from tests.sidecar_harness import settings, wait_for, write_config
from tiering.sidecar.context import SidecarContext
from tiering.sidecar.runner import Sidecar

pytestmark = pytest.mark.integration
S = SegmentState
TID = topic_id_bytes(TOPIC_ID)


def bad_records() -> list[bytes]:
    """Records that parse but carry an unknown state or action id, one of each record type."""
    sid = uuid.uuid4().bytes
    return [
        unparse(SegmentRecord.TYPE, (1, 1, 0, 5, TID, 0, sid, 9, 0, 9, 0, 0, 10, "orders", struct.pack(">iq", 1, 0))),
        unparse(PartitionDeleteRecord.TYPE, (1, 1, 0, 5, TID, 0, 7, "orders")),
        unparse(TopicRecord.TYPE, (-1, -1, 0, 5, TID, 42, -2, -2, "orders")),
        unparse(ClusterRecord.TYPE, (-1, -1, 0, 5, 42)),
    ]


def test_unknown_enum_values_are_garbage_while_following_and_on_replay(stack: Endpoints, tmp_path: Path) -> None:
    topic = f"__tiering_metadata_{uuid.uuid4().hex[:8]}"
    follower = MetadataManager(new_wal(stack, topic), tmp_path / "follower")
    follower.start()
    try:
        first = seg(uuid.uuid4(), S.COPY_SEGMENT_STARTED, 0, 9)
        assert follower.publish(first).accepted
        part = follower.wal.partition_for(first)
        for payload in bad_records():  # all into the partition the follower is about to read
            follower.wal.append_payload(part, payload)
        after = seg(uuid.uuid4(), S.COPY_SEGMENT_STARTED, 10, 19)
        result = follower.publish(after, timeout=30)  # the old follower died on the first bad record
        assert result.accepted, result.reason
        assert follower.failure is None
        assert follower.state.counters.garbage == 4
        expected = follower.state.digest()
    finally:
        follower.close()
    restarted = replay(stack, topic, tmp_path / "fresh")  # a restart replays them: no crash loop
    assert restarted.state.counters.garbage == 4
    assert restarted.state.digest() == expected


def delete_records(stack: Endpoints, topic: str, partition: int, before: int) -> None:
    admin = AdminClient({"bootstrap.servers": stack.bootstrap})
    futures = admin.delete_records([TopicPartition(topic, partition, before)], request_timeout=30)
    for future in futures.values():
        assert future.result(30).low_watermark == before


def test_a_wal_gap_fails_recovery_loudly_unless_a_snapshot_covers_it(stack: Endpoints, tmp_path: Path) -> None:
    topic = f"__tiering_metadata_{uuid.uuid4().hex[:8]}"
    wal = new_wal(stack, topic)
    wal.ensure_topic()
    bulk(wal, history(40))
    covered = replay(stack, topic, tmp_path / "snap")
    covered.snapshot_now()  # covers the first history
    bulk(wal, history(40, epoch=2))
    expected = replay(stack, topic, tmp_path / "full").state.digest()
    part = max(covered.next_offsets, key=covered.next_offsets.__getitem__)
    removed_to = covered.next_offsets[part]  # retention removes what the snapshot covers, and no more
    delete_records(stack, topic, part, removed_to)

    recovered = replay(stack, topic, tmp_path / "snap")  # the snapshot bridges the gap
    assert recovered.recovered_from.endswith(".tsnap")
    assert recovered.state.digest() == expected
    with pytest.raises(WalGap) as gap:  # without it, the old reader silently restarted at the earliest offset
        replay(stack, topic, tmp_path / "none")
    message = str(gap.value)
    assert (
        f"metadata WAL {topic}[{part}]: the next record should be at offset 0, but its first record is at "
        f"offset {removed_to}" in message
    )

    delete_records(stack, topic, part, removed_to + 5)  # now the snapshot does not cover the gap either
    with pytest.raises(
        WalGap, match=rf"\[{part}\]: .* at offset 0, but its first record is at offset {removed_to + 5}"
    ):
        replay(stack, topic, tmp_path / "snap")
    wal.close()


def test_a_dead_follower_stops_the_sidecar_with_a_non_zero_exit(stack: Endpoints, tmp_path: Path) -> None:
    config = write_config(stack, tmp_path, metadata_partitions=2)
    wal_topic = settings(config).metadata_topic
    data_topic = f"t-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": stack.bootstrap})
    admin.create_topics([NewTopic(data_topic, 1, 1)])[data_topic].result(60)
    cli("topic", "enable", data_topic, "--config", str(config))  # the WAL now holds a record
    log = tmp_path / "sidecar.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tiering", "sidecar", "run", "--config", str(config)],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        wait_for(lambda: "sidecar started" in log.read_text(), 60, "the sidecar to start")
        # the WAL topic is deleted and created again under the sidecar: what it applied is gone
        admin.delete_topics([wal_topic])[wal_topic].result(60)
        wait_for(lambda: wal_topic not in admin.list_topics(timeout=10).topics, 60, "the WAL topic to go")
        admin.create_topics([NewTopic(wal_topic, 2, 1)])[wal_topic].result(60)
        deadline = time.monotonic() + 90
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert proc.poll() is not None, "the sidecar kept running on a state that stopped following the WAL"
        assert proc.returncode != 0
        text = log.read_text()
        assert "metadata follower died" in text and "stopping the sidecar: its metadata follower died" in text
        assert f"metadata WAL {wal_topic}[" in text and "WalGap" in text
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def test_wal_lag_is_measured_per_wal_partition(stack: Endpoints, tmp_path: Path) -> None:
    config = write_config(stack, tmp_path, metadata_partitions=2)
    sidecar = Sidecar(SidecarContext.build(settings(config)))
    sidecar.start()
    try:
        behind = MetadataManager(new_wal(stack, settings(config).metadata_topic), tmp_path / "behind")
        behind.start(follow=False)  # applies what is there now, then stops following
        writer = MetadataWal(stack.bootstrap, settings(config).metadata_topic, 2)
        writer.ensure_topic()
        records = [seg(uuid.uuid4(), S.COPY_SEGMENT_STARTED, i * 10, i * 10 + 9) for i in range(7)]
        bulk(writer, records)
        part = writer.partition_for(records[0])
        assert behind.wal_lag() == {part: 7, 1 - part: 0}
        behind.wal.close()
        writer.close()

        registry = sidecar.ctx.metrics.registry

        def caught_up() -> bool:
            sidecar.tick()
            values = [registry.get_sample_value("tiering_metadata_wal_lag_records", {"wal_partition": str(p)})
                      for p in (0, 1)]  # fmt: skip
            return values == [0.0, 0.0]

        wait_for(caught_up, 60, "the running sidecar's lag gauges to read 0 on both WAL partitions")
    finally:
        sidecar.stop()
        sidecar.close()
