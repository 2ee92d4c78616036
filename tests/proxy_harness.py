"""Shared pieces of the proxy's integration tests: a proxy in front of the stack, clients through it."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from prometheus_client import CollectorRegistry

from deploy.procs import free_port
from reader.proxy import ProxyListen, ProxyServer, load_proxy_settings, running_proxy
from tests.conftest import create_topic
from tests.sidecar_harness import Produced

UNHURRIED = 30.0
"""``fetch_ahead_max_age_seconds`` for a test that counts answers asked ahead and served: on a loaded machine a
client is often later than half the default 0.1 s after its answer (so none is asked ahead for it) or a held
answer older than 0.1 s when claimed (dropped as stale); what such a test asserts must not hang on the load."""


@contextmanager
def proxy_for(config: Path, bootstrap: str, admin_config: dict[str, str] | None = None,
              **listen: Any) -> Iterator[ProxyServer]:  # fmt: skip
    """A proxy in front of the cluster of ``bootstrap``, reading the remote data of the sidecar config."""
    admin = AdminClient(admin_config or {"bootstrap.servers": bootstrap})
    nodes = sorted(admin.list_topics(timeout=30).brokers)
    ports = {n: free_port() for n in nodes}
    settings = load_proxy_settings(config, proxy=ProxyListen(bootstrap_port=0, broker_ports=ports,
                                                             broker_port_base=None, **listen))  # fmt: skip
    with running_proxy(settings, CollectorRegistry()) as proxy:
        yield proxy


def proxy_bootstrap(proxy: ProxyServer) -> str:
    return f"127.0.0.1:{proxy.bootstrap_port}"


def read_all(bootstrap: str, topic: str, ends: dict[int, int], timeout: float = 180,
             **config: Any) -> dict[int, list[Any]]:  # fmt: skip
    """Every record of ``topic`` from offset 0 (assign at the beginning, no group) until each partition
    reaches its end offset; messages by partition in delivery order."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"proxy-test-{time.monotonic_ns()}",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest", **config})  # fmt: skip
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in ends])
        got: dict[int, list[Any]] = {p: [] for p in ends}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for m in consumer.consume(1000, 1.0):
                assert m.error() is None, m.error()
                got[m.partition()].append(m)
            positions = consumer.position([TopicPartition(topic, p) for p in ends])
            if all(tp.offset >= ends[tp.partition] for tp in positions):
                return got
        raise AssertionError(f"not at the end after {timeout}s: {[(p, len(got[p])) for p in ends]}")
    finally:
        consumer.close()


def random_topic(bootstrap: str, partitions: int, per_partition: int,
                 text: bool = False) -> tuple[str, dict[int, dict[int, tuple]]]:  # fmt: skip
    """A new topic of ``partitions`` partitions, ``per_partition`` records of 0-3 KiB of random bytes each (every
    byte value; ``text``: their hex digits, for readers that print text), lz4, nothing tiered; the topic and its
    records by partition and offset."""
    topic = create_topic(bootstrap, partitions=partitions)
    produced: dict[int, dict[int, tuple]] = {p: {} for p in range(partitions)}
    rng = random.Random(7)

    def report(record: tuple) -> object:
        def done(err: KafkaError | None, msg: Message) -> None:
            assert err is None, f"delivery failed: {err}"
            produced[msg.partition()][msg.offset()] = record

        return done

    producer = Producer({"bootstrap.servers": bootstrap, "compression.type": "lz4", "linger.ms": 20})
    for n in range(partitions * per_partition):
        value = rng.randbytes(rng.randrange(0, 3072))
        record = (f"k{n}".encode(), value.hex().encode() if text else value, [])
        while True:
            try:
                producer.produce(topic, key=record[0], value=record[1], partition=n % partitions,
                                 on_delivery=report(record))  # fmt: skip
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(120) == 0
    return topic, produced


def check_exact(offsets_and_records: list[tuple[int, tuple]], want: Produced) -> None:
    """Every wanted offset exactly once, in order, byte for byte; nothing else."""
    offsets = [o for o, _ in offsets_and_records]
    assert offsets == sorted(set(offsets)), "duplicates or out of order"
    missing = sorted(set(want) - set(offsets))
    extra = sorted(set(offsets) - set(want))
    assert not missing and not extra, f"missing {missing[:5]} ({len(missing)}), extra {extra[:5]} ({len(extra)})"
    for offset, record in offsets_and_records:
        assert record == want[offset], f"offset {offset} differs"


def console_consume(bootstrap: str, topic: str, count: int, isolation: str = "read_uncommitted",
                    timeout_ms: int = 120_000, extra: tuple[str, ...] = ()
                    ) -> list[tuple[int, int, bytes | None, bytes | None]]:  # fmt: skip
    """Kafka's own Java console consumer (``--from-beginning``): (partition, offset, key, value) per line.
    ``extra``: more of its arguments (``--consumer.config``, ``--group``)."""
    from deploy.kafka import run_kafka_tool

    result = run_kafka_tool(
        "org.apache.kafka.tools.consumer.ConsoleConsumer", "--bootstrap-server", bootstrap, "--topic", topic,
        "--from-beginning", "--max-messages", str(count), "--timeout-ms", str(timeout_ms),
        "--isolation-level", isolation, "--property", "print.partition=true", "--property", "print.offset=true",
        "--property", "print.key=true", "--property", "key.separator=\t", *extra, timeout=timeout_ms / 1000 + 120,
    )  # fmt: skip
    lines = [line for line in result.stdout.splitlines() if line.startswith("Partition:")]
    assert len(lines) == count, f"console consumer printed {len(lines)} of {count} records: {result.stderr[-2000:]}"
    out = []
    for line in lines:
        partition, offset, key, value = line.split("\t", 3)
        out.append((int(partition.split(":")[1]), int(offset.split(":")[1]), _text(key), _text(value)))
    return out


def _text(field: str) -> bytes | None:
    return None if field == "null" else field.encode()


def kcat_consume(bootstrap: str, topic: str, partition: int, count: int, extra: tuple[str, ...] = ()
                 ) -> list[tuple[int, bytes, bytes]]:  # fmt: skip
    """kcat (librdkafka's C tool) from the beginning of one partition to its end: (offset, key, value) each.
    Records are framed by kcat's own format string with lengths, so any bytes come back exact. ``extra``: more of
    its arguments (``-X`` properties)."""
    import subprocess

    result = subprocess.run(
        ["kcat", "-C", "-b", bootstrap, "-t", topic, "-p", str(partition), "-o", "beginning", "-e", "-c", str(count),
         "-f", "%o %K %S:%k%s", *extra],
        capture_output=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr.decode(errors="replace")[-2000:]
    out, data = [], result.stdout
    pos = 0
    while pos < len(data):
        head, rest = data[pos:].split(b":", 1)
        offset, key_len, value_len = (int(x) for x in head.split())
        key = rest[: max(key_len, 0)]
        value = rest[max(key_len, 0) : max(key_len, 0) + max(value_len, 0)]
        out.append((offset, key if key_len >= 0 else None, value if value_len >= 0 else None))
        pos += len(head) + 1 + max(key_len, 0) + max(value_len, 0)
    return out
