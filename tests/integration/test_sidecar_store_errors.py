"""Store failures stay where they happen: a partition whose uploads the store refuses is reported (status,
metrics, a logged traceback) and retried with backoff, while the other partitions and the deleted-topic
janitor go on; S3 errors in the middle of uploads (503 SlowDown, 500, a connection reset mid-body) never
release local data without a whole copy; a topic with a 249-character name (the longest Kafka allows) is
tiered like any other."""

from __future__ import annotations

import json
import logging
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka.admin import AdminClient, NewTopic

from deploy.stack import Endpoints
from metadata.partition import RemoteSegment
from segment_fsm import PartitionDeleteState, SegmentState
from tests.conftest import create_topic
from tests.integration.test_sidecar_policies import SEGMENT, cli, lx, produce, refs, running, topic_objects
from tests.s3_fault_proxy import INTERNAL_ERROR, LOST_ANSWER, RESET, SLOW_DOWN, S3FaultProxy
from tests.sidecar_harness import session_credentials, snapshot_segments, wait_for, write_config
from tiering.sidecar.context import SidecarContext
from tiering_core.formats import list_segments
from tiering_core.objects import TOPIC_DIR_MAX_BYTES

pytestmark = pytest.mark.integration


def refs_of(ctx: SidecarContext, topic_id: str, partition: int) -> list[RemoteSegment]:
    return ctx.manager.segments(topic_id, partition, [SegmentState.COPY_SEGMENT_FINISHED])


def without_keys(config: Path) -> Path:
    """The same sidecar config, taking its S3 credentials from the standard AWS chain (the environment)."""
    doc = yaml.safe_load(config.read_text())
    doc["remote_storage"].pop("access_key_id")
    doc["remote_storage"].pop("secret_access_key")
    path = config.with_name("sidecar-env-credentials.yaml")
    path.write_text(yaml.safe_dump(doc))
    return path


