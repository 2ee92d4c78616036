"""A TieredConsumer reading the remote part of a partition on three brokers while the leader's broker and sidecar
stop (a controlled shutdown) and a producer goes on writing to the new leader: it reads on through the new
leader's copies and hands over to the new leader's broker, every offset once, byte for byte (issue 29).

Before the fix the hand-over waited forever: it asked the broker's log start through an admin client whose
cached leader was the stopped broker, and librdkafka's admin client refreshes no cached leader when a broker
goes down; the request timed out, was asked again after a second, and timed out again, with no error event.
The reader is driven from the test's thread (no timing involved): the stop happens while it is in the remote
part, the hand-over after the new leader's copies exist.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition

from deploy import stack as stack_mod
from deploy.stack import Endpoints
from reader.config import load_reader_settings
from reader.consumer import TieredConsumer
from tests.integration.test_sidecar_failover import partition_leader, produce, tiered_on_three_brokers
from tests.sidecar_harness import settings, sidecars_running, wait_for
from tiering.sidecar.context import SidecarContext

pytestmark = [pytest.mark.integration, pytest.mark.slow]
STALLED = 60  # seconds without a record: the reader stopped


def read_until(consumer: TieredConsumer, got: dict[int, bytes | None], end: int, twice: list[int]) -> str | None:
    """Poll ``consumer`` until it delivered offsets ``[0, end)``; None then, or, when no record came for
    ``STALLED`` seconds, what the consumer was doing (its ``describe()``) and the error events it gave."""
    errors: list[str] = []
    moved = time.monotonic()
    while len(got) < end:
        message = consumer.poll(0.5)
        if message is not None and message.error() is not None:
            errors.append(str(message.error()))
        elif message is not None:
            if message.offset() in got:
                twice.append(message.offset())
            got[message.offset()] = message.value()
            moved = time.monotonic()
        if time.monotonic() - moved > STALLED:
            state = json.dumps(consumer.describe(), indent=1, default=str)
            return f"no record for {STALLED}s; error events {errors[:3]} (of {len(errors)}); the consumer: {state}"
    return None


def test_reader_hands_over_to_the_new_leader_after_the_leader_stops(stack3: Endpoints, tmp_path: Path) -> None:
    produced: dict[int, bytes] = {}
    topic, configs = tiered_on_three_brokers(stack3, tmp_path, produced)
    got: dict[int, bytes | None] = {}
    twice: list[int] = []
    old_leader: int | None = None
    with sidecars_running(configs) as sidecars:
        observer = SidecarContext.build(settings(configs[1]), writes_snapshots=False)  # outlives any one sidecar
        observer.manager.start()
        try:
            topic_id, old_leader = partition_leader(observer, topic)
            wait_for(lambda: observer.cluster.log_start_offsets([(topic, 0)])[(topic, 0)] > 5_000, 240,
                     "local deletion above offset 5,000")  # fmt: skip
            consumer_config = {"bootstrap.servers": stack3.bootstrap, "group.id": f"g-{uuid.uuid4().hex[:6]}",
                               "enable.auto.commit": False}  # fmt: skip
            with TieredConsumer(consumer_config, load_reader_settings(configs[1])) as consumer:
                consumer.assign([TopicPartition(topic, 0, 0)])
                stalled = read_until(consumer, got, 500, twice)
                assert stalled is None, stalled
                state = consumer.describe()["partitions"][f"{topic}-0"]
                assert state["reading"] == "remote", f"not in the remote part at the fault: {state}"

                stack_mod.kill_broker(stack3, old_leader, hard=False)
                sidecars[old_leader].stop()
                ry_at_fault = observer.manager.partition_state(topic_id, 0).remote_end_offset
                produce(stack3.bootstrap, topic, 20_000, 10_000, produced)
                wait_for(
                    lambda: observer.manager.partition_state(topic_id, 0).remote_end_offset > ry_at_fault + 5_000,
                    240, "the new leader's sidecar to continue the uploads",
                )  # fmt: skip
                stalled = read_until(consumer, got, 30_000, twice)
        finally:
            observer.close()
            if old_leader is not None:
                stack_mod.restart_broker(stack3, old_leader)

    missing = sorted(set(range(30_000)) - set(got))
    assert not missing, f"missed {len(missing)} offsets, the first {missing[:5]}: {stalled}"
    assert not twice, f"offsets delivered twice: {twice[:10]}"
    assert set(produced) == set(range(30_000)), "the producer's acknowledged offsets are not 0..29,999"
    differ = [o for o in range(30_000) if got[o] != produced[o]]
    assert not differ, f"records differ from those produced at {differ[:5]}"
