"""What must not be tiered is refused by ``tiering topic enable`` and skipped by the sidecar whatever the
metadata says; ``tiering topic rollback --delete-remote`` lists what exists only remotely and deletes
nothing unless confirmed."""

from __future__ import annotations

import json
import logging
import os
import pty
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner
from confluent_kafka.admin import AdminClient, NewTopic

from deploy.stack import Endpoints
from metadata import TopicRecord
from segment_fsm import TopicAction
from tests.conftest import create_topic
from tests.integration.test_sidecar_policies import SEGMENT, cli, lx, produce, refs, running, topic_objects
from tests.sidecar_harness import wait_for, write_config
from tiering.cli.main import main

pytestmark = pytest.mark.integration


def create_named(bootstrap: str, name: str) -> str:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    config = {"internal.segment.bytes": str(SEGMENT)}
    admin.create_topics([NewTopic(name, 1, 1, config=config)])[name].result(60)
    return name


def refused(args: list[str]) -> str:
    """Run a command that must be refused: exit 1; returns what the user sees (stdout and stderr)."""
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1, result.output
    return result.output


def tiered_topics(config: Path) -> list[str]:
    status = json.loads(cli("cluster", "status", "--json", "--config", str(config)))
    return [t["topic"] for t in status["topics"]]


def test_enable_refuses_internal_and_streams_topics_with_one_line(stack: Endpoints, tmp_path: Path) -> None:
    wal = f"tiering-wal-{uuid.uuid4().hex[:8]}"  # a configured WAL name: refused though it lacks the __
    config = write_config(stack, tmp_path, metadata_topic=wal)
    suffix = uuid.uuid4().hex[:8]
    repartition = create_named(stack.bootstrap, f"app-{suffix}-KSTREAM-AGGREGATE-STATE-STORE-0000000003-repartition")
    changelog = create_named(stack.bootstrap, f"app-{suffix}-counts-changelog")  # delete policy: by name
    cases = {
        wal: f"cannot tier {wal}: it is the tiering metadata WAL (metadata_topic); the tool never tiers its own log",
        "__tiering_metadata": "cannot tier __tiering_metadata: it is an internal topic (names starting with __ "
        "belong to Kafka and its tools)",
        "__consumer_offsets": "cannot tier __consumer_offsets: it is an internal topic",
        "__transaction_state": "cannot tier __transaction_state: it is an internal topic",
        "__cluster_metadata": "cannot tier __cluster_metadata: it is an internal topic",
        repartition: f"cannot tier {repartition}: it is named as a Kafka Streams internal topic",
        changelog: f"cannot tier {changelog}: it is named as a Kafka Streams internal topic",
    }
    for name, line in cases.items():
        output = refused(["topic", "enable", name, "--local-retention-bytes", "1", "--config", str(config)])
        assert output.splitlines() == [output.strip()] and output.startswith(f"Error: {line}"), output
    assert tiered_topics(config) == [], "a refused topic was enabled anyway"
    assert "enabled tiering for" in cli("topic", "enable", create_topic(stack.bootstrap), "--config", str(config))


def test_the_sidecar_never_copies_or_trims_a_refused_topic_the_metadata_enables(
    stack: Endpoints, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="tiering.sidecar.runner")
    suffix = uuid.uuid4().hex[:8]
    control = create_topic(stack.bootstrap, internal_segment_bytes=SEGMENT)
    internal = create_named(stack.bootstrap, f"__it-{suffix}")
    streams = create_named(stack.bootstrap, f"app-{suffix}-KSTREAM-MAP-0000000001-repartition")
    for topic in (control, internal, streams):
        produce(stack.bootstrap, topic, 20_000)
    config = write_config(stack, tmp_path)
    cli("topic", "enable", control, "--local-retention-bytes", str(2 * SEGMENT), "--config", str(config))
    with running(config) as (ctx, sidecar):
        wal = ctx.settings.metadata_topic
        infos = ctx.cluster.topics([internal, streams, wal])
        for name, info in infos.items():  # as an older version's enable (or a hand-written record) did
            record = TopicRecord(topic=name, topic_id=info.topic_id, action=TopicAction.ENABLE,
                                 event_time=ctx.now_ms(), local_retention_bytes=1)  # fmt: skip
            assert ctx.manager.publish(record).accepted
        wait_for(lambda: all(ctx.manager.tiering(i.topic_id) for i in infos.values()), 30, "the enables to apply")
        wait_for(lambda: lx(ctx, control) > 0, 120, "the control topic's uploads and trimming", step=sidecar.tick)
        for _ in range(3):
            sidecar.tick()
        for name in (internal, streams):
            assert lx(ctx, name) == 0, f"{name} was trimmed"
            assert refs(ctx, name, infos[name].topic_id) == [] and ctx.manager.segments(infos[name].topic_id, 0) == []
            assert topic_objects(ctx, name, infos[name].topic_id) == [], f"{name} was copied"
        assert not any(key[0] in {i.topic_id for i in infos.values()} for key in sidecar.tasks)
    logged = [r.getMessage() for r in caplog.records if "is never tiered" in r.getMessage()]
    assert len(logged) == 3, logged  # once per topic, not once per tick
    for name, why in ((internal, "internal topic"), (streams, "Kafka Streams"), (wal, "metadata WAL")):
        assert any(f"topic={name} " in m and f"cannot tier {name}: it is" in m and why in m for m in logged), logged


