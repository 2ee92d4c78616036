"""``tiering topic alter`` changes the local retention of a tiered topic, validated as ``enable`` validates it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from deploy.stack import Endpoints
from tests.conftest import create_topic
from tests.integration.test_cli_topic_safety import refused
from tests.integration.test_sidecar_policies import cli
from tests.sidecar_harness import write_config
from tiering.cli.main import main

pytestmark = pytest.mark.integration


def retention(config: Path, topic: str) -> tuple[int, int]:
    tiering = json.loads(cli("topic", "status", topic, "--json", "--config", str(config)))["tiering"]
    return tiering["local_retention_ms"], tiering["local_retention_bytes"]


def test_alter_changes_the_local_retention_and_refuses_what_enable_refuses(stack: Endpoints, tmp_path: Path) -> None:
    config = write_config(stack, tmp_path)
    topic = create_topic(stack.bootstrap, retention_ms=600_000)
    c = ["--config", str(config)]
    assert refused(["topic", "alter", topic, "--local-retention-ms", "1000", *c]).splitlines() == [
        f"Error: tiering is not enabled for {topic}: run tiering topic enable {topic} first"
    ]
    assert "enabled tiering for" in cli("topic", "enable", topic, "--local-retention-ms", "60000", *c)
    assert "nothing changed (to change the local retention: tiering topic alter" in cli(
        "topic", "enable", topic, "--local-retention-ms", "120000", *c
    )
    assert cli("topic", "alter", topic, "--local-retention-ms", "120000", *c).splitlines() == [
        f"{topic}: local.retention.ms 60000 -> 120000, local.retention.bytes -2 -> -2; the total retention stays "
        "retention.ms=600000, retention.bytes=-1"
    ]
    assert retention(config, topic) == (120_000, -2)
    assert "local.retention.bytes -2 -> 5000000" in cli(
        "topic", "alter", topic, "--local-retention-bytes", "5000000", *c
    )
    assert retention(config, topic) == (120_000, 5_000_000)
    assert "nothing changed" in cli("topic", "alter", topic, "--local-retention-ms", "120000", *c)
    too_long = refused(["topic", "alter", topic, "--local-retention-ms", "900000", *c])
    other = create_topic(stack.bootstrap, retention_ms=600_000)
    assert too_long.replace(topic, "T") == refused(
        ["topic", "enable", other, "--local-retention-ms", "900000", *c]
    ).replace(other, "T")  # the same refusal, word for word
    assert too_long.startswith(f"Error: topic {topic}: ") and len(too_long.splitlines()) == 1, too_long
    assert retention(config, topic) == (120_000, 5_000_000), "a refused alter changed the retention"
    usage = CliRunner().invoke(main, ["topic", "alter", topic, *c])
    assert usage.exit_code == 2 and "give --local-retention-ms and/or --local-retention-bytes" in usage.output
