"""A configuration the CLI cannot use is one clean error, never a traceback: malformed YAML, a typo inside a nested
section, a CA file that does not exist, no broker id or log_dirs for ``sidecar run`` from environment variables."""

from __future__ import annotations

import json
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
    missing_ca = tmp_path / "missing-ca.yaml"
    missing_ca.write_text(f'bootstrap_servers: "a:1"\nremote_storage:\n  kind: s3\n  bucket: x\n'
                          f'  ca_bundle: {tmp_path}/no-such-ca.pem\n')  # fmt: skip
    assert error_lines("topic", "status", "t", "--config", str(missing_ca)) == [
        f"Error: invalid sidecar configuration in {missing_ca}:",
        "  remote_storage.ca_bundle: Path does not point to a file",
    ]


def test_sidecar_without_broker_id_or_log_dirs_says_what_to_set(tmp_path: Path) -> None:
    """Only ``sidecar run`` needs a broker id and log_dirs (``topic`` and ``cluster`` commands run from any host):
    its last words name what is missing."""
    env = {"TIERING_BOOTSTRAP_SERVERS": "127.0.0.1:1", "TIERING_STATE_DIR": str(tmp_path / "state"),
           "TIERING_REMOTE_STORAGE__KIND": "filesystem",
           "TIERING_REMOTE_STORAGE__ROOT": str(tmp_path / "remote")}  # fmt: skip

    def last_words(extra: dict[str, str]) -> str:
        result = tiering("sidecar", "run", env={**env, **extra}, timeout=60)
        assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
        return str(json.loads(lines(result.stderr)[-1])["error"])

    assert last_words({"TIERING_LOG_DIRS": str(tmp_path / "data")}) == (
        f"broker_id is not set and no meta.properties with node.id in log_dirs {tmp_path / 'data'}: set "
        "broker_id (TIERING_BROKER_ID) or log_dirs to the broker's log.dirs"
    )
    assert last_words({}) == "log_dirs is not set: the sidecar runs beside a broker and needs its log.dirs"
