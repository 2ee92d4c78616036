"""``tiering consume`` fails the way scripts can trust: an unreachable cluster, a missing topic or partition and
an offset past the end exit 1 with one sentence, within --timeout-ms; ``--json`` prints one object per record."""

from __future__ import annotations

import base64
import json
import socket
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer

from deploy.stack import Endpoints
from tests.conftest import create_topic
from tests.integration.test_cli_logging import lines, tiering
from tests.reader_harness import tiered_topic
from tests.sidecar_harness import write_config

pytestmark = pytest.mark.integration


def closed_port() -> int:
    with socket.socket() as s:  # nothing listens there once closed
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def failed(*args: str) -> str:
    """Run ``tiering consume ...`` that must fail: exit 1, nothing on stdout; returns the error line."""
    result = tiering("consume", *args)
    assert result.returncode == 1, result.stderr
    assert result.stdout == ""
    return lines(result.stderr)[-1]


def test_consume_exits_1_with_one_sentence_within_the_timeout(stack: Endpoints, tmp_path: Path) -> None:
    port = closed_port()  # no timing assertion (shared machines): a hang fails on tiering()'s own timeout
    line = failed("T", "--bootstrap-server", f"127.0.0.1:{port}", "--from-beginning", "--timeout-ms", "3000")
    assert line.startswith(f"Error: cannot reach the Kafka cluster at 127.0.0.1:{port} within 3000 ms: "), line
    config = write_config(stack, tmp_path)
    topic = create_topic(stack.bootstrap)
    producer = Producer({"bootstrap.servers": stack.bootstrap})
    for i in range(10):
        producer.produce(topic, value=f"v{i}".encode())
    assert producer.flush(30) == 0
    missing = f"{topic}-missing"
    assert failed(missing, "--from-beginning", "--timeout-ms", "5000", "--config", str(config)).startswith(
        f"Error: topic {missing!r} does not exist in the cluster at {stack.bootstrap}"
    )
    assert failed(topic, "--partition", "3", "--timeout-ms", "5000", "--config", str(config)) == (
        f"Error: topic {topic!r} has no partition 3 (it has 1 partitions)"
    )
    assert failed(topic, "--partition", "0", "--offset", "50", "--timeout-ms", "5000", "--config", str(config)) == (
        f"Error: offset 50 is past the end of {topic}-0 (next offset: 10)"
    )
    usage = tiering("consume", topic, "--offset", "first", "--config", str(config))
    assert usage.returncode == 2 and "'first' is not earliest, latest or an offset" in usage.stderr


def test_consume_json_prints_one_object_per_record_with_encodings(stack: Endpoints, tmp_path: Path) -> None:
    config = write_config(stack, tmp_path)
    topic = create_topic(stack.bootstrap)
    producer = Producer({"bootstrap.servers": stack.bootstrap})
    now = int(time.time() * 1000)  # not older than the retention: the broker would delete it
    producer.produce(topic, key=b"k\xff", value=b"text", headers=[("h", b"\x00\x9f"), ("n", None)], timestamp=now)
    producer.produce(topic, value=None, timestamp=now + 1)
    assert producer.flush(30) == 0
    result = tiering("consume", topic, "--offset", "earliest", "--json", "--max-messages", "2", "--timeout-ms",
                     "20000", "--config", str(config))  # fmt: skip
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert records == [
        {"topic": topic, "partition": 0, "offset": 0, "timestamp": now,
         "key": {"encoding": "base64", "data": base64.b64encode(b"k\xff").decode()},
         "value": {"encoding": "utf-8", "data": "text"},
         "headers": [{"key": "h", "value": {"encoding": "base64", "data": base64.b64encode(b"\x00\x9f").decode()}},
                     {"key": "n", "value": None}],
         "source": "broker"},
        {"topic": topic, "partition": 0, "offset": 1, "timestamp": now + 1, "key": None, "value": None, "headers": [],
         "source": "broker"},
    ]  # fmt: skip
    assert lines(result.stderr)[-1] == "Processed a total of 2 messages"


def test_consume_without_the_remote_store_exits_1_instead_of_looping(stack: Endpoints, tmp_path: Path) -> None:
    """Given only --bootstrap-server, the reader looks for the copies in the default filesystem store, where
    they are not: one line naming the partition and the store, exit 1 (it printed "remote object missing"
    twice a poll, forever)."""
    with tiered_topic(stack, tmp_path) as tiered:
        env = {"TIERING_METADATA_TOPIC": tiered.ctx.settings.metadata_topic}  # as the default WAL of a real cluster
        # looping forever fails on tiering()'s own timeout
        result = tiering("consume", tiered.topic, "--bootstrap-server", stack.bootstrap, "--from-beginning",
                         "--timeout-ms", "10000", env=env)  # fmt: skip
        assert result.returncode == 1, result.stderr
        assert result.stdout == ""
        line = lines(result.stderr)[-1]
        assert line.startswith(
            f"Error: cannot read {tiered.topic} partition 0 (brokers {stack.bootstrap}, remote storage filesystem): "
        ), line
