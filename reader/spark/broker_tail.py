"""The optional local tail: offsets above the remote data's stable end, read from the broker.

With ``includeLocalTail=true`` (and ``kafka.bootstrap.servers``) an export covers the whole topic:
the remote copies up to their stable end, then the broker from there up to its last stable offset
(ListOffsets with read_committed), read by a read_committed consumer, so aborted records and markers
are dropped by the broker's own rules. Partitions with no remote copy yet are read wholly from the
broker. Other ``kafka.*`` options go to the consumer, as with Spark's Kafka source.

This path makes one Python object per record (confluent-kafka's messages); it is meant for the tail
the sidecar has not uploaded yet, not for bulk reads.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, TopicPartition
from pyspark.sql.datasource import InputPartition

from reader.spark.columns import HEADER_TYPE, SCHEMA
from reader.spark.planning import PartitionRange
from tiering_core.errors import TieringError
from tiering_core.kafka_cluster import KafkaCluster

_STALL_SECONDS = 60.0


class BrokerTailError(TieringError):
    """Reading the local tail from the broker failed or stalled; nothing from this task was written."""


@dataclass(frozen=True)
class BrokerSlice(InputPartition):
    """One input partition: offsets ``[first, last]`` of a partition, read from the broker (read_committed)."""

    topic: str
    partition: int
    first: int
    last: int
    consumer_config: tuple[tuple[str, str], ...]


def with_local_tails(
    cluster: KafkaCluster, topics: list[str], ranges: list[PartitionRange], ending: dict[str, dict[int, int]]
) -> list[PartitionRange]:
    """Extend each range past the remote stable end up to the broker's last stable offset (or the
    requested end), and add the partitions that have no remote copy yet."""
    infos = cluster.topics(topics)
    known = {(r.topic, r.partition) for r in ranges}
    missing = [(t, p.partition) for t in topics for p in infos[t].partitions if (t, p.partition) not in known]
    offsets = cluster.local_offsets([*known, *missing])
    out = []
    for rng in ranges:
        local = offsets[(rng.topic, rng.partition)]
        tail_from = max(rng.first, rng.stable_end + 1)
        end = ending.get(rng.topic, {}).get(rng.partition)
        last = local.ly - 1 if end is None or end < 0 else min(local.ly, end) - 1
        if (rng.last >= rng.stable_end or rng.first > rng.stable_end) and last >= tail_from:
            if local.lx > tail_from:
                raise BrokerTailError(
                    f"{rng.topic}-{rng.partition}: offsets {tail_from}-{local.lx - 1} are neither remote nor on the "
                    "broker (Kafka's retention deleted them before their upload)"
                )
            out.append(replace(rng, last=max(rng.last, last)))
        else:  # the request ends inside the remote data
            out.append(rng)
    for topic, partition in missing:
        local = offsets[(topic, partition)]
        end = ending.get(topic, {}).get(partition)
        last = local.ly - 1 if end is None or end < 0 else min(local.ly, end) - 1
        out.append(PartitionRange(topic, infos[topic].topic_id, partition, local.lx, last, local.lx, local.lx - 1))
    return out


def tail_slices(ranges: list[PartitionRange], consumer_config: dict[str, str]) -> list[BrokerSlice]:
    config = tuple(sorted(consumer_config.items()))
    return [
        BrokerSlice(r.topic, r.partition, max(r.first, r.stable_end + 1), r.last, config)
        for r in ranges
        if r.last > r.stable_end and r.last >= r.first
    ]


def read_broker_slice(part: BrokerSlice, max_rows: int = 65536) -> Iterator[pa.RecordBatch]:
    """The slice's committed records as RecordBatches; BrokerTailError if the broker stops answering."""
    config = {
        **dict(part.consumer_config),
        "group.id": f"kafka-tiered-export-{uuid.uuid4().hex}",
        "enable.auto.commit": False,
        "isolation.level": "read_committed",
        "enable.partition.eof": True,
        "auto.offset.reset": "error",  # a start the broker no longer has fails; never skips silently
    }
    consumer = Consumer(config)
    try:
        consumer.assign([TopicPartition(part.topic, part.partition, part.first)])
        rows: list[tuple] = []
        progress = time.monotonic()
        position = part.first
        while position <= part.last:
            for msg in consumer.consume(1000, 1.0):
                if msg.error() is not None:
                    if msg.error().code() != KafkaError._PARTITION_EOF:
                        raise BrokerTailError(f"{part.topic}-{part.partition}: {msg.error().str()}")
                    continue
                if msg.offset() <= part.last:
                    rows.append(_row(msg))
            (tp,) = consumer.position([TopicPartition(part.topic, part.partition)])
            if tp.offset > position:
                position, progress = tp.offset, time.monotonic()
            elif time.monotonic() - progress > _STALL_SECONDS:
                raise BrokerTailError(
                    f"{part.topic}-{part.partition}: no progress at offset {position} for {_STALL_SECONDS:.0f} s "
                    f"(reading the local tail up to {part.last})"
                )
            if len(rows) >= max_rows:
                yield _batch(part, rows)
                rows = []
        if rows:
            yield _batch(part, rows)
    finally:
        consumer.close()


def _row(msg: object) -> tuple:
    kind, ts = msg.timestamp()  # type: ignore[attr-defined]
    given = msg.headers()  # type: ignore[attr-defined]
    headers = [{"key": k, "value": v} for k, v in given] if given else None  # null without headers, as Spark's
    return (msg.key(), msg.value(), msg.offset(), ts, 1 if kind == 2 else 0, headers)  # type: ignore[attr-defined]


def _batch(part: BrokerSlice, rows: list[tuple]) -> pa.RecordBatch:
    keys, values, offsets, stamps, kinds, headers = zip(*rows, strict=True)
    n = len(rows)
    columns = [
        pa.array(keys, pa.binary()),
        pa.array(values, pa.binary()),
        pa.array([part.topic] * n, pa.string()),
        pa.array([part.partition] * n, pa.int32()),
        pa.array(offsets, pa.int64()),
        pa.array(stamps, pa.int64()).cast(pa.timestamp("ms", tz="UTC")).cast(pa.timestamp("us", tz="UTC")),
        pa.array(kinds, pa.int32()),
        pa.array(headers, pa.list_(HEADER_TYPE)),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=SCHEMA)
