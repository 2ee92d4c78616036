"""Failing operations are retried with exponential backoff and logged once per retry, not every tick;
producing to an unreachable cluster ends with a clear error instead of waiting forever."""

from __future__ import annotations

import logging
import socket
import threading
import time
from pathlib import Path

import pytest
import yaml
from confluent_kafka import Producer

from deploy.stack import Endpoints
from segment_fsm import SegmentState
from tests.conftest import create_topic
from tests.integration.test_sidecar_policies import SEGMENT, cli, produce, refs, running, set_topic_config
from tests.integration.test_sidecar_store_errors import without_keys
from tests.sidecar_harness import session_credentials, wait_for, write_config
from tiering_core.produce import ProduceTimeout, produce_waiting

pytestmark = pytest.mark.integration
TICKS = 60


def test_a_failing_deletion_backs_off_and_is_logged_once_per_retry(
    stack: Endpoints, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    topic = create_topic(stack.bootstrap, internal_segment_bytes=SEGMENT)
    produce(stack.bootstrap, topic, 12_000, timestamp=int(time.time() * 1000) - 2 * 3600 * 1000)
    config = write_config(stack, tmp_path, remote_log_manager_task_retry_backoff_ms=500,
                          remote_log_manager_task_retry_backoff_max_ms=10_000)  # fmt: skip
    prefix = yaml.safe_load(config.read_text())["remote_storage"]["prefix"]
    cli("topic", "enable", topic, "--config", str(config))
    with running(config) as (ctx, sidecar):
        topic_id = ctx.cluster.topics([topic])[topic].topic_id
        wait_for(lambda: len(refs(ctx, topic, topic_id)) >= 3, 120, "uploads", step=sidecar.tick)

    # The store now refuses deletions of the partition's objects; every copy is past retention.ms.
    denied = f"arn:aws:s3:::{stack.s3.bucket}/{prefix}/{topic}-*/0/*"
    with monkeypatch.context() as env:
        for name, value in session_credentials(stack, deny={"s3:DeleteObject": denied}).items():
            env.setenv(name, value)
        set_topic_config(stack.bootstrap, topic, retention_ms=3600 * 1000)
        caplog.set_level(logging.ERROR, logger="tiering.sidecar.retry")
        with running(without_keys(config)) as (ctx, sidecar):
            for _ in range(TICKS):
                sidecar.tick()
            attempts = ctx.metrics.delete_errors.labels(topic=topic, partition="0")._value.get()
            assert 1 <= attempts <= TICKS // 3, f"{attempts} failed deletions in {TICKS} ticks: no backoff"
            failures = {  # every operation of the partition that failed (the deletions, and any other that did)
                labels[2]: child._value.get()
                for labels, child in ctx.metrics.task_errors._metrics.items()
                if labels[:2] == (topic, "0")
            }
            assert failures.get("remote_retention", 0) >= 1 and failures.get("sweep", 0) >= 1, failures
            logged = [
                r for r in caplog.records
                if getattr(r, "fields", {}).get("topic") == topic and r.getMessage().startswith("operation failed")
            ]  # fmt: skip
            assert len(logged) == sum(failures.values()), f"an error was logged more than once per retry: {failures}"
            assert all(r.exc_info for r in logged)
            status = sidecar.tasks[(topic_id, 0)].status
            assert status.last_error is not None and "AccessDenied" in status.last_error
            assert status.next_retry_ms is not None and status.next_retry_ms > status.last_error_ms
            assert refs(ctx, topic, topic_id), "copies vanished although their deletion was refused"

    # Allowed again (the sidecar's own credentials): the deletions left in DELETE_SEGMENT_STARTED finish.
    with running(config) as (ctx, sidecar):

        def deleted() -> bool:
            counts = ctx.manager.partition_state(topic_id, 0).segment_counts
            return counts["COPY_SEGMENT_FINISHED"] == 0 and counts["DELETE_SEGMENT_STARTED"] == 0

        wait_for(deleted, 120, "the refused deletions to finish", step=sidecar.tick)
        assert ctx.manager.segments(topic_id, 0, [SegmentState.DELETE_SEGMENT_FINISHED])


def test_producing_to_an_unreachable_cluster_ends_with_a_clear_error() -> None:
    with socket.socket() as s:  # a port nothing listens on: the cluster is unreachable
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    producer = Producer({"bootstrap.servers": f"127.0.0.1:{port}", "queue.buffering.max.messages": 1,
                         "log_level": 0})  # fmt: skip
    outcome: list[BaseException | None] = []

    def produce_two() -> None:
        try:
            produce_waiting(producer, "t", value=b"first")  # queued
            produce_waiting(producer, "t", value=b"second", timeout=3)  # the queue never drains
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=produce_two, daemon=True)
    thread.start()
    thread.join(120)
    assert not thread.is_alive(), "produce_waiting is still waiting for room in the queue"
    (error,) = outcome
    assert isinstance(error, ProduceTimeout), error
    assert "queue stayed full for 3 s" in str(error) and "producing to t" in str(error)
    producer.purge()
