"""Rollback, total retention (with a hole left by the broker), a corrupt segment, an unreachable store."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from click.testing import CliRunner
from confluent_kafka import Producer

from deploy.stack import Endpoints
from segment_fsm import SegmentState
from tests.conftest import create_topic, set_topic_config
from tests.fault_proxy import TcpProxy
from tests.sidecar_harness import decoded_offsets, settings, wait_for, write_config
from tiering.cli.main import main
from tiering.sidecar.context import SidecarContext
from tiering.sidecar.runner import Sidecar
from tiering_core.formats import list_segments
from tiering_core.objects import SegmentRef

pytestmark = pytest.mark.integration
SEGMENT = 64 * 1024
FINISHED = [SegmentState.COPY_SEGMENT_FINISHED]


def produce(bootstrap: str, topic: str, count: int, timestamp: int | None = None) -> None:
    """Produce ``count`` records (batches well under the small test segment size); all must be acknowledged."""
    errors: list[object] = []
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.size": 16384})
    for i in range(count):
        while True:
            try:
                producer.produce(topic, key=str(i).encode(), value=f"value-{i}-".encode() * 8,
                                 timestamp=timestamp or 0,
                                 on_delivery=lambda err, _msg: errors.append(err) if err else None)  # fmt: skip
                break
            except BufferError:  # librdkafka's queue is full: let deliveries drain it
                producer.poll(0.05)
        if i % 5000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0 and not errors, errors[:3]


def cli(*args: str) -> str:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, result.output
    return result.output


@contextmanager
def running(config: Path) -> Iterator[tuple[SidecarContext, Sidecar]]:
    ctx = SidecarContext.build(settings(config))
    sidecar = Sidecar(ctx)
    sidecar.start()
    try:
        yield ctx, sidecar
    finally:
        sidecar.stop()
        sidecar.close()


def lx(ctx: SidecarContext, topic: str) -> int:
    return ctx.cluster.local_offsets([(topic, 0)])[(topic, 0)].lx


def refs(ctx: SidecarContext, topic: str, topic_id: str) -> list[SegmentRef]:
    return [
        SegmentRef(topic, topic_id, 0, s.base_offset, uuid.UUID(bytes=s.segment_id))
        for s in ctx.manager.segments(topic_id, 0, FINISHED)
    ]


def topic_objects(ctx: SidecarContext, topic: str, topic_id: str) -> list[str]:
    return ctx.store.list_keys(f"{topic}-{topic_id}/")


def test_rollback_stops_tiering_keeps_remote_readable_and_delete_remote_removes_it(
    stack: Endpoints, tmp_path: Path
) -> None:
    topic = create_topic(stack.bootstrap, internal_segment_bytes=SEGMENT)
    produce(stack.bootstrap, topic, 20_000)
    config = write_config(stack, tmp_path)
    cli("topic", "enable", topic, "--local-retention-bytes", str(2 * SEGMENT), "--config", str(config))
    with running(config) as (ctx, sidecar):
        topic_id = ctx.cluster.topics([topic])[topic].topic_id
        wait_for(lambda: lx(ctx, topic) > 0, 120, "local retention to apply", step=sidecar.tick)
        cli("topic", "rollback", topic, "--config", str(config))
        wait_for(lambda: ctx.manager.topic_state(topic)[1].rolled_back, 30, "the rollback to be applied")
        copies_before, start_before = len(refs(ctx, topic, topic_id)), lx(ctx, topic)
        produce(stack.bootstrap, topic, 20_000)
        for _ in range(5):
            sidecar.tick()
        assert len(refs(ctx, topic, topic_id)) == copies_before, "a segment was uploaded after the rollback"
        assert lx(ctx, topic) == start_before, "the sidecar deleted local data after the rollback"
        first = refs(ctx, topic, topic_id)[0]
        body = ctx.store.get_bytes(first.key("log"))
        assert min(decoded_offsets(body, "remote")) == 0, "the remote copy is no longer readable"
        assert "already rolled back" in cli(
            "topic", "rollback", topic, "--delete-remote", "--yes", "--config", str(config)
        )
        assert topic_objects(ctx, topic, topic_id) == []
        wait_for(lambda: not refs(ctx, topic, topic_id), 30, "every copy to be DELETE_SEGMENT_FINISHED")


def test_total_retention_expires_remote_copies_and_a_hole_is_not_fatal(stack: Endpoints, tmp_path: Path) -> None:
    topic = create_topic(stack.bootstrap, internal_segment_bytes=SEGMENT)
    old = int(time.time() * 1000) - 2 * 3600 * 1000
    produce(stack.bootstrap, topic, 15_000, timestamp=old)
    config = write_config(stack, tmp_path)
    cli("topic", "enable", topic, "--local-retention-bytes", str(2 * SEGMENT), "--config", str(config))
    with running(config) as (ctx, sidecar):
        topic_id = ctx.cluster.topics([topic])[topic].topic_id
        wait_for(lambda: lx(ctx, topic) > 0, 120, "uploads and local retention", step=sidecar.tick)
        expired_keys = [k for r in refs(ctx, topic, topic_id) for k in r.object_keys()]
        cli("topic", "pause-upload", topic, "--config", str(config))
        wait_for(lambda: ctx.manager.topic_state(topic)[1].upload_paused, 30, "the pause to apply")
        produce(stack.bootstrap, topic, 15_000, timestamp=old)  # never uploaded: Kafka's retention takes it
        ry_before = ctx.manager.partition_state(topic_id, 0).remote_end_offset
        set_topic_config(stack.bootstrap, topic, retention_ms=3600 * 1000)
        wait_for(lambda: lx(ctx, topic) > ry_before + 1, 60, "the broker's retention to leave a hole")
        produce(stack.bootstrap, topic, 6_000)  # fresh data after the hole
        cli("topic", "resume-upload", topic, "--config", str(config))
        wait_for(
            lambda: (
                not (sidecar.tick() or set(topic_objects(ctx, topic, topic_id)) & set(expired_keys))
                and bool(refs(ctx, topic, topic_id))
            ),
            120,
            "old copies to expire and data after the hole to be uploaded",
        )
        state = ctx.manager.partition_state(topic_id, 0)
        assert state.remote_start_offset >= lx(ctx, topic) - 1 or state.remote_start_offset > ry_before
        assert all(t.status.last_error is None for t in sidecar.tasks.values())
        assert state.segment_counts["DELETE_SEGMENT_STARTED"] == 0


def test_corrupt_segment_is_not_uploaded_and_nothing_is_deleted(stack: Endpoints, tmp_path: Path) -> None:
    topic = create_topic(stack.bootstrap, internal_segment_bytes=SEGMENT)
    produce(stack.bootstrap, topic, 8_000)
    partition_dir = Path(stack.broker(1).log_dir) / f"{topic}-0"
    victim = list_segments(partition_dir)[0].log
    data = bytearray(victim.read_bytes())
    data[5000] ^= 0xFF  # inside the first batches: their CRC no longer matches
    victim.write_bytes(bytes(data))
    config = write_config(stack, tmp_path)
    cli("topic", "enable", topic, "--local-retention-bytes", "0", "--config", str(config))
    with running(config) as (ctx, sidecar):
        topic_id = ctx.cluster.topics([topic])[topic].topic_id
        for _ in range(3):
            sidecar.tick()
        task = sidecar.tasks[(topic_id, 0)]
        assert task.status.last_error is not None and str(victim) in task.status.last_error
        assert "CRC-32C mismatch" in task.status.last_error and "at byte" in task.status.last_error
        assert ctx.metrics.corrupt_segments.labels(topic=topic, partition="0")._value.get() == 1
        assert refs(ctx, topic, topic_id) == []
        assert topic_objects(ctx, topic, topic_id) == []
        assert lx(ctx, topic) == 0


def test_unreachable_store_deletes_nothing_locally_and_uploads_resume(stack: Endpoints, tmp_path: Path) -> None:
    topic = create_topic(stack.bootstrap, internal_segment_bytes=SEGMENT)
    produce(stack.bootstrap, topic, 10_000)
    host, port = stack.s3.endpoint_url.removeprefix("http://").split(":")
    proxy = TcpProxy(host, int(port))
    config = write_config(stack, tmp_path)
    text = config.read_text().replace(stack.s3.endpoint_url, f"http://127.0.0.1:{proxy.port}")
    config.write_text(text)
    cli("topic", "enable", topic, "--local-retention-bytes", "0", "--config", str(config))
    try:
        proxy.cut()
        with running(config) as (ctx, sidecar):
            topic_id = ctx.cluster.topics([topic])[topic].topic_id
            for _ in range(2):
                sidecar.tick()
            task = sidecar.tasks[(topic_id, 0)]
            assert task.status.last_error is not None and "unreachable" in task.status.last_error
            assert f"127.0.0.1:{proxy.port}" in task.status.last_error
            assert lx(ctx, topic) == 0, "local data was deleted while the store was unreachable"
            assert refs(ctx, topic, topic_id) == []
            proxy.restore()
            wait_for(
                lambda: lx(ctx, topic) > 0, 120, "uploads to resume and local retention to apply", step=sidecar.tick
            )
            assert refs(ctx, topic, topic_id)
            # operations that failed during the outage are retried after their backoff, then clear
            wait_for(lambda: task.status.last_error is None, 60, "every operation to recover", step=sidecar.tick)
    finally:
        proxy.close()
