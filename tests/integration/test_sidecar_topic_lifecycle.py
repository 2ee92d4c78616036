"""A deleted topic's remote data goes through DELETE_PARTITION_*, only after Kafka has said for a grace period
that its id is gone; a topic created again under the same name is another topic; enable refuses what KIP-405
refuses."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from confluent_kafka.admin import AdminClient, NewTopic

from deploy.stack import Endpoints
from metadata.records import topic_id_bytes
from segment_fsm import PartitionDeleteState
from tests.conftest import create_topic
from tests.integration.test_sidecar_policies import SEGMENT, cli, produce, refs, running, topic_objects
from tests.sidecar_harness import settings, wait_for, write_config
from tiering.cli.main import main
from tiering.sidecar.context import SidecarContext
from tiering.sidecar.runner import Sidecar
from tiering_core.kafka_cluster import KafkaCluster, KafkaClusterError, TopicInfo

pytestmark = pytest.mark.integration


def cleaned(ctx: SidecarContext, topic_id: str) -> bool:
    state = ctx.manager.partition_state(topic_id, 0)
    return state is not None and state.delete_state == PartitionDeleteState.DELETE_PARTITION_FINISHED


def delete_state(ctx: SidecarContext, topic_id: str) -> PartitionDeleteState | None:
    state = ctx.manager.partition_state(topic_id, 0)
    assert state is not None
    return state.delete_state


def delete_topic(stack: Endpoints, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": stack.bootstrap})  # kept alive until the result arrives
    admin.delete_topics([topic])[topic].result(60)
    wait_for(lambda: topic not in admin.list_topics(timeout=10).topics, 60, f"{topic} to be gone")


def live_topic_id(ctx: SidecarContext, topic: str) -> str | None:
    try:
        return ctx.cluster.topics([topic])[topic].topic_id
    except KafkaClusterError:
        return None  # just created: not every broker's metadata has it yet


def absences(config: Path) -> dict:
    path = settings(config).state_dir / "deleted_topics.json"
    return json.loads(path.read_text()) if path.exists() else {}


def test_deleted_topic_remote_data_is_deleted_through_the_fsm(stack: Endpoints, tmp_path: Path) -> None:
    topic = create_topic(stack.bootstrap, internal_segment_bytes=SEGMENT)
    produce(stack.bootstrap, topic, 10_000)
    config = write_config(stack, tmp_path, deleted_topic_grace_seconds=3)
    cli("topic", "enable", topic, "--config", str(config))
    with running(config) as (ctx, sidecar):
        topic_id = ctx.cluster.topics([topic])[topic].topic_id
        wait_for(lambda: len(refs(ctx, topic, topic_id)) >= 3, 120, "uploads", step=sidecar.tick)
        assert topic_objects(ctx, topic, topic_id)
        delete_topic(stack, topic)
        wait_for(lambda: cleaned(ctx, topic_id), 120, "DELETE_PARTITION_FINISHED", step=sidecar.tick)
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


class OneAnswerLacks(KafkaCluster):
    """The real cluster, except that while ``hidden`` is set its answers lack that topic, as one answer from a
    broker with stale metadata, or to a principal without Describe on the topic, does."""

    hidden: str | None = None

    def topics(self, names: object, *, missing_ok: bool = False) -> dict[str, TopicInfo]:
        found = super().topics(names, missing_ok=missing_ok)  # type: ignore[arg-type]
        return {n: info for n, info in found.items() if not (missing_ok and n == self.hidden)}

    def topic_ids(self, names: object) -> dict[str, str | None]:
        found = super().topic_ids(names)  # type: ignore[arg-type]
        return {n: (None if n == self.hidden else i) for n, i in found.items()}


def test_a_live_topic_missing_from_one_answer_keeps_its_remote_data(stack: Endpoints, tmp_path: Path) -> None:
    topic = create_topic(stack.bootstrap, internal_segment_bytes=SEGMENT)
    produce(stack.bootstrap, topic, 10_000)
    config = write_config(stack, tmp_path, deleted_topic_grace_seconds=30)
    cli("topic", "enable", topic, "--config", str(config))
    ctx = SidecarContext.build(settings(config))
    ctx.cluster = cluster = OneAnswerLacks(stack.bootstrap)
    sidecar = Sidecar(ctx)
    sidecar.start()
    try:
        topic_id = cluster.topics([topic])[topic].topic_id
        wait_for(lambda: len(refs(ctx, topic, topic_id)) >= 2, 120, "uploads", step=sidecar.tick)
        objects = topic_objects(ctx, topic, topic_id)
        cluster.hidden = topic
        sidecar.tick()  # one answer lacks the topic (the old sidecar deleted its remote data right here)
        assert delete_state(ctx, topic_id) is None
        assert topic_objects(ctx, topic, topic_id) == objects
        assert absences(config)[topic_id]["checks"] == 1  # noted, persisted
        cluster.hidden = None
        sidecar.tick()  # the next answer has it again: the absence is forgotten
        assert topic_id not in absences(config)
        cluster.hidden = topic
        for _ in range(2):
            sidecar.tick()  # a short run of answers without it is not enough either
        assert delete_state(ctx, topic_id) is None and topic_objects(ctx, topic, topic_id) == objects
    finally:
        sidecar.stop()
        sidecar.close()


def test_a_deleted_topic_waits_out_the_grace_and_a_restart_neither_resets_nor_shortcuts_it(
    stack: Endpoints, tmp_path: Path
) -> None:
    topic = create_topic(stack.bootstrap, internal_segment_bytes=SEGMENT)
    produce(stack.bootstrap, topic, 10_000)
    grace = 6.0
    config = write_config(stack, tmp_path, deleted_topic_grace_seconds=grace)
    cli("topic", "enable", topic, "--config", str(config))
    with running(config) as (ctx, sidecar):
        topic_id = ctx.cluster.topics([topic])[topic].topic_id
        wait_for(lambda: len(refs(ctx, topic, topic_id)) >= 2, 120, "uploads", step=sidecar.tick)
        objects = topic_objects(ctx, topic, topic_id)
        delete_topic(stack, topic)
        sidecar.tick()
        sidecar.tick()
        assert delete_state(ctx, topic_id) is None, "remote data deleted on the first answers that lacked it"
        assert topic_objects(ctx, topic, topic_id) == objects
    before = absences(config)[topic_id]
    assert before["checks"] == 2
    time.sleep(grace + 1)  # longer than the grace, with no sidecar watching
    with running(config) as (ctx, sidecar):
        sidecar.tick()
        after = absences(config)[topic_id]
        assert after["checks"] == 3 and after["first_missing_ms"] == before["first_missing_ms"]  # not reset
        assert after["observed_ms"] == before["observed_ms"] < grace * 1000  # the unwatched time did not count
        assert delete_state(ctx, topic_id) is None and topic_objects(ctx, topic, topic_id) == objects
        wait_for(lambda: cleaned(ctx, topic_id), 120, "DELETE_PARTITION_FINISHED after the grace", step=sidecar.tick)
        assert topic_objects(ctx, topic, topic_id) == []
        sidecar.tick()
        assert topic_id not in absences(config)  # nothing left to decide about it


def test_a_topic_created_again_under_its_name_is_a_new_topic(stack: Endpoints, tmp_path: Path) -> None:
    topic = create_topic(stack.bootstrap, internal_segment_bytes=SEGMENT)
    produce(stack.bootstrap, topic, 10_000)
    config = write_config(stack, tmp_path, deleted_topic_grace_seconds=3)
    cli("topic", "enable", topic, "--config", str(config))
    admin = AdminClient({"bootstrap.servers": stack.bootstrap})
    with running(config) as (ctx, sidecar):
        old_id = ctx.cluster.topics([topic])[topic].topic_id
        wait_for(lambda: len(refs(ctx, topic, old_id)) >= 2, 120, "uploads", step=sidecar.tick)
        new_id: str | None = old_id
        # The old sidecar's lookup by name took whichever id its replay order put last: after a snapshot
        # (topics sorted by id) the larger one. Re-create until the new id sorts first, which is the case
        # where the old id won.
        while new_id is None or topic_id_bytes(new_id) >= topic_id_bytes(old_id):
            delete_topic(stack, topic)
            topic_config = {"internal.segment.bytes": str(SEGMENT)}
            admin.create_topics([NewTopic(topic, 1, 1, config=topic_config)])[topic].result(60)
            wait_for(lambda: live_topic_id(ctx, topic) is not None, 60, "the new topic's metadata")
            new_id = live_topic_id(ctx, topic)
        produce(stack.bootstrap, topic, 10_000)
        assert "enabled tiering for" in cli("topic", "enable", topic, "--config", str(config))
        wait_for(lambda: ctx.manager.tiering(new_id) is not None, 30, "the enable to be applied")
        ctx.manager.snapshot_now()  # the CLI's next view starts from this snapshot
        again = cli("topic", "enable", topic, "--config", str(config))
        assert "already enabled" in again, again
        status = json.loads(cli("topic", "status", topic, "--json", "--config", str(config)))
        assert status["topic_id"] == new_id and status["tiering"]["enabled"]
        wait_for(lambda: len(refs(ctx, topic, new_id)) >= 2, 120, "the new topic's uploads", step=sidecar.tick)
        wait_for(lambda: cleaned(ctx, old_id), 120, "the old topic's remote data to go", step=sidecar.tick)
        assert topic_objects(ctx, topic, old_id) == []
        assert delete_state(ctx, new_id) is None and topic_objects(ctx, topic, new_id)
        side = json.loads((settings(config).state_dir / "status.json").read_text())["partitions"]
        assert side[f"{new_id}/0"]["topic"] == topic
        status = json.loads(cli("topic", "status", topic, "--json", "--config", str(config)))
        assert status["partitions"][0]["copy_lag_bytes"] is not None
