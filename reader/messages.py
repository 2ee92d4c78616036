"""Messages as ``confluent_kafka.Message`` presents them, built from decoded remote batches.

confluent-kafka's own ``Message`` constructor is documented as meant for tests only, so the remote
part is delivered as ``TieredMessage``: the same methods (topic, partition, offset, key, value,
headers, timestamp, leader_epoch, error, latency, len) on a tuple, which is the cheapest object
Python builds (one allocation per record; the decoder's fields are reused, not copied).
"""

from __future__ import annotations

from confluent_kafka import TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME, KafkaError

from tiering_core.formats import RecordBatch

_new = tuple.__new__


class TieredMessage(tuple):
    """(topic, partition, offset, key, value, headers, (timestamp type, timestamp), leader epoch, error)."""

    __slots__ = ()

    def topic(self) -> str:
        return self[0]

    def partition(self) -> int:
        return self[1]

    def offset(self) -> int:
        return self[2]

    def key(self) -> bytes | None:
        return self[3]

    def value(self) -> bytes | None:
        return self[4]

    def headers(self) -> list[tuple[str, bytes | None]] | None:
        return self[5]

    def timestamp(self) -> tuple[int, int]:
        return self[6]

    def leader_epoch(self) -> int | None:
        return self[7]

    def error(self) -> KafkaError | None:
        return self[8]

    def latency(self) -> float | None:
        return None

    def __len__(self) -> int:
        value = self[4]
        return 0 if value is None else len(value)

    def __repr__(self) -> str:
        return f"TieredMessage({self[0]}-{self[1]}@{self[2]}{', error=' + str(self[8]) if self[8] else ''})"

    def __bool__(self) -> bool:
        return True


def error_message(topic: str, partition: int, offset: int, error: KafkaError) -> TieredMessage:
    """An error event for a partition, as the consumer's ``poll`` returns them (``error()`` set)."""
    return _new(TieredMessage, (topic, partition, offset, None, None, None, (0, 0), None, error))


def batch_messages(topic: str, partition: int, batch: RecordBatch, out: list) -> None:
    """Append the batch's records to ``out`` as TieredMessage (the hot path: one tuple per record)."""
    h = batch.header
    stamp = TIMESTAMP_LOG_APPEND_TIME if h.attributes & 0x08 else TIMESTAMP_CREATE_TIME
    epoch = h.partition_leader_epoch if h.partition_leader_epoch >= 0 else None
    append = out.append
    for offset, ts, key, value, headers in batch.records:
        append(_new(TieredMessage, (topic, partition, offset, key, value, list(headers) if headers else None,
                                    (stamp, ts), epoch, None)))  # fmt: skip
