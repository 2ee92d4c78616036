"""``tiering topic`` and ``tiering cluster`` from an operator's host (issue 15, items 3 and 5): the bootstrap
servers, the Kafka client settings and the store are enough (no log_dirs, no broker id); read-only commands create
nothing; every command takes --timeout and exits 1 with one sentence when the cluster cannot be reached, the topic
is missing or, for what needs it, the store does not answer; ``reader serve`` and ``export`` check the cluster at
start."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner, Result
from confluent_kafka.admin import AdminClient

from deploy.stack import Endpoints
from tests.conftest import create_topic
from tests.integration.test_cli_consume_failures import closed_port
from tests.integration.test_cli_logging import lines, tiering
from tiering.cli.main import main

pytestmark = pytest.mark.integration

# Every command that talks to the cluster, with what it needs besides NAME (None: it takes no NAME).
COMMANDS: list[tuple[list[str], bool]] = [
    (["topic", "status"], True),
    (["topic", "enable"], True),
    (["topic", "alter", "--local-retention-ms", "1000"], True),
    (["topic", "pause-upload"], True),
    (["topic", "resume-upload"], True),
    (["topic", "pause-download"], True),
    (["topic", "resume-download"], True),
    (["topic", "rollback"], True),
    (["cluster", "status"], False),
    (["cluster", "pause-upload"], False),
    (["cluster", "resume-upload"], False),
    (["cluster", "rollback"], False),
]


def laptop_config(stack: Endpoints, tmp_path: Path, **overrides: object) -> Path:
    """What an operator's laptop has: bootstrap servers, Kafka client settings, the store. No log_dirs, no
    broker id, no state_dir."""
    config = {
        "bootstrap_servers": stack.bootstrap,
        "kafka_client": {"client.id": "operator-laptop"},
        "remote_storage": {
            "kind": "s3", "bucket": stack.s3.bucket, "prefix": f"it-{uuid.uuid4().hex[:8]}",
            "endpoint_url": stack.s3.endpoint_url, "region": stack.s3.region, "path_style": True,
            "access_key_id": stack.s3.access_key, "secret_access_key": stack.s3.secret_key,
        },
        "metadata_topic": f"__tiering_metadata_{uuid.uuid4().hex[:8]}",
        "metadata_partitions": 4,
        **overrides,
    }  # fmt: skip
    path = tmp_path / "laptop.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def run(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(main, list(args), env=env)


def ok(*args: str, env: dict[str, str] | None = None) -> str:
    result = run(*args, env=env)
    assert result.exit_code == 0, result.output
    return result.stdout


def error_line(result: Result) -> str:
    """The sentence of a command that failed: exit 1, nothing on stdout, only librdkafka's log lines before it."""
    assert result.exit_code == 1, result.output
    assert result.stdout == "", result.stdout
    said = lines(result.stderr)
    assert all(" librdkafka: " in line for line in said[:-1]), said
    return said[-1]


def topics_in(bootstrap: str) -> set[str]:
    return set(AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=30).topics)


def test_every_command_works_from_a_host_with_only_bootstrap_client_settings_and_store(
    stack: Endpoints, tmp_path: Path
) -> None:
    config = laptop_config(stack, tmp_path)
    wal = yaml.safe_load(config.read_text())["metadata_topic"]
    topic = create_topic(stack.bootstrap, 2, retention_ms=600_000)
    env = {"TIERING_CONFIG": str(config)}  # as --help says: the file may come from TIERING_CONFIG
    for command, _ in COMMANDS:
        help_text = ok(*command[:2], "--help")
        assert "TIERING_CONFIG" in help_text and "--timeout SECONDS" in help_text, (command, help_text)

    status = ok("topic", "status", topic, env=env)  # read-only, before anything was tiered
    assert f"{topic} (" in status and "not tiered" in status and "None" not in status, status
    assert ok("cluster", "status", env=env).splitlines() == [
        f"cluster: nothing is tiered (metadata topic {wal} does not exist at {stack.bootstrap}: no sidecar has run yet)"
    ]
    assert json.loads(ok("cluster", "status", "--json", env=env))["topics"] == []
    assert wal not in topics_in(stack.bootstrap), "a read-only command created the metadata topic"

    assert f"enabled tiering for {topic} (2 partitions)" in ok("topic", "enable", topic, env=env)
    assert wal in topics_in(stack.bootstrap)
    assert "local.retention.ms -2 -> 1000" in ok("topic", "alter", topic, "--local-retention-ms", "1000", env=env)
    actions = {"pause-upload": "uploads paused", "resume-upload": "uploads resumed",
               "pause-download": "remote reads paused", "resume-download": "remote reads resumed"}  # fmt: skip
    for action, done in actions.items():
        assert ok("topic", action, topic, "--timeout", "20", env=env) == f"{topic}: {done}\n"
    described = json.loads(ok("topic", "status", topic, "--json", env=env))
    assert described["tiering"]["enabled"] and described["tiering"]["local_retention_ms"] == 1000
    assert [p["partition"] for p in described["partitions"]] == [0, 1]
    assert described["store"] == {"endpoint": stack.s3.endpoint_url, "reachable": True, "error": None}
    assert ok("cluster", "pause-upload", env=env) == "uploads paused cluster-wide\n"
    assert json.loads(ok("cluster", "status", "--json", env=env))["cluster"] == {"upload_paused": True,
                                                                                 "rolled_back": False}  # fmt: skip
    assert ok("cluster", "resume-upload", env=env) == "uploads resumed cluster-wide\n"
    assert ok("topic", "rollback", topic, env=env).splitlines() == [
        f"{topic}: rolled back; the broker's retention now governs its local log"
    ]
    assert ok("cluster", "rollback", env=env) == "tiering rolled back cluster-wide\n"
    tiered = json.loads(ok("cluster", "status", "--json", env=env))
    assert tiered["cluster"]["rolled_back"] and [t["topic"] for t in tiered["topics"]] == [topic]


