"""Status answers fast and tells the truth (issue 15, item 7): ``topic status`` with the store down shows what Kafka
and the metadata WAL know and says the store is unreachable (exit 1); ``cluster status`` lists a re-created topic
once, with its topic id; untiered partitions show '-', not None; ``dev status --json`` redacts the S3 secret key;
``dev status`` of a missing stack exits 1."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from confluent_kafka.admin import AdminClient, NewTopic

from deploy.cli import REDACTED
from deploy.stack import Endpoints
from tests.conftest import create_topic
from tests.integration.test_cli_admin_any_host import ok
from tests.integration.test_cli_consume_failures import closed_port
from tests.integration.test_cli_logging import lines, tiering
from tests.reader_harness import tiered_topic
from tests.sidecar_harness import wait_for, write_config
from tiering.cli.main import main

pytestmark = pytest.mark.integration


def test_topic_status_with_the_store_down_shows_what_it_knows_and_says_so(stack: Endpoints, tmp_path: Path) -> None:
    with tiered_topic(stack, tmp_path) as tiered:
        ry_before = tiered.remote_end()
        assert ry_before is not None
        settings = yaml.safe_load(tiered.config.read_text())
        for host_only in ("log_dirs", "broker_id", "state_dir"):  # from an operator's host, as a laptop has it
            del settings[host_only]
        port = closed_port()
        settings["remote_storage"]["endpoint_url"] = f"http://127.0.0.1:{port}"
        down = tmp_path / "store-down.yaml"
        down.write_text(yaml.safe_dump(settings))
        result = tiering("topic", "status", tiered.topic, "--config", str(down))
        assert result.returncode == 1, result.stderr
        assert lines(result.stderr)[-1].startswith(
            f"Error: remote store http://127.0.0.1:{port} is unreachable (head "
        ), result.stderr
        assert f"{tiered.topic} (" in result.stdout and "enabled" in result.stdout, result.stdout
        described = tiering("topic", "status", tiered.topic, "--json", "--config", str(down))
        assert described.returncode == 1
        known = json.loads(described.stdout)
        assert known["store"]["reachable"] is False and known["store"]["error"].startswith("remote store http://")
        (row,) = known["partitions"]
        assert row["Rx"] == 0 and row["Ry"] >= ry_before and row["Lx"] > 0, row  # from the WAL and Kafka
        assert known["tiering"]["enabled"] is True
        with_store = json.loads(ok("topic", "status", tiered.topic, "--json", "--config", str(tiered.config)))
        assert with_store["store"]["reachable"] is True and with_store["partitions"][0]["Rx"] == 0


def test_untiered_partitions_show_a_dash_not_none(stack: Endpoints, tmp_path: Path) -> None:
    config = write_config(stack, tmp_path)
    topic = create_topic(stack.bootstrap, 3)
    ok("topic", "enable", topic, "--config", str(config))  # enabled, nothing uploaded yet
    table = ok("topic", "status", topic, "--config", str(config))
    rows = [line for line in table.splitlines() if line.startswith("│")]
    assert len(rows) == 3 and "None" not in table, table
    for line in rows:
        cells = [cell.strip() for cell in line.strip("│").split("│")]
        assert cells[4:6] == ["-", "-"], line  # Rx, Ry


def _recreate(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_topics([topic])[topic].result(30)
    wait_for(lambda: topic not in admin.list_topics(timeout=10).topics, 60, f"{topic} to be deleted")
    deadline = time.monotonic() + 60
    while True:  # the broker refuses the name for a moment after the deletion
        try:
            admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def test_cluster_status_lists_a_recreated_topic_once_with_its_topic_id(stack: Endpoints, tmp_path: Path) -> None:
    config = write_config(stack, tmp_path)
    c = ["--config", str(config)]
    topic = create_topic(stack.bootstrap)
    ok("topic", "enable", topic, *c)
    first_id = json.loads(ok("topic", "status", topic, "--json", *c))["topic_id"]
    _recreate(stack.bootstrap, topic)
    ok("topic", "enable", topic, *c)
    second_id = json.loads(ok("topic", "status", topic, "--json", *c))["topic_id"]
    assert second_id != first_id
    listed = json.loads(ok("cluster", "status", "--json", *c))["topics"]
    assert [(t["topic"], t["topic_id"], t["in_kafka"], t["earlier_topic_ids"]) for t in listed] == [
        (topic, second_id, True, [first_id])
    ]
    table = ok("cluster", "status", *c)
    rows = [line for line in table.splitlines() if topic in line]
    assert len(rows) == 1 and second_id in rows[0] and first_id in rows[0], table


def test_dev_status_redacts_the_secret_and_fails_without_a_stack(stack: Endpoints, tmp_path: Path) -> None:
    shown = CliRunner().invoke(main, ["dev", "status", "--json", "--dir", stack.stack_dir])
    assert shown.exit_code == 0, shown.output
    status = json.loads(shown.stdout)
    assert status["running"] is True and status["s3"]["secret_key"] == REDACTED
    assert stack.s3.secret_key not in shown.output
    missing = tmp_path / "no-stack"
    result = tiering("dev", "status", "--dir", str(missing))
    assert result.returncode == 1 and result.stdout == ""
    assert lines(result.stderr) == [f"Error: no stack in {missing} (start one with `tiering dev up`)"]
    as_json = tiering("dev", "status", "--json", "--dir", str(missing))
    assert as_json.returncode == 1 and json.loads(as_json.stdout) == {"running": False, "stack_dir": str(missing)}