def tiered_with_remote_only_offsets(stack: Endpoints, tmp_path: Path) -> tuple[str, Path]:
    topic = create_topic(stack.bootstrap, internal_segment_bytes=SEGMENT)
    produce(stack.bootstrap, topic, 20_000)
    config = write_config(stack, tmp_path)
    cli("topic", "enable", topic, "--local-retention-bytes", str(2 * SEGMENT), "--config", str(config))
    return topic, config


def rollback_at_a_terminal(config: Path, topic: str, answer: str) -> tuple[int, str]:
    """``tiering topic rollback TOPIC --delete-remote`` with a terminal on stdin, answering ``answer``."""
    controller, terminal = pty.openpty()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]), *sys.path])}
    try:
        os.write(controller, answer.encode() + b"\n")  # typed ahead: the terminal holds the line
        done = subprocess.run(
            [sys.executable, "-m", "tiering", "topic", "rollback", topic, "--delete-remote", "--config", str(config)],
            stdin=terminal, capture_output=True, text=True, timeout=180, env=env,
        )  # fmt: skip
    finally:
        os.close(terminal)
        os.close(controller)
    return done.returncode, done.stdout + done.stderr


def test_rollback_delete_remote_lists_remote_only_offsets_and_deletes_only_when_confirmed(
    stack: Endpoints, tmp_path: Path
) -> None:
    topic, config = tiered_with_remote_only_offsets(stack, tmp_path)
    with running(config) as (ctx, sidecar):
        topic_id = ctx.cluster.topics([topic])[topic].topic_id
        wait_for(lambda: lx(ctx, topic) > 0, 120, "local retention to apply", step=sidecar.tick)
        state = ctx.manager.partition_state(topic_id, 0)
        rx, last = state.remote_start_offset, min(state.remote_end_offset, lx(ctx, topic) - 1)
        listed = f"  partition 0: offsets {rx}-{last} ({last - rx + 1} offsets)"
        objects, copies = topic_objects(ctx, topic, topic_id), refs(ctx, topic, topic_id)
        assert objects and copies

        output = refused(["topic", "rollback", topic, "--delete-remote", "--config", str(config)])
        assert listed in output.splitlines(), output
        assert output.splitlines()[-1] == (f"Error: not confirmed (stdin is not a terminal): nothing was rolled back "
                                           f"or deleted for {topic}; run again with --yes")  # fmt: skip
        code, shown = rollback_at_a_terminal(config, topic, "n")
        assert code == 1 and listed in shown.splitlines(), shown
        assert f"Roll back {topic} and delete its remote data for good? [y/N]" in shown, shown
        assert f"Error: not confirmed: nothing was rolled back or deleted for {topic}" in shown, shown
        assert topic_objects(ctx, topic, topic_id) == objects, "remote objects went without a confirmation"
        assert refs(ctx, topic, topic_id) == copies
        status = json.loads(cli("topic", "status", topic, "--json", "--config", str(config)))
        assert status["tiering"]["enabled"] and not status["tiering"]["rolled_back"], status["tiering"]

        output = cli("topic", "rollback", topic, "--delete-remote", "--yes", "--config", str(config))
        assert listed in output.splitlines() and f"{topic}: deleted {len(copies)} remote segment copies" in output
        assert topic_objects(ctx, topic, topic_id) == []
