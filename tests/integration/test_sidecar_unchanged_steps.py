"""A partition whose inputs did not change is not stepped again, and is stepped as soon as one does or a
time-based rule can fire (issue 18.2: thousands of idle partitions must cost next to nothing per tick)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from confluent_kafka import Producer

from deploy.stack import Endpoints
from tests.conftest import create_topic, set_topic_config
from tests.sidecar_harness import settings, wait_for, write_config
from tiering.cli.main import main
from tiering.sidecar.context import SidecarContext
from tiering.sidecar.facts import local_segments
from tiering.sidecar.runner import Sidecar

pytestmark = pytest.mark.integration
SEGMENT = 64 * 1024
PARTITIONS = 4
RACY_S = 2.2  # a directory changed less than 2 s ago proves nothing (tiering.sidecar.facts._RACY_NS)


def produce(bootstrap: str, topic: str, partition: int, count: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.size": 16384})
    errors: list[object] = []
    for i in range(count):
        producer.produce(topic, value=f"p{partition}-{i}-".encode() * 10, partition=partition,
                         on_delivery=lambda err, _m: errors.append(err) if err else None)  # fmt: skip
        if i % 1000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0 and not errors, errors[:3]


def steps(ctx: SidecarContext) -> tuple[float, float]:
    """(steps run, steps skipped as unchanged) so far."""
    counter = ctx.metrics.partition_steps
    return counter.labels(outcome="run")._value.get(), counter.labels(outcome="unchanged")._value.get()


def tick_counting(ctx: SidecarContext, sidecar: Sidecar) -> tuple[int, int]:
    """One full tick; the steps it ran and skipped."""
    run, skipped = steps(ctx)
    sidecar.tick()
    after = steps(ctx)
    return int(after[0] - run), int(after[1] - skipped)


def copied_everything(ctx: SidecarContext, topic: str, topic_id: str, log_dir: Path) -> bool:
    """Every partition's rolled segments are remote: its remote end is the last rolled segment's last offset."""
    for p in range(PARTITIONS):
        local = local_segments(log_dir / f"{topic}-{p}")
        state = ctx.manager.partition_state(topic_id, p)
        if state is None or state.remote_end_offset != local[-1][0].base_offset - 1:
            return False
    return True


def test_unchanged_partitions_are_skipped_until_an_input_or_a_time_rule_changes(
    stack: Endpoints, tmp_path: Path
) -> None:
    topic = create_topic(stack.bootstrap, partitions=PARTITIONS, internal_segment_bytes=SEGMENT)
    for p in range(PARTITIONS):
        produce(stack.bootstrap, topic, p, 3000)
    produced_ms = int(time.time() * 1000)
    log_dir = Path(stack.broker(1).log_dir)
    config = write_config(stack, tmp_path)
    CliRunner().invoke(main, ["topic", "enable", topic, "--config", str(config)], catch_exceptions=False)
    ctx = SidecarContext.build(settings(config))
    sidecar = Sidecar(ctx)
    sidecar.start()
    try:
        topic_id = ctx.cluster.topics([topic])[topic].topic_id
        wait_for(lambda: copied_everything(ctx, topic, topic_id, log_dir), 120, "every rolled segment copied",
                 step=sidecar.tick)  # fmt: skip
        time.sleep(RACY_S)
        sidecar.tick()  # settles every partition: nothing left to do
        store_before = sum(c._value.get() for c in ctx.metrics.store_requests._metrics.values())
        assert tick_counting(ctx, sidecar) == (0, PARTITIONS), "an idle partition was stepped again"
        store_after = sum(c._value.get() for c in ctx.metrics.store_requests._metrics.values())
        # at most the janitor's one listing of incomplete uploads for the whole cluster, never one per partition
        assert store_after - store_before <= 1, "an idle tick asked the store about its partitions"

        # new data in one partition: only that one is stepped, and its new rolled segments are copied
        produce(stack.bootstrap, topic, 2, 3000)
        assert tick_counting(ctx, sidecar) == (1, PARTITIONS - 1)
        wait_for(lambda: copied_everything(ctx, topic, topic_id, log_dir), 60, "partition 2's new segments copied",
                 step=sidecar.tick)  # fmt: skip

        # a topic config every step reads (retention.ms): every partition is stepped
        time.sleep(RACY_S)
        sidecar.tick()
        set_topic_config(stack.bootstrap, topic, retention_ms=7 * 24 * 3600 * 1000 + 1)
        assert tick_counting(ctx, sidecar) == (PARTITIONS, 0)
        assert tick_counting(ctx, sidecar) == (0, PARTITIONS)

        # a time rule with nothing else changing: local.retention.ms a few seconds past the data's age
        age_ms = int(time.time() * 1000) - produced_ms
        result = CliRunner().invoke(main, ["topic", "alter", topic, "--local-retention-ms", str(age_ms + 6000),
                                           "--config", str(config)])  # fmt: skip
        assert result.exit_code == 0, result.output
        wait_for(lambda: ctx.manager.topic_state(topic)[1].local_retention_ms == age_ms + 6000, 30, "the alter")
        assert tick_counting(ctx, sidecar) == (PARTITIONS, 0), "a tiering state change did not step every partition"
        starts = ctx.cluster.local_offsets([(topic, p) for p in range(PARTITIONS)])
        assert all(o.lx == 0 for o in starts.values()), "local retention applied before its time"
        assert tick_counting(ctx, sidecar) == (0, PARTITIONS)
        time.sleep(max(0.0, (produced_ms + age_ms + 6000 - time.time() * 1000) / 1000) + 1)
        wait_for(
            lambda: all(o.lx > 0 for o in ctx.cluster.local_offsets([(topic, p) for p in range(PARTITIONS)]).values()),
            60, "local.retention.ms to release local data once its time came", step=sidecar.tick,
        )  # fmt: skip
        for p, offsets in ctx.cluster.local_offsets([(topic, p) for p in range(PARTITIONS)]).items():
            ry = ctx.manager.partition_state(topic_id, p[1]).remote_end_offset
            assert ry is not None and offsets.lx <= ry + 1, f"partition {p}: local data released beyond the remote end"
    finally:
        sidecar.stop()
        sidecar.close()


def list_offsets_sent(ctx: SidecarContext) -> float:
    return ctx.metrics.kafka_requests.labels(api="ListOffsets")._value.get()


def test_the_stable_offset_is_asked_again_once_a_transaction_opens(stack: Endpoints, tmp_path: Path) -> None:
    """Idle ticks do not ask for Ly (read_committed ListOffsets) of settled partitions; a transaction left open
    moves Lz, so Ly is asked again and holds every segment from the transaction's first record back."""
    topic = create_topic(stack.bootstrap, partitions=PARTITIONS, internal_segment_bytes=SEGMENT)
    for p in range(PARTITIONS):
        produce(stack.bootstrap, topic, p, 2000)
    config = write_config(stack, tmp_path)
    CliRunner().invoke(main, ["topic", "enable", topic, "--config", str(config)], catch_exceptions=False)
    ctx = SidecarContext.build(settings(config))
    sidecar = Sidecar(ctx)
    sidecar.start()
    txn = Producer({"bootstrap.servers": stack.bootstrap, "transactional.id": f"{topic}-open", "linger.ms": 5,
                    "batch.size": 16384})  # fmt: skip
    try:
        topic_id = ctx.cluster.topics([topic])[topic].topic_id
        log_dir = Path(stack.broker(1).log_dir)
        wait_for(lambda: copied_everything(ctx, topic, topic_id, log_dir), 120, "every rolled segment copied",
                 step=sidecar.tick)  # fmt: skip
        time.sleep(RACY_S)
        sidecar.tick()
        before = list_offsets_sent(ctx)
        sidecar.tick()
        settled_asks = list_offsets_sent(ctx) - before

        first = ctx.cluster.local_offsets([(topic, 0)])[(topic, 0)].lz
        txn.init_transactions(30)
        txn.begin_transaction()
        for i in range(3000):
            txn.produce(topic, value=f"open-{i}-".encode() * 10, partition=0)
        assert txn.flush(60) == 0
        before = list_offsets_sent(ctx)
        assert tick_counting(ctx, sidecar)[0] == 1, "the partition with new records was not stepped"
        assert list_offsets_sent(ctx) - before == settled_asks + 1, "Ly of the moved partition was not asked"
        for _ in range(3):
            sidecar.tick()
        offsets = ctx.cluster.local_offsets([(topic, 0)])[(topic, 0)]
        assert offsets.ly == first < offsets.lz, offsets
        assert len(local_segments(log_dir / f"{topic}-0")) > 3, "the open transaction rolled no segment"
        ry = ctx.manager.partition_state(topic_id, 0).remote_end_offset
        assert ry is not None and ry < first, f"copied up to {ry}, past the open transaction's start {first}"

        txn.commit_transaction(30)
        wait_for(lambda: copied_everything(ctx, topic, topic_id, log_dir), 120, "the committed segments copied",
                 step=sidecar.tick)  # fmt: skip
    finally:
        sidecar.stop()
        sidecar.close()
