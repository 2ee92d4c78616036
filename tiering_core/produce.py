"""Producing without dropping records when librdkafka's local queue is full, and without waiting forever."""

from __future__ import annotations

import time
from typing import Any

from confluent_kafka import Producer

from tiering_core.backoff import Backoff
from tiering_core.errors import TieringError

_WAITS = Backoff(0.01, 1.0)  # poll() returns as soon as a delivery report frees room: the cap only bounds idling


class ProduceTimeout(TieringError):
    """librdkafka's local queue stayed full until the deadline: the cluster is unreachable or takes the
    writes slower than they come. This record was not queued; earlier ones may still be delivered (or
    fail in their delivery reports). Check the cluster, then produce again."""


def produce_waiting(producer: Producer, topic: str, *, timeout: float = 60.0, **message: Any) -> None:
    """``producer.produce``, but when the local queue is full, serve delivery reports and retry, with a
    growing wait, until ``timeout`` seconds have passed; then raise ProduceTimeout.

    confluent-kafka raises BufferError instead of blocking; bulk producers (benchmarks, the demo, the
    WAL's bulk path) must wait for room rather than lose the record, but not forever.
    """
    deadline = time.monotonic() + timeout
    waits = 0
    while True:
        try:
            producer.produce(topic, **message)
            return
        except BufferError:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ProduceTimeout(
                    f"producing to {topic}: librdkafka's local queue stayed full for {timeout:g} s "
                    f"({len(producer)} messages waiting for delivery); is the Kafka cluster reachable?"
                ) from None
            waits += 1
            producer.poll(min(remaining, _WAITS.delay(waits)))
