"""One logging setup for every ``tiering`` command: logs on stderr, command output alone on stdout; readable
lines at WARNING for interactive commands, JSON lines at INFO for services, ``--log-level`` /
``TIERING_LOG_LEVEL`` and ``--log-format`` / ``TIERING_LOG_FORMAT`` on the root command; librdkafka's lines
through the same log."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from deploy.stack import Endpoints
from tests.conftest import create_topic
from tests.integration.test_sidecar_policies import SEGMENT, cli, produce
from tests.sidecar_harness import write_config

pytestmark = pytest.mark.integration
TEXT_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR) [\w.]+: \S")


def tiering(*args: str, env: dict[str, str] | None = None, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """``python -m tiering ...`` as an operator runs it (this checkout's code first on the path)."""
    full = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]), *sys.path]), **(env or {})}
    for name in ("TIERING_LOG_LEVEL", "TIERING_LOG_FORMAT"):
        if env is None or name not in env:
            full.pop(name, None)
    return subprocess.run([sys.executable, "-m", "tiering", *args], capture_output=True, text=True, timeout=timeout,
                          env=full, stdin=subprocess.DEVNULL)  # fmt: skip


def lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def test_topic_status_keeps_stdout_for_its_json_and_logs_readable_lines(stack: Endpoints, tmp_path: Path) -> None:
    topic = create_topic(stack.bootstrap, internal_segment_bytes=SEGMENT)
    produce(stack.bootstrap, topic, 2_000)
    config = write_config(stack, tmp_path)
    cli("topic", "enable", topic, "--config", str(config))
    result = tiering("topic", "status", topic, "--json", "--config", str(config), env={"TIERING_LOG_LEVEL": "INFO"})
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["topic"] == topic  # stdout holds the output and nothing else
    logged = lines(result.stderr)
    assert any("metadata recovered" in line for line in logged), "TIERING_LOG_LEVEL=INFO showed no INFO line"
    assert all(TEXT_LINE.match(line) for line in logged), logged
    quiet = tiering("topic", "status", topic, "--json", "--config", str(config))
    assert quiet.returncode == 0 and json.loads(quiet.stdout)["topic"] == topic
    assert not any(" INFO " in line for line in lines(quiet.stderr)), "an interactive command logs at WARNING"


@pytest.mark.slow  # slow: it waits for librdkafka's own log lines in each format
def test_librdkafkas_lines_follow_the_chosen_format(stack: Endpoints, tmp_path: Path) -> None:
    with socket.socket() as s:  # nothing listens there: librdkafka fails to connect again and again
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    config = write_config(stack, tmp_path, bootstrap_servers=f"127.0.0.1:{closed}")
    text = tiering("topic", "status", "some-topic", "--config", str(config))
    assert text.returncode == 1 and text.stdout == ""
    logged = lines(text.stderr)
    assert logged[-1].startswith("Error: ") and f"127.0.0.1:{closed}" in logged[-1]  # click's message, last
    assert all(TEXT_LINE.match(line) for line in logged[:-1]), logged
    refused = [line for line in logged if " librdkafka: " in line and "Connection refused" in line]
    assert refused and all(" ERROR librdkafka: librdkafka facility=FAIL " in line for line in refused)
    as_json = tiering("--log-format", "json", "topic", "status", "some-topic", "--config", str(config))
    assert as_json.returncode == 1 and as_json.stdout == ""
    docs = [json.loads(line) for line in lines(as_json.stderr)[:-1]]
    assert any(d["logger"] == "librdkafka" and "Connection refused" in d["message"] for d in docs)


def test_consume_prints_records_on_stdout_and_json_logs_on_stderr(stack: Endpoints, tmp_path: Path) -> None:
    topic = create_topic(stack.bootstrap, internal_segment_bytes=SEGMENT)
    produce(stack.bootstrap, topic, 1_500)
    config = write_config(stack, tmp_path)
    cli("topic", "enable", topic, "--config", str(config))
    result = tiering("--log-level", "INFO", "consume", topic, "--from-beginning", "--max-messages", "1500",
                     "--config", str(config), env={"TIERING_LOG_FORMAT": "json"})  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [f"value-{i}-" * 8 for i in range(1_500)]
    logged = lines(result.stderr)
    assert logged[-1] == "Processed a total of 1500 messages"
    docs = [json.loads(line) for line in logged[:-1]]
    assert any(d["level"] == "info" and d["event"] == "metadata recovered" for d in docs)
