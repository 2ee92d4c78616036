"""The ``kafka_client`` settings reach every Kafka client the project makes: on a broker whose only listener
needs SASL/PLAIN, the sidecar (admin client, metadata WAL producer and consumer) tiers a topic and local
retention releases what is remote; ``tiering consume`` (the reader's catalog and consumer) reads it all
back byte for byte, and so does ``tiering export --include-local-tail`` (its broker tail), as does a
TieredConsumer given the SASL properties in its consumer configuration only; ``tiering topic status``
works through it too. The password comes from ``TIERING_KAFKA_CLIENT__SASL_PASSWORD`` and shows nowhere."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from deploy.stack import Endpoints
from reader import TieredConsumer
from tests.export_readers import exported_rows
from tests.integration.test_sidecar_policies import SEGMENT, cli, running
from tests.sasl_broker import PASSWORD, SaslBroker, sasl_broker
from tests.sidecar_harness import wait_for, write_config

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def sasl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SaslBroker]:
    with sasl_broker(tmp_path_factory.mktemp("kafka-sasl")) as broker:
        yield broker


def test_sidecar_and_reader_work_through_a_sasl_listener(
    stack: Endpoints, sasl: SaslBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = f"t-{uuid.uuid4().hex[:10]}"
    admin = AdminClient(sasl.client_config())
    config = {"internal.segment.bytes": str(SEGMENT)}
    admin.create_topics([NewTopic(topic, 1, 1, config=config)])[topic].result(60)
    produced = [f"sasl-{i}-".encode() * 8 for i in range(6_000)]
    errors: list[object] = []
    producer = Producer({**sasl.client_config(), "linger.ms": 5, "batch.size": 16384})
    for value in produced:
        producer.produce(topic, value=value, on_delivery=lambda err, _msg: errors.append(err) if err else None)
        producer.poll(0)
    assert producer.flush(60) == 0 and not errors, errors[:3]
    client = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN", "sasl.username": "tiering"}
    path = write_config(stack, tmp_path, bootstrap_servers=sasl.bootstrap, log_dirs=[str(sasl.log_dir)],
                        kafka_client=client)  # fmt: skip
    monkeypatch.setenv("TIERING_KAFKA_CLIENT__SASL_PASSWORD", PASSWORD)  # the secret from the environment
    cli("topic", "enable", topic, "--local-retention-bytes", str(2 * SEGMENT), "--config", str(path))
    with running(path) as (ctx, sidecar):
        assert PASSWORD not in repr(ctx.settings)

        def released() -> bool:
            return ctx.cluster.local_offsets([(topic, 0)])[(topic, 0)].lx > 2_000

        wait_for(released, 180, "uploads and local retention through the SASL listener", step=sidecar.tick)
        lx = ctx.cluster.local_offsets([(topic, 0)])[(topic, 0)].lx
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]), *sys.path])}
    consumed = subprocess.run(
        [sys.executable, "-m", "tiering", "consume", topic, "--from-beginning", "--max-messages", str(len(produced)),
         "--print-offset", "--config", str(path)],
        capture_output=True, env=env, timeout=300, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert consumed.returncode == 0, consumed.stderr.decode()[-3000:]
    rows = [line.split(b"\t") for line in consumed.stdout.splitlines()]
    offsets = [int(where.split(b" ")[0].split(b":")[1]) for where, _ in rows]
    assert offsets == list(range(len(produced))), (
        f"offsets read {offsets[:3]}...{offsets[-3:]} ({len(offsets)}, {len(set(offsets))} distinct), not each of "
        f"0-{len(produced) - 1} once in order; stderr: {consumed.stderr.decode()[-3000:]}"
    )
    assert [value for _, value in rows] == produced, "records read back differ from those produced"
    sources = [where.split(b" ")[1] for where, _ in rows]
    assert sources[:lx] == [b"remote"] * lx and set(sources[lx:]) <= {b"broker", b"remote"}
    laptop = {k: v for k, v in yaml.safe_load(path.read_text()).items() if k not in ("log_dirs", "broker_id",
                                                                                    "state_dir")}  # fmt: skip
    operator = tmp_path / "laptop.yaml"
    operator.write_text(yaml.safe_dump(laptop))  # an operator's host: SASL settings, no broker settings
    status = subprocess.run(
        [sys.executable, "-m", "tiering", "topic", "status", topic, "--json", "--config", str(operator)],
        capture_output=True, text=True, env=env, timeout=180,
    )  # fmt: skip
    assert status.returncode == 0, status.stderr[-3000:]
    assert json.loads(status.stdout)["topic"] == topic
    assert PASSWORD not in consumed.stderr.decode() + status.stderr + status.stdout

    # The Spark export's local tail reads the untiered rest from the broker through the same listener.
    out = tmp_path / "export"
    exported = subprocess.run(
        [sys.executable, "-m", "tiering", "export", topic, "--format", "parquet", "--path", str(out),
         "--include-local-tail", "--config", str(path)],
        capture_output=True, text=True, env=env, timeout=600, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert exported.returncode == 0, exported.stderr[-3000:]
    rows = [(r["offset"], r["value"]) for r in exported_rows(str(out), "parquet", ["offset", "value"])]
    assert rows == list(enumerate(produced)), "the export (remote part and broker tail) differs from what was produced"
    assert PASSWORD not in exported.stderr + exported.stdout

    # A TieredConsumer given only a consumer configuration: its catalog logs in with the consumer's own
    # SASL properties (where the remote copies are comes from TIERING_* variables).
    doc = yaml.safe_load(path.read_text())
    for key, value in doc["remote_storage"].items():
        monkeypatch.setenv(f"TIERING_REMOTE_STORAGE__{key.upper()}", str(value))
    monkeypatch.setenv("TIERING_METADATA_TOPIC", doc["metadata_topic"])
    monkeypatch.delenv("TIERING_KAFKA_CLIENT__SASL_PASSWORD")
    got: list[bytes | None] = []
    with TieredConsumer({**sasl.client_config(), "group.id": f"g-{topic}", "enable.auto.commit": False}) as consumer:
        consumer.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + 120
        while len(got) < lx and time.monotonic() < deadline:
            for message in consumer.consume(500, 1.0):
                assert message.error() is None, message.error()
                got.append(message.value())
    assert got[:lx] == produced[:lx]


def test_without_the_right_sasl_settings_the_listener_refuses_the_clients(
    stack: Endpoints, sasl: SaslBroker, tmp_path: Path
) -> None:
    """The properties matter: without them, or with a wrong password, nothing connects (no silent fallback), and
    librdkafka's reason is on stderr, never the password."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]), *sys.path])}
    wrong = "not-the-s3cret"
    client = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN", "sasl.username": "tiering",
              "sasl.password": wrong}  # fmt: skip
    for kafka_client in ({}, client):
        path = write_config(stack, tmp_path, bootstrap_servers=sasl.bootstrap, log_dirs=[str(sasl.log_dir)],
                            kafka_client=kafka_client)  # fmt: skip
        result = subprocess.run([sys.executable, "-m", "tiering", "topic", "status", "x", "--config", str(path)],
                                capture_output=True, text=True, env=env, timeout=180)  # fmt: skip
        assert result.returncode == 1
        assert f"cannot reach the Kafka cluster at {sasl.bootstrap}" in result.stderr.splitlines()[-1]
        if kafka_client:
            assert "SASL authentication error: Authentication failed: Invalid username or password" in result.stderr
            assert wrong not in result.stderr
