"""Producing without dropping records when librdkafka's local queue is full."""

from __future__ import annotations

from typing import Any

from confluent_kafka import Producer


def produce_waiting(producer: Producer, topic: str, **message: Any) -> None:
    """``producer.produce``, but when the local queue is full, serve delivery reports and retry.

    confluent-kafka raises BufferError instead of blocking; bulk producers (benchmarks, the demo)
    must wait for room rather than lose the record.
    """
    while True:
        try:
            producer.produce(topic, **message)
            return
        except BufferError:
            producer.poll(0.05)
