"""The compiled decoder against the pure-Python reference on segments the broker wrote itself.

Every codec, headers (some with null values), null keys and null values, a committed and an aborted
transaction, LogAppendTime, records of 1 MB and batches of 10,000 tiny records: both decoders must
give the same records through the consumer's path and the same Arrow rows through the Spark data
source's (aborted transactions and control batches dropped, given the segments' ``.txnindex``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import Producer

from deploy.stack import Endpoints
from tests.conftest import create_topic
from tests.decoders import DECODERS, column_outcome, outcome
from tiering_core.formats import list_segments, parse_txn_index, scan_headers

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
BIG = 1_000_000


def _producer(bootstrap: str, **config: object) -> Producer:
    return Producer({"bootstrap.servers": bootstrap, "message.max.bytes": 3_000_000, **config})


def _produce(producer: Producer, topic: str, records: list[tuple[bytes | None, bytes | None, list]]) -> None:
    for key, value, headers in records:
        while True:
            try:
                producer.produce(topic, key=key, value=value, headers=headers or None)
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    assert producer.flush(120) == 0


@dataclass(frozen=True)
class BrokerSegments:
    partition_dirs: list[Path]
    tiny_rounds: int  # how many times the 12,000 tiny records were produced


@pytest.fixture(scope="module")
def broker_segments(stack: Endpoints) -> BrokerSegments:
    bootstrap = stack.bootstrap
    mixed = create_topic(bootstrap, segment_bytes=1 << 20, max_message_bytes=3_000_000)
    for c, codec in enumerate(CODECS):
        records = [
            (None if i % 5 == 0 else f"{codec}-key-{i}".encode(),
             None if i % 11 == 0 else (f"{codec}:{i}:" * (1 + i % 13)).encode(),
             [("trace", str(i).encode()), ("empty", None), ("", b"")] if i % 3 == 0 else [])
            for i in range(600)
        ]  # fmt: skip
        _produce(_producer(bootstrap, **{"compression.type": codec, "linger.ms": 5}), mixed, records)
        big = [(b"big", bytes([c]) * BIG, [("n", b"1")]), (None, bytes(range(256)) * (BIG // 256), [])]
        _produce(_producer(bootstrap, **{"compression.type": codec}), mixed, big)
    # A linger longer than the produce loop can take on a loaded machine (1 s was not: CI once saw the
    # 12,000 records split below 10,000 per batch); flush() sends what lingers at once. librdkafka does
    # not promise one batch even so (a loaded local run still split them, 1 in 3 after the Spark tests):
    # the records are produced again until a batch of 10,000 is on disk.
    tiny = _producer(bootstrap, **{"linger.ms": 60_000, "batch.size": 1 << 20, "batch.num.messages": 20000})
    tiny_rounds = 0
    while tiny_rounds < 5:
        _produce(tiny, mixed, [(None, b"%d" % (i % 10), []) for i in range(12000)])
        tiny_rounds += 1
        if _largest_batch(Path(stack.brokers[0].log_dir) / f"{mixed}-0") >= 10_000:
            break
    txn = _producer(bootstrap, **{"transactional.id": f"{mixed}-txn", "linger.ms": 2})
    txn.init_transactions(60)
    for commit in (True, False):
        txn.begin_transaction()
        _produce(txn, mixed, [(f"txn-{commit}-{i}".encode(), b"v%d" % i, []) for i in range(50)])
        if commit:
            txn.commit_transaction(60)
        else:
            txn.abort_transaction(60)
    _produce(_producer(bootstrap), mixed, [(b"after", b"txns", [])])
    appended = create_topic(bootstrap, message_timestamp_type="LogAppendTime")
    for codec in CODECS:
        _produce(_producer(bootstrap, **{"compression.type": codec, "linger.ms": 5}), appended,
                 [(b"k%d" % i, b"appended %d" % i, []) for i in range(300)])  # fmt: skip
    log_dir = Path(stack.brokers[0].log_dir)
    return BrokerSegments([log_dir / f"{mixed}-0", log_dir / f"{appended}-0"], tiny_rounds)


def _largest_batch(partition_dir: Path) -> int:
    """The most records any batch of the partition's segments holds."""
    return max((h.records_count for segment in list_segments(partition_dir)
                for h in scan_headers(str(segment.log), segment.log.read_bytes())), default=0)  # fmt: skip


def _segments(partition_dir: Path) -> list[tuple[bytes, tuple[tuple[int, int, int], ...]]]:
    out = []
    for segment in list_segments(partition_dir):
        aborted = ()
        if segment.txnindex.exists():
            entries = parse_txn_index(segment.txnindex.read_bytes(), str(segment.txnindex))
            aborted = tuple((a.producer_id, a.first_offset, a.last_offset) for a in entries)
        out.append((segment.log.read_bytes(), aborted))
    return out


def test_broker_segments_decode_identically_as_messages(broker_segments: BrokerSegments) -> None:
    shapes: set[str] = set()
    for partition_dir in broker_segments.partition_dirs:
        for data, _ in _segments(partition_dir):
            python, native = (outcome(name, data) for name in DECODERS)
            assert isinstance(python, list), python
            assert native == python
            for header, records in python:
                shapes.add(header.compression)
                shapes.add(header.timestamp_type)
                if header.records_count >= 10_000:
                    shapes.add("10k records")
                if header.is_control:
                    shapes.add("control")
                if any(r[0][3] is not None and len(r[0][3]) >= BIG for r in records):
                    shapes.add("1 MB record")
    wanted = {*CODECS, "LogAppendTime", "CreateTime", "10k records", "control", "1 MB record"}
    assert shapes >= wanted, f"the broker-written segments lack {sorted(wanted - shapes)}"


def test_broker_segments_give_identical_arrow_rows(broker_segments: BrokerSegments) -> None:
    rows = 0
    aborted_seen = False
    for partition_dir in broker_segments.partition_dirs:
        for data, aborted in _segments(partition_dir):
            aborted_seen |= bool(aborted)
            python, native = (column_outcome(name, data, aborted=aborted, window=1 << 20) for name in DECODERS)
            assert isinstance(python, list), python
            assert native == python
            rows += len(native)
    assert aborted_seen
    tiny = 12000 * broker_segments.tiny_rounds
    assert rows == 5 * (600 + 2) + tiny + 50 + 1 + 5 * 300  # every committed record, once