@pytest.mark.slow  # slow: it waits out the clients' timeouts against an unreachable cluster and store
def test_unreachable_cluster_missing_topic_and_unreachable_store_are_one_sentence(
    stack: Endpoints, tmp_path: Path
) -> None:
    port = closed_port()
    down = laptop_config(stack, tmp_path, bootstrap_servers=f"127.0.0.1:{port}")
    for command, takes_name in COMMANDS:
        args = [*command[:2], *(["T"] if takes_name else []), *command[2:]]
        line = error_line(run(*args, "--config", str(down), "--timeout", "2"))
        assert line.startswith(f"Error: cannot reach the Kafka cluster at 127.0.0.1:{port} within 2 s: "), (args, line)
    # the real commands, as a script runs them; reader serve checks the cluster at start
    service = tmp_path / "reader.yaml"
    service.write_text(yaml.safe_dump({"bootstrap_servers": f"127.0.0.1:{port}",
                                       "http": {"allow_unauthenticated": True}}))  # fmt: skip
    for args in (["topic", "status", "T", "--config", str(down)], ["reader", "serve", "--config", str(service)],
                 ["export", "T", "--path", str(tmp_path / "out"), "--config", str(down)]):  # fmt: skip
        result = tiering(*args, "--timeout", "2")
        assert result.returncode == 1 and result.stdout == "", result.stderr
        line = lines(result.stderr)[-1]
        assert line.startswith(f"Error: cannot reach the Kafka cluster at 127.0.0.1:{port} within 2 s: "), line

    config = laptop_config(stack, tmp_path)
    missing = f"missing-{uuid.uuid4().hex[:8]}"
    for command, takes_name in COMMANDS:
        if takes_name:
            line = error_line(run(*command[:2], missing, *command[2:], "--config", str(config)))
            assert line == f"Error: topic {missing!r} does not exist in the cluster at {stack.bootstrap}", line

    topic = create_topic(stack.bootstrap)
    ok("topic", "enable", topic, "--config", str(config))
    store_port = closed_port()
    settings = yaml.safe_load(config.read_text())
    settings["remote_storage"]["endpoint_url"] = f"http://127.0.0.1:{store_port}"
    no_store = tmp_path / "no-store.yaml"
    no_store.write_text(yaml.safe_dump(settings))
    line = error_line(run("topic", "rollback", topic, "--delete-remote", "--yes", "--config", str(no_store)))
    assert line.startswith(f"Error: remote store http://127.0.0.1:{store_port} is unreachable ("), line
    assert line.endswith("; nothing was changed"), line
    assert not json.loads(ok("topic", "status", topic, "--json", "--config", str(config)))["tiering"]["rolled_back"]
    paused = run("topic", "pause-upload", topic, "--config", str(no_store))  # needs Kafka only: done, with a warning
    assert paused.exit_code == 0 and paused.stdout == f"{topic}: uploads paused\n", paused.output
    assert lines(paused.stderr)[-1].startswith(f"Warning: remote store http://127.0.0.1:{store_port} is unreachable")