def test_a_failing_partition_is_reported_while_the_others_and_the_janitor_go_on(
    stack: Endpoints, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    doomed = create_topic(stack.bootstrap, internal_segment_bytes=SEGMENT)
    produce(stack.bootstrap, doomed, 8_000)
    topic = create_topic(stack.bootstrap, partitions=2, internal_segment_bytes=SEGMENT)
    produce(stack.bootstrap, topic, 16_000)
    config = write_config(stack, tmp_path, deleted_topic_grace_seconds=3)  # the janitor acts within the test
    prefix = yaml.safe_load(config.read_text())["remote_storage"]["prefix"]
    cli("topic", "enable", doomed, "--config", str(config))
    with running(config) as (ctx, sidecar):
        doomed_id = ctx.cluster.topics([doomed])[doomed].topic_id
        wait_for(lambda: len(refs(ctx, doomed, doomed_id)) >= 2, 120, "uploads of the doomed topic", step=sidecar.tick)
    admin = AdminClient({"bootstrap.servers": stack.bootstrap})
    admin.delete_topics([doomed])[doomed].result(60)

    # From now on the sidecar's credentials may not write under partition 0 of `topic` (AccessDenied).
    denied = f"arn:aws:s3:::{stack.s3.bucket}/{prefix}/{topic}-*/0/*"
    for name, value in session_credentials(stack, deny={"s3:PutObject": denied}).items():
        monkeypatch.setenv(name, value)
    config = without_keys(config)
    cli("topic", "enable", topic, "--local-retention-bytes", "0", "--config", str(config))
    caplog.set_level(logging.ERROR, logger="tiering.sidecar.retry")
    with running(config) as (ctx, sidecar):
        topic_id = ctx.cluster.topics([topic])[topic].topic_id

        def others_done() -> bool:
            doomed_state = ctx.manager.partition_state(doomed_id, 0)
            return (
                (topic_id, 0) in sidecar.tasks
                and len(refs_of(ctx, topic_id, 1)) >= 2
                and doomed_state is not None
                and doomed_state.delete_state == PartitionDeleteState.DELETE_PARTITION_FINISHED
            )

        wait_for(others_done, 180, "partition 1 uploads and the deleted topic's cleanup", step=sidecar.tick)
        assert topic_objects(ctx, doomed, doomed_id) == []
        status = sidecar.tasks[(topic_id, 0)].status
        assert status.last_error is not None and "AccessDenied" in status.last_error, status.last_error
        assert f"{prefix}/{topic}-{topic_id}/0/" in status.last_error and stack.s3.endpoint_url in status.last_error
        assert "copy" in status.failing and status.next_retry_ms is not None
        assert sidecar.tasks[(topic_id, 1)].status.last_error is None
        assert ctx.metrics.copy_errors.labels(topic=topic, partition="0")._value.get() >= 1
        assert ctx.metrics.task_errors.labels(topic=topic, partition="0", operation="copy")._value.get() >= 1
        state = ctx.manager.partition_state(topic_id, 0)
        started = state.segment_counts["COPY_SEGMENT_STARTED"] if state is not None else 0
        assert started == 0, "failed copies left COPY_SEGMENT_STARTED records behind"
        assert ctx.cluster.local_offsets([(topic, 0)])[(topic, 0)].lx == 0, "local data deleted without a copy"
        logged = [r for r in caplog.records if r.getMessage().startswith("operation failed") and r.exc_info]
        assert logged and "An error occurred (AccessDenied)" in caplog.text, "no traceback of the failure was logged"
        shown = json.loads(cli("topic", "status", topic, "--json", "--config", str(config)))
        row = next(r for r in shown["partitions"] if r["partition"] == 0)
        assert "AccessDenied" in row["last_error"] and row["next_retry_ms"] is not None


def through(config: Path, proxy: S3FaultProxy) -> Path:
    """The same sidecar config, reaching the S3 server through ``proxy``."""
    doc = yaml.safe_load(config.read_text())
    doc["remote_storage"]["endpoint_url"] = proxy.endpoint_url
    config.write_text(yaml.safe_dump(doc))
    return config


def incomplete_uploads(s3: Any, bucket: str, prefix: str) -> list[str]:
    """Keys under ``prefix`` with a multipart upload neither completed nor aborted. The bucket's uploads are
    listed and filtered here: MinIO lists in-progress uploads only for an exact key when given a Prefix."""
    pages = s3.get_paginator("list_multipart_uploads").paginate(Bucket=bucket)
    return [u["Key"] for page in pages for u in page.get("Uploads", []) if u["Key"].startswith(prefix)]


def test_s3_errors_mid_upload_never_release_local_data_without_a_whole_copy(
    stack: Endpoints, tmp_path: Path, s3: Any
) -> None:
    """Each phase's faults meet fresh segments (6 MiB: a multipart upload of two 5 MiB parts), produced until the
    faults have all happened. botocore tries a request twice (max_attempts 2): two faults in a row fail the
    request and the copy, one is retried. After every tick: the log start is at most Ry + 1 and every finished
    copy equals its segment."""
    phases = [
        ("UploadPart", (INTERNAL_ERROR, RESET, SLOW_DOWN, LOST_ANSWER, RESET, RESET)),
        # MinIO answers a retried Complete of an upload it completed with NoSuchUpload: the copy fails
        ("CompleteMultipartUpload", (SLOW_DOWN, LOST_ANSWER, INTERNAL_ERROR, INTERNAL_ERROR)),
        ("PutObject", (SLOW_DOWN, SLOW_DOWN, RESET, LOST_ANSWER, INTERNAL_ERROR, RESET)),
    ]
    topic = create_topic(stack.bootstrap, internal_segment_bytes=6 << 20)
    partition_dir = Path(stack.broker(1).log_dir) / f"{topic}-0"
    originals: dict[int, bytes] = {}
    with S3FaultProxy(stack.s3.endpoint_url) as proxy:
        config = through(write_config(stack, tmp_path, remote_log_manager_task_retry_backoff_max_ms=2000), proxy)
        cli("topic", "enable", topic, "--local-retention-bytes", "0", "--config", str(config))
        with running(config) as (ctx, sidecar):
            topic_id = ctx.cluster.topics([topic])[topic].topic_id
            whole: set[uuid.UUID] = set()

            def step() -> None:
                sidecar.tick()
                state = ctx.manager.partition_state(topic_id, 0)
                ry = state.remote_end_offset if state is not None else None
                start = lx(ctx, topic)
                assert start <= (ry + 1 if ry is not None else 0), f"log start {start} passed remote end {ry} + 1"
                for ref in refs(ctx, topic, topic_id):
                    if ref.segment_id not in whole:
                        body = s3.get_object(Bucket=stack.s3.bucket, Key=ctx.store.inner.full_key(ref.key("log")))[
                            "Body"
                        ].read()
                        assert body == originals[ref.base_offset], f"finished copy {ref} differs from the segment"
                        whole.add(ref.segment_id)

            for operation, faults in phases:
                proxy.plan(operation, *faults)
                while proxy.pending():
                    produce(stack.bootstrap, topic, 60_000)  # rolls at least one more segment
                    originals.update(snapshot_segments(partition_dir, tmp_path / "originals"))
                    active = list_segments(partition_dir)[-1].base_offset
                    wait_for(lambda active=active: lx(ctx, topic) == active and len(whole) == len(originals), 300,
                             f"every rolled segment copied and released ({operation} faults)", step=step)  # fmt: skip
            failed = ctx.metrics.copy_errors.labels(topic=topic, partition="0")._value.get()
            assert failed >= 2, "Complete's faults fail two copies"
            assert ctx.manager.partition_state(topic_id, 0).segment_counts["COPY_SEGMENT_STARTED"] == 0
            copies = refs(ctx, topic, topic_id)
            assert sorted(r.base_offset for r in copies) == sorted(originals), "a segment copied twice or never"
            objects = sorted(topic_objects(ctx, topic, topic_id))
            assert objects == sorted(k for r in copies for k in r.object_keys()), "failed copies left objects"
            assert incomplete_uploads(s3, stack.s3.bucket, ctx.store.inner.full_key(f"{topic}-{topic_id}/")) == []


def test_a_topic_with_a_249_character_name_is_tiered_byte_for_byte(stack: Endpoints, tmp_path: Path) -> None:
    topic = f"long-{uuid.uuid4().hex}-".ljust(249, "x")
    admin = AdminClient({"bootstrap.servers": stack.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1, config={"internal.segment.bytes": str(SEGMENT)})])[topic].result(60)
    produce(stack.bootstrap, topic, 10_000)
    partition_dir = Path(stack.broker(1).log_dir) / f"{topic}-0"
    originals = snapshot_segments(partition_dir, tmp_path / "originals")
    config = write_config(stack, tmp_path)
    cli("topic", "enable", topic, "--local-retention-bytes", str(2 * SEGMENT), "--config", str(config))
    with running(config) as (ctx, sidecar):
        topic_id = ctx.cluster.topics([topic])[topic].topic_id
        wait_for(lambda: lx(ctx, topic) > 0 and len(refs(ctx, topic, topic_id)) >= 3, 120,
                 "uploads and local retention", step=sidecar.tick)  # fmt: skip
        copies = refs(ctx, topic, topic_id)
        for ref in copies:
            key = ref.key("log")
            assert all(len(part.encode()) <= TOPIC_DIR_MAX_BYTES for part in key.split("/")), key
            assert ctx.store.get_bytes(key) == originals[ref.base_offset], f"remote copy of {key} differs"
        assert ctx.copier.manifest(copies[0]).topic == topic
        assert sidecar.tasks[(topic_id, 0)].status.last_error is None
        assert ctx.manager.partition_state(topic_id, 0).segment_counts["COPY_SEGMENT_STARTED"] == 0
