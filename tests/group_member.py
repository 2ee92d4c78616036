"""One TieredConsumer group member in its own process, for the group life-cycle tests.

``python -m tests.group_member SPEC`` (SPEC: JSON with ``config``, the librdkafka properties; ``settings``,
the reader's configuration file; ``topic``; ``holds``, a JSON file of ``{partition: offset}``; ``batch``,
records per ``consume``). The member consumes until SIGTERM, then closes (commits, leaves the group).
A process, so that a test can freeze it (SIGSTOP) until its group session times out.

Holds make the group's positions deterministic: a partition is paused when what the member delivered
takes it to its hold, and resumed when the test moves the hold further. Only deliveries pause: a
partition assigned at or past its hold is left as the consumer set it up, so one that never delivers
shows as silent once the hold moves on. Everything the member sees goes to stdout, one JSON
object per line: ``records`` (partition, offset, key, value, headers, remote?), ``positions`` of the
assigned partitions, ``revoked``/``lost`` partitions, ``error`` events, and ``closed`` at the end.
"""

from __future__ import annotations

import base64
import faulthandler
import json
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from confluent_kafka import TopicPartition

from reader import TieredConsumer, TieredMessage, load_reader_settings


def emit(**event: Any) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


def unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


def as_record(m: Any) -> list:
    headers = [[k, b64(v)] for k, v in m.headers() or []]
    return [m.partition(), m.offset(), b64(m.key()), b64(m.value()), headers, isinstance(m, TieredMessage)]


class Holds:
    """The test's holds file, read again whenever it changed."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.stamp = 0
        self.offsets: dict[int, int] = {}

    def current(self) -> dict[int, int]:
        stamp = self.path.stat().st_mtime_ns
        if stamp != self.stamp:
            self.stamp = stamp
            self.offsets = {int(p): o for p, o in json.loads(self.path.read_text()).items()}
        return self.offsets


def run(spec: dict[str, Any]) -> None:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # a member that does not end: its stacks in its log
    topic = spec["topic"]
    consumer = TieredConsumer(spec["config"], load_reader_settings(Path(spec["settings"])))
    held: set[int] = set()  # partitions this member paused at their hold (in this assignment)

    def revoked(_consumer: Any, partitions: list[TopicPartition]) -> None:
        held.difference_update(tp.partition for tp in partitions)
        emit(revoked=[tp.partition for tp in partitions])

    def lost(_consumer: Any, partitions: list[TopicPartition]) -> None:
        held.difference_update(tp.partition for tp in partitions)
        emit(lost=[tp.partition for tp in partitions])

    consumer.subscribe([topic], on_revoke=revoked, on_lost=lost)
    holds = Holds(Path(spec["holds"]))
    published: dict[int, int] | None = None
    try:
        while not stop.is_set():
            records = []
            for m in consumer.consume(spec["batch"], 0.2):
                if m.error() is not None:
                    emit(error=str(m.error()), code=m.error().code(), partition=m.partition())
                    continue
                records.append(as_record(m))
            if records:
                emit(records=records)
            limits = holds.current()
            positions = {tp.partition: max(tp.offset, 0) for tp in consumer.position(consumer.assignment())}
            delivered = {r[0] for r in records}
            reached = [p for p in delivered if p in positions and positions[p] >= limits[p] and p not in held]
            below = [p for p, o in positions.items() if o < limits[p] and p in held]
            if reached:
                consumer.pause([TopicPartition(topic, p) for p in reached])
                held.update(reached)
            if below:
                consumer.resume([TopicPartition(topic, p) for p in below])
                held.difference_update(below)
            if positions != published:
                emit(positions=positions)
                published = positions
    finally:
        consumer.close()
        emit(closed=True)


if __name__ == "__main__":
    run(json.loads(sys.argv[1]))
