"""A configuration the CLI cannot use is one clean error, never a traceback: malformed YAML, a typo inside a nested
section, no broker id found for a configuration from environment variables."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.test_cli_logging import lines, tiering

pytestmark = pytest.mark.integration


def error_lines(*args: str, env: dict[str, str] | None = None) -> list[str]:
    result = tiering(*args, env=env, timeout=60)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    return [line for line in lines(result.stderr) if " librdkafka: " not in line]


def test_malformed_yaml_and_a_nested_typo_are_named(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text('bootstrap_servers: "a:1"\nremote_storage: {kind: s3, bucket: [x\n')
    assert error_lines("topic", "status", "t", "--config", str(bad)) == [
        f"Error: invalid sidecar configuration: {bad} is not valid YAML: expected ',' or ']', but got "
        "'<stream end>' at line 3, column 1"
    ]
    typo = tmp_path / "typo.yaml"
    typo.write_text(f'bootstrap_servers: "a:1"\nlog_dirs: ["{tmp_path}"]\nremote_storage:\n  kind: s3\n  buckt: x\n')
    assert error_lines("topic", "status", "t", "--config", str(typo)) == [
        f"Error: invalid sidecar configuration in {typo}:",
        "  remote_storage.bucket: Field required",
        "  remote_storage.buckt: unknown setting",
    ]


def test_no_broker_id_from_the_environment_is_one_sentence(tmp_path: Path) -> None:
    env = {"TIERING_BOOTSTRAP_SERVERS": "127.0.0.1:1", "TIERING_LOG_DIRS": str(tmp_path / "data"),
           "TIERING_STATE_DIR": str(tmp_path / "state"), "TIERING_REMOTE_STORAGE__KIND": "filesystem",
           "TIERING_REMOTE_STORAGE__ROOT": str(tmp_path / "remote")}  # fmt: skip
    assert error_lines("topic", "status", "t", env=env) == [
        f"Error: broker_id is not set and no meta.properties with node.id in log_dirs {tmp_path / 'data'}: set "
        "broker_id (TIERING_BROKER_ID) or log_dirs to the broker's log.dirs"
    ]
