"""Messages as ``confluent_kafka.Message`` presents them, built straight by the record decoder.

confluent-kafka's own ``Message`` constructor is documented as meant for tests only, so the remote
part is delivered as ``TieredMessage``: the same methods (topic, partition, offset, key, value,
headers, timestamp, leader_epoch, error, latency, len). A message *is* the decoder's record tuple
(offset, timestamp, key, value, headers): what is the same for a whole batch (topic, partition,
timestamp type, leader epoch) lives on a small per-partition subclass (``message_class``), so a
record costs exactly one allocation and nothing is copied.
"""

from __future__ import annotations

from functools import lru_cache

from confluent_kafka import TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME, KafkaError

from tiering_core.formats import BatchHeader


class TieredMessage(tuple):
    """A record from remote storage: (offset, timestamp, key, value, headers) plus its class's batch fields."""

    __slots__ = ()
    _topic: str = ""
    _partition: int = -1
    _timestamp_type: int = TIMESTAMP_CREATE_TIME
    _leader_epoch: int | None = None

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self[0]

    def key(self) -> bytes | None:
        return self[2]

    def value(self) -> bytes | None:
        return self[3]

    def headers(self) -> list[tuple[str, bytes | None]] | None:
        headers = self[4]
        return list(headers) if headers else None

    def timestamp(self) -> tuple[int, int]:
        return self._timestamp_type, self[1]

    def leader_epoch(self) -> int | None:
        return self._leader_epoch

    def error(self) -> None:
        return None

    def latency(self) -> float | None:
        return None

    def __len__(self) -> int:
        value = self[3]
        return 0 if value is None else len(value)

    def __bool__(self) -> bool:
        return True

    def __repr__(self) -> str:
        return f"TieredMessage({self._topic}-{self._partition}@{self[0]})"


@lru_cache(maxsize=4096)
def _subclass(topic: str, partition: int, timestamp_type: int, leader_epoch: int | None) -> type[TieredMessage]:
    attrs = {"__slots__": (), "_topic": topic, "_partition": partition, "_timestamp_type": timestamp_type,
             "_leader_epoch": leader_epoch}  # fmt: skip
    return type("TieredMessage", (TieredMessage,), attrs)


def message_class(topic: str, partition: int, header: BatchHeader) -> type[TieredMessage]:
    """The message type of a batch's records (cached: one per partition, timestamp type and leader epoch)."""
    stamp = TIMESTAMP_LOG_APPEND_TIME if header.attributes & 0x08 else TIMESTAMP_CREATE_TIME
    epoch = header.partition_leader_epoch if header.partition_leader_epoch >= 0 else None
    return _subclass(topic, partition, stamp, epoch)


class TieredEvent:
    """An error event for a partition, as the consumer's ``poll`` returns them (``error()`` set)."""

    __slots__ = ("_error", "_offset", "_partition", "_topic")

    def __init__(self, topic: str, partition: int, offset: int, error: KafkaError) -> None:
        self._topic, self._partition, self._offset, self._error = topic, partition, offset, error

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def error(self) -> KafkaError:
        return self._error

    def key(self) -> None:
        return None

    def value(self) -> None:
        return None

    def headers(self) -> None:
        return None

    def timestamp(self) -> tuple[int, int]:
        return 0, 0

    def leader_epoch(self) -> None:
        return None

    def latency(self) -> None:
        return None

    def __len__(self) -> int:
        return 0

    def __repr__(self) -> str:
        return f"TieredEvent({self._topic}-{self._partition}@{self._offset}: {self._error})"
