"""A deleted topic's remote data goes through DELETE_PARTITION_*; enable refuses what KIP-405 refuses."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from confluent_kafka.admin import AdminClient

from deploy.stack import Endpoints
from segment_fsm import PartitionDeleteState
from tests.conftest import create_topic
from tests.integration.test_sidecar_policies import SEGMENT, cli, produce, refs, running, topic_objects
from tests.sidecar_harness import wait_for, write_config
from tiering.cli.main import main

pytestmark = pytest.mark.integration


def test_deleted_topic_remote_data_is_deleted_through_the_fsm(stack: Endpoints, tmp_path: Path) -> None:
    topic = create_topic(stack.bootstrap, internal_segment_bytes=SEGMENT)
    produce(stack.bootstrap, topic, 10_000)
    config = write_config(stack, tmp_path)
    cli("topic", "enable", topic, "--config", str(config))
    with running(config) as (ctx, sidecar):
        topic_id = ctx.cluster.topics([topic])[topic].topic_id
        wait_for(lambda: len(refs(ctx, topic, topic_id)) >= 3, 120, "uploads", step=sidecar.tick)
        assert topic_objects(ctx, topic, topic_id)
        admin = AdminClient({"bootstrap.servers": stack.bootstrap})  # kept alive until the result arrives
        admin.delete_topics([topic])[topic].result(60)

        def cleaned() -> bool:
            state = ctx.manager.partition_state(topic_id, 0)
            return state is not None and state.delete_state == PartitionDeleteState.DELETE_PARTITION_FINISHED

        wait_for(cleaned, 120, "DELETE_PARTITION_FINISHED", step=sidecar.tick)
        assert topic_objects(ctx, topic, topic_id) == []
        assert refs(ctx, topic, topic_id) == []


def test_enable_refuses_compacted_topics_and_a_local_retention_above_the_total(
    stack: Endpoints, tmp_path: Path
) -> None:
    config = write_config(stack, tmp_path)
    compacted = create_topic(stack.bootstrap, cleanup_policy="compact")
    result = CliRunner().invoke(main, ["topic", "enable", compacted, "--config", str(config)])
    assert result.exit_code == 1 and "compacted topics cannot be tiered" in result.output
    short = create_topic(stack.bootstrap, retention_ms=60_000)
    result = CliRunner().invoke(
        main, ["topic", "enable", short, "--local-retention-ms", "120000", "--config", str(config)]
    )
    assert result.exit_code == 1 and "local.retention.ms=120000 exceeds retention.ms=60000" in result.output
    result = CliRunner().invoke(main, ["topic", "enable", "no-such-topic", "--config", str(config)])
    assert result.exit_code == 1 and "does not exist" in result.output
    result = CliRunner().invoke(main, ["topic", "pause-upload", short, "--config", str(config)])
    assert result.exit_code == 1 and "not enabled" in result.output
