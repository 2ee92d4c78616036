"""Shared pieces of the sidecar's integration tests: configuration, producing, checking."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import boto3
import yaml
from confluent_kafka import KafkaError, Message, Producer

from deploy.stack import Endpoints
from tiering.config import SidecarSettings, load_settings
from tiering.sidecar.context import SidecarContext
from tiering.sidecar.runner import Sidecar
from tiering_core.formats import iter_batches, list_segments, mapped

Produced = dict[int, tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]]


def write_config(
    stack: Endpoints, tmp_path: Path, broker: int = 1, prefix: str | None = None, **overrides: Any
) -> Path:
    """A sidecar YAML config for ``broker`` of the stack, storing segments in the stack's MinIO.

    Sidecars of one cluster share ``prefix`` and ``metadata_topic`` (pass both); by default each
    config gets fresh ones, so tests do not see each other's data.
    """
    config = {
        "bootstrap_servers": stack.bootstrap,
        "log_dirs": [stack.broker(broker).log_dir],
        "broker_id": broker,
        "state_dir": str(tmp_path / f"state-{broker}"),
        "remote_storage": {
            "kind": "s3", "bucket": stack.s3.bucket, "prefix": prefix or f"it-{uuid.uuid4().hex[:8]}",
            "endpoint_url": stack.s3.endpoint_url, "region": stack.s3.region, "path_style": True,
            "access_key_id": stack.s3.access_key, "secret_access_key": stack.s3.secret_key,
            "part_size": 5 << 20, "max_attempts": 2, "connect_timeout": 2, "read_timeout": 10,
        },
        "metadata_topic": f"__tiering_metadata_{uuid.uuid4().hex[:8]}",
        "metadata_partitions": 4,
        "rescan_interval_seconds": 1,
        "metrics_port": None,
        **overrides,
    }  # fmt: skip
    path = tmp_path / f"sidecar-{broker}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def session_credentials(stack: Endpoints, deny: dict[str, str]) -> dict[str, str]:
    """AWS_* variables of temporary credentials (STS AssumeRole on the stack's MinIO) whose session policy
    allows everything except each action in ``deny`` on its resource ARN (wildcards allowed): a store that
    refuses some requests, as a bucket or IAM policy would."""
    sts = boto3.client(
        "sts", endpoint_url=stack.s3.endpoint_url, region_name=stack.s3.region,
        aws_access_key_id=stack.s3.access_key, aws_secret_access_key=stack.s3.secret_key,
    )  # fmt: skip
    statements = [{"Effect": "Allow", "Action": ["s3:*"], "Resource": ["arn:aws:s3:::*"]}]
    statements += [{"Effect": "Deny", "Action": [a], "Resource": [r]} for a, r in deny.items()]
    policy = json.dumps({"Version": "2012-10-17", "Statement": statements})
    creds = sts.assume_role(RoleArn="arn:xxx:xxx:xxx:xxxx", RoleSessionName="tiering-tests", Policy=policy,
                            DurationSeconds=3600)["Credentials"]  # fmt: skip
    return {
        "AWS_ACCESS_KEY_ID": creds["AccessKeyId"],
        "AWS_SECRET_ACCESS_KEY": creds["SecretAccessKey"],
        "AWS_SESSION_TOKEN": creds["SessionToken"],
    }


def settings(path: Path) -> SidecarSettings:
    return load_settings(path)


def produce_mixed(bootstrap: str, topic: str, count: int, seed: int = 0, partition: int = 0,
                  batch_bytes: int = 65536) -> Produced:  # fmt: skip
    """Produce ``count`` records to ``partition`` with every codec, keys, null values and headers, plus one
    committed and one aborted transaction, in batches of up to ``batch_bytes``; returns each acknowledged
    record by offset (aborted ones included)."""
    produced: Produced = {}

    def reporter(record: tuple) -> Callable[[KafkaError | None, Message], None]:
        def report(err: KafkaError | None, msg: Message) -> None:
            assert err is None, f"delivery failed: {err}"
            produced[msg.offset()] = record

        return report

    codecs = ["none", "gzip", "snappy", "lz4", "zstd"]
    per_codec = count // len(codecs)
    for c, codec in enumerate(codecs):
        producer = Producer({"bootstrap.servers": bootstrap, "compression.type": codec, "linger.ms": 5,
                             "batch.size": batch_bytes, "enable.idempotence": True})  # fmt: skip
        for i in range(per_codec):
            n = seed + c * per_codec + i
            key = None if n % 17 == 0 else f"key-{n % 1000}".encode()
            value = None if n % 23 == 0 else f"{codec}|{n}|{'v' * (n % 120)}".encode()
            headers = [("n", str(n).encode()), ("empty", None)] if n % 5 == 0 else []
            record = (key, value, headers)
            while True:
                try:
                    producer.produce(
                        topic,
                        key=key,
                        value=value,
                        headers=headers or None,
                        partition=partition,
                        on_delivery=reporter(record),
                    )
                    break
                except BufferError:
                    producer.poll(0.05)
        assert producer.flush(120) == 0
    txn = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{topic}-{seed}", "linger.ms": 5})
    txn.init_transactions(60)
    for commit in (True, False):
        txn.begin_transaction()
        for i in range(50):
            record = (f"txn-{commit}-{i}".encode(), f"value {i}".encode(), [])
            txn.produce(topic, key=record[0], value=record[1], partition=partition, on_delivery=reporter(record))
        txn.flush(60)
        txn.commit_transaction(60) if commit else txn.abort_transaction(60)
    return produced


def wait_for(condition: Callable[[], bool], timeout: float, what: str, step: Callable[[], None] | None = None) -> None:
    """Run ``step`` and check ``condition`` until it holds; a bounded loop, AssertionError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if step is not None:
            step()
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def snapshot_segments(partition_dir: Path, into: Path) -> dict[int, bytes]:
    """Copies of the partition's rolled segment files, by base offset (the broker's bytes, as written)."""
    into.mkdir(parents=True, exist_ok=True)
    out = {}
    for seg in list_segments(partition_dir)[:-1]:
        out[seg.base_offset] = seg.log.read_bytes()
    return out


def decoded_offsets(data: bytes, name: str) -> dict[int, tuple]:
    return {
        r.offset: (r.key, r.value, list(r.headers), b.header.is_control)
        for b in iter_batches(name, data)
        for r in b.records
    }


def local_offsets(partition_dir: Path, from_offset: int) -> dict[int, tuple]:
    out: dict[int, tuple] = {}
    for seg in list_segments(partition_dir):
        with mapped(seg.log) as buf:
            out.update({o: v for o, v in decoded_offsets(bytes(buf), str(seg.log)).items() if o >= from_offset})
    return out


@contextmanager
def sidecars_running(configs: dict[int, Path]) -> Iterator[dict[int, Sidecar]]:
    """One sidecar per broker's config, each running its loop in a thread; all stopped and joined on exit."""
    sidecars = {b: Sidecar(SidecarContext.build(settings(c))) for b, c in configs.items()}
    threads = [threading.Thread(target=s.run_forever, daemon=True) for s in sidecars.values()]
    for t in threads:
        t.start()
    try:
        yield sidecars
    finally:
        for s in sidecars.values():
            s.stop()
        for t in threads:
            t.join(60)
