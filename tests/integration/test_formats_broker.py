"""Our decoder against the real broker's segment files and against Kafka's own DumpLogSegments.

Records are produced with every codec, keys and null keys, null values, headers, explicit
timestamps, one committed and one aborted transaction; every record the broker acknowledged is
compared field by field with what we decode from its files.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, Message, Producer

from deploy.kafka import run_kafka_tool
from deploy.stack import Endpoints
from tests.conftest import create_topic
from tiering_core.formats import (
    RecordBatch,
    control_marker,
    iter_batches,
    list_segments,
    mapped,
    parse_txn_index,
)

pytestmark = pytest.mark.integration

CODECS = ("none", "gzip", "snappy", "lz4", "zstd")


@dataclass
class Produced:
    topic: str
    partition_dir: Path
    expected: dict[int, tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]], int]]
    aborted: set[int] = field(default_factory=set)
    committed: set[int] = field(default_factory=set)


def _produce(producer: Producer, topic: str, records: list, sink: dict, offsets: set | None = None) -> None:
    """Produce ``records`` and record each acknowledged one in ``sink`` under its offset."""

    def reporter(record: tuple) -> Callable[[KafkaError | None, Message], None]:
        def report(err: KafkaError | None, msg: Message) -> None:
            assert err is None, f"delivery failed: {err}"
            sink[msg.offset()] = record
            if offsets is not None:
                offsets.add(msg.offset())

        return report

    for record in records:
        key, value, headers, ts = record
        producer.produce(
            topic, key=key, value=value, headers=headers or None, timestamp=ts, on_delivery=reporter(record)
        )
        producer.poll(0)


@pytest.fixture(scope="module")
def produced(stack: Endpoints) -> Produced:
    topic = create_topic(stack.bootstrap, internal_segment_bytes=65536)
    expected: dict = {}
    base_ts = int(time.time() * 1000) - 60_000
    for c, codec in enumerate(CODECS):
        producer = Producer(
            {
                "bootstrap.servers": stack.bootstrap,
                "compression.type": codec,
                "linger.ms": 2,
                "batch.size": 16384,
            }
        )
        records = []
        for i in range(1200):
            key = None if i % 5 == 0 else f"{codec}-key-{i}".encode()
            value = None if i % 11 == 0 else (f"{codec}:{i}:" * (1 + i % 13)).encode()
            headers = [("trace", f"{i}".encode()), ("empty", None)] if i % 3 == 0 else []
            records.append(
                (
                    key if key is not None or value is not None else f"k{c}-{i}".encode(),
                    value,
                    headers,
                    base_ts + c * 10_000 + i,
                )
            )
        _produce(producer, topic, records, expected)
        assert producer.flush(60) == 0
    result = Produced(topic, Path(stack.brokers[0].log_dir) / f"{topic}-0", expected)
    txn = Producer({"bootstrap.servers": stack.bootstrap, "transactional.id": f"{topic}-txn", "linger.ms": 2})
    txn.init_transactions(60)
    for commit, sink in ((True, result.committed), (False, result.aborted)):
        txn.begin_transaction()
        records = [
            (f"txn-{commit}-{i}".encode(), f"txn value {i}".encode(), [], base_ts + 90_000 + i) for i in range(40)
        ]
        _produce(txn, topic, records, expected, sink)
        assert txn.flush(60) == 0
        if commit:
            txn.commit_transaction(60)
        else:
            txn.abort_transaction(60)
    tail = Producer({"bootstrap.servers": stack.bootstrap})
    _produce(tail, topic, [(b"after", b"txns", [], base_ts + 100_000)], expected)
    assert tail.flush(60) == 0
    return result


def _batches(partition_dir: Path) -> Iterator[tuple[Path, RecordBatch]]:
    for segment in list_segments(partition_dir):
        with mapped(segment.log) as buf:
            for batch in iter_batches(str(segment.log), buf):
                yield segment.log, batch


def test_every_acknowledged_record_decodes_identically(produced: Produced) -> None:
    decoded: dict[int, tuple] = {}
    markers: dict[str, list[int]] = {}
    codecs_seen: set[str] = set()
    for _, batch in _batches(produced.partition_dir):
        codecs_seen.add(batch.header.compression)
        for record in batch.records:
            if batch.header.is_control:
                markers.setdefault(control_marker(record).kind, []).append(record.offset)
            else:
                decoded[record.offset] = (record.key, record.value, list(record.headers), record.timestamp)
    assert len(list_segments(produced.partition_dir)) >= 2  # rolled segments and the active one
    assert codecs_seen == set(CODECS)
    assert set(decoded) == set(produced.expected)
    for offset, (key, value, headers, ts) in produced.expected.items():
        assert decoded[offset] == (key, value, headers, ts), f"offset {offset}"
    assert len(markers["COMMIT"]) == 1 and len(markers["ABORT"]) == 1
    assert markers["COMMIT"][0] > max(produced.committed)
    assert markers["ABORT"][0] > max(produced.aborted)


def test_aborted_records_are_in_the_txn_index(produced: Produced) -> None:
    aborted = []
    for segment in list_segments(produced.partition_dir):
        if segment.txnindex.exists():
            aborted += parse_txn_index(segment.txnindex.read_bytes(), str(segment.txnindex))
    assert len(aborted) == 1
    entry = aborted[0]
    assert entry.first_offset == min(produced.aborted)
    assert entry.last_offset > max(produced.aborted)
    assert not any(entry.first_offset <= o <= entry.last_offset for o in produced.committed)


_BATCH_LINE = re.compile(
    r"baseOffset: (\d+) lastOffset: (\d+) count: (\d+) .*?isTransactional: (\w+) isControl: (\w+) "
    r".*?position: (\d+) \w+: (-?\d+) size: (\d+) magic: 2 compresscodec: (\w+) crc: (\d+) isvalid: (\w+)"
)
_RECORD_LINE = re.compile(
    r"\| offset: (\d+) \w+: (-?\d+) keySize: (-?\d+) valueSize: (-?\d+) .*?headerKeys: \[([^\]]*)\]"
)


def test_dump_log_segments_agrees_batch_by_batch(produced: Produced) -> None:
    segments = list_segments(produced.partition_dir)
    files = ",".join(str(s.log) for s in segments)
    result = run_kafka_tool("org.apache.kafka.tools.DumpLogSegments", "--files", files, "--deep-iteration")
    assert result.returncode == 0, result.stderr[-2000:]
    theirs_batches = []
    theirs_records = []
    for line in result.stdout.splitlines():
        if line.startswith("baseOffset:"):
            m = _BATCH_LINE.search(line)
            assert m is not None, line
            theirs_batches.append(
                (
                    int(m[1]),
                    int(m[2]),
                    int(m[3]),
                    m[4] == "true",
                    m[5] == "true",
                    int(m[6]),
                    int(m[7]),
                    int(m[8]),
                    m[9],
                    int(m[10]),
                    m[11],
                )
            )
        elif line.startswith("| offset:"):
            m = _RECORD_LINE.search(line)
            assert m is not None, line
            keys = [k for k in m[5].split(",") if k]
            theirs_records.append((int(m[1]), int(m[2]), int(m[3]), int(m[4]), keys))
    ours_batches = []
    ours_records = []
    for _, batch in _batches(produced.partition_dir):
        h = batch.header
        ours_batches.append(
            (
                h.base_offset,
                h.last_offset,
                h.records_count,
                h.is_transactional,
                h.is_control,
                h.position,
                h.max_timestamp,
                h.size,
                h.compression,
                h.crc,
                "true",
            )
        )
        for r in batch.records:
            ours_records.append(
                (
                    r.offset,
                    r.timestamp,
                    -1 if r.key is None else len(r.key),
                    -1 if r.value is None else len(r.value),
                    [k for k, _ in r.headers],
                )
            )
    assert len(theirs_batches) > 20
    assert ours_batches == theirs_batches
    assert ours_records == theirs_records
