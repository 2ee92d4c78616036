"""TieredConsumer and PartitionStream on the real stack: remote below the broker's log start, then the broker."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import closing
from typing import Any

import pytest
from click.testing import CliRunner
from confluent_kafka import Consumer, Message, TopicPartition

from deploy.stack import Endpoints
from reader import NotInRemote, PartitionStream, RemoteReader, TieredConsumer, TieredMessage
from tests.reader_harness import TieredTopic, expected, tiered_topic
from tests.sidecar_harness import produce_mixed, wait_for
from tiering.cli.main import main

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def tiered(stack: Endpoints, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TieredTopic]:
    with tiered_topic(stack, tmp_path_factory.mktemp("reader-consumer")) as t:
        yield t


def as_record(m: Any) -> tuple:
    return (m.key(), m.value(), list(m.headers() or []))


def drain(consumer: TieredConsumer, ends: dict[int, int], timeout: float = 120) -> dict[int, list[Any]]:
    """Consume until every partition's position reaches its end offset; messages by partition, in order."""
    got: dict[int, list[Any]] = {p: [] for p in ends}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for m in consumer.consume(500, 1.0):
            assert m.error() is None, m.error()
            got[m.partition()].append(m)
        positions = consumer.position([TopicPartition(m_topic(consumer), p) for p in ends])
        if all(tp.offset >= ends[tp.partition] for tp in positions):
            return got
    raise AssertionError(f"not at the end after {timeout}s; the consumer: {consumer.describe()}")


def m_topic(consumer: TieredConsumer) -> str:
    return next(iter(consumer._parts))[0]


def check(messages: list[Any], produced: dict[int, tuple], read_committed: bool) -> None:
    offsets = [m.offset() for m in messages]
    assert offsets == sorted(set(offsets)), "duplicates or out of order"
    want = expected(produced, read_committed)
    assert offsets == sorted(want), (
        f"missing {sorted(set(want) - set(offsets))[:5]} extra {sorted(set(offsets) - set(want))[:5]}"
    )
    for m in messages:
        assert as_record(m) == want[m.offset()], f"offset {m.offset()} differs"


def test_stream_reads_every_remote_record_across_windows_and_copies(tiered: TieredTopic) -> None:
    settings = tiered.reader_settings(fetch_window_bytes=64 * 1024, prefetch_windows=3, prefetch_pool_bytes=4 << 20)
    with RemoteReader.open(settings, [tiered.topic]) as reader:
        stream = PartitionStream(reader, tiered.topic, 0, 0)
        records = []
        while True:
            try:
                for batch in stream.read(5.0):
                    records.extend(batch.records)
            except NotInRemote:
                break
        _, ry = reader.catalog.remote_offsets(tiered.topic, 0)
        assert reader.pool.peak <= 4 << 20
        stream.close()
        assert reader.pool.used == 0
    assert stream.position == ry + 1
    offsets = [r.offset for r in records]
    assert offsets == sorted(set(offsets))
    for r in records:
        assert (r.key, r.value, list(r.headers)) == tiered.produced[r.offset]
    markers = set(range(ry + 1)) - set(offsets)
    assert all(o not in tiered.produced for o in markers), "a produced record was not delivered"


@pytest.mark.parametrize("isolation", ["read_uncommitted", "read_committed"])
def test_assigned_from_zero_remote_then_broker_without_gap_or_duplicate(tiered: TieredTopic, isolation: str) -> None:
    lx = tiered.log_start()
    end = tiered.end_offset()
    stats: list[str] = []
    config = {"bootstrap.servers": tiered.ctx.settings.bootstrap_servers, "group.id": f"g-{uuid.uuid4().hex[:6]}",
              "isolation.level": isolation, "enable.auto.commit": False, "statistics.interval.ms": 200,
              "stats_cb": stats.append}  # fmt: skip
    with TieredConsumer(config, tiered.reader_settings()) as consumer:
        consumer.assign([TopicPartition(tiered.topic, 0, 0)])
        messages = drain(consumer, {0: end})[0]
        wait_for(lambda: bool(stats), 10, "librdkafka's statistics", step=lambda: consumer.poll(0.1))
        state = consumer.describe()
    check(messages, tiered.produced, isolation == "read_committed")
    part = state["partitions"][f"{tiered.topic}-0"]
    assert state["assignment"] == [f"{tiered.topic}-0"] and state["stats_age_s"] is not None, state
    assert part["reading"] == "broker" and part["stream"] is None and not part["inner_paused"], part
    assert part["position"] >= end and part["problem"] is None and part["librdkafka"]["leader"] == 1, part
    remote = [m for m in messages if isinstance(m, TieredMessage)]
    broker = [m for m in messages if isinstance(m, Message)]
    assert remote and broker and len(remote) + len(broker) == len(messages)
    # the sidecar keeps tiering meanwhile, so the boundary is wherever the broker's log start was then
    assert remote[0].offset() == 0 and lx <= broker[0].offset()
    assert max(m.offset() for m in remote) < min(m.offset() for m in broker)
    first = remote[0]
    assert first.timestamp()[0] in (1, 2) and first.leader_epoch() is not None


def test_subscribe_earliest_starts_at_the_remote_start_and_commits(tiered: TieredTopic) -> None:
    group = f"g-{uuid.uuid4().hex[:6]}"
    config = {"bootstrap.servers": tiered.ctx.settings.bootstrap_servers, "group.id": group,
              "auto.offset.reset": "earliest", "enable.auto.commit": False}  # fmt: skip
    with TieredConsumer(config, tiered.reader_settings()) as consumer:
        consumer.subscribe([tiered.topic])
        first = None
        while first is None:
            first = consumer.poll(1.0)
        assert first.error() is None and first.offset() == 0
        got = [first, *consumer.consume(99, 10)]
        consumer.commit(asynchronous=False)
        committed = consumer.committed([TopicPartition(tiered.topic, 0)])[0].offset
        assert committed == got[-1].offset() + 1 and committed < tiered.log_start()
    with TieredConsumer(config, tiered.reader_settings()) as again:
        again.subscribe([tiered.topic])
        nxt = None
        while nxt is None:
            nxt = again.poll(1.0)
        assert nxt.offset() == committed, "a new member continues at the committed remote offset"


def test_offset_below_remote_start_is_out_of_range(tiered: TieredTopic) -> None:
    config = {"bootstrap.servers": tiered.ctx.settings.bootstrap_servers, "group.id": f"g-{uuid.uuid4().hex[:6]}",
              "auto.offset.reset": "error", "enable.auto.commit": False}  # fmt: skip
    with TieredConsumer(config, tiered.reader_settings()) as consumer:
        consumer.assign([TopicPartition(tiered.topic, 0, -5)])
        # -5 is no offset at all; an offset below Rx comes from retention (test_reader_faults)
        assert consumer.position([TopicPartition(tiered.topic, 0)])[0].offset == -1001


def test_seek_moves_between_remote_and_broker_and_watermarks_start_at_the_remote_start(tiered: TieredTopic) -> None:
    lx = tiered.log_start()
    config = {"bootstrap.servers": tiered.ctx.settings.bootstrap_servers, "group.id": f"g-{uuid.uuid4().hex[:6]}",
              "isolation.level": "read_uncommitted", "enable.auto.commit": False}  # fmt: skip
    tp = TopicPartition(tiered.topic, 0)
    with TieredConsumer(config, tiered.reader_settings()) as consumer:
        consumer.assign([TopicPartition(tiered.topic, 0, lx)])
        low, high = consumer.get_watermark_offsets(tp)
        assert low == 0 and high == tiered.end_offset()

        def next_message() -> Any:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                got = [m for m in consumer.consume(1, 1.0) if m.error() is None]
                if got:
                    return got[0]
            raise AssertionError("no message")

        first = next_message()
        assert isinstance(first, Message) and first.offset() >= lx
        for offset in (5, lx + 3, 117):  # broker -> remote, remote -> broker, broker -> remote
            want = min(o for o in tiered.produced if o >= offset)
            consumer.seek(TopicPartition(tiered.topic, 0, offset))
            m = next_message()
            assert m.offset() == want and as_record(m) == tiered.produced[want]
            assert isinstance(m, TieredMessage) == (offset < lx)
            assert consumer.position([tp])[0].offset == want + 1
        consumer.pause([tp])
        assert consumer.consume(10, 1.0) == []
        consumer.resume([tp])
        assert next_message().offset() == 118


def test_consume_command_prints_remote_then_broker_records(tiered: TieredTopic) -> None:
    total = len(tiered.produced)
    result = CliRunner().invoke(
        main,
        ["consume", tiered.topic, "--from-beginning", "--partition", "0", "--max-messages", str(total),
         "--print-offset", "--config", str(tiered.config)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stdout.splitlines() if line]
    assert len(lines) == total
    for line, offset in zip(lines, sorted(tiered.produced), strict=True):
        where, value = line.split("\t", 1)
        assert where.split()[0] == f"0:{offset}"
        produced = tiered.produced[offset][1]
        assert value == ("null" if produced is None else produced.decode())
    sources = [line.split("\t")[0].split()[1] for line in lines]
    assert sources[0] == "remote" and sources[-1] == "broker"
    assert sources == sorted(sources, key=lambda s: s == "broker"), "remote records after broker ones"
    assert f"Processed a total of {total} messages" in result.stderr


def test_consume_command_with_a_group_commits_and_the_next_run_continues(tiered: TieredTopic) -> None:
    """With --group the command joins the group and commits what it printed: a second run of the same group
    prints the rest, each record once over the two runs (without --group nothing joins or commits)."""
    group = f"console-{uuid.uuid4().hex[:6]}"
    total = sum(len(records) for records in tiered.by_partition.values())
    half = total // 2

    def run(*args: str) -> list[tuple[str, str]]:
        result = CliRunner().invoke(main, ["consume", tiered.topic, "--group", group, "--print-offset",
                                           "--timeout-ms", "20000", "--config", str(tiered.config), *args])  # fmt: skip
        assert result.exit_code == 0, result.output
        return [tuple(line.split("\t", 1)[0].split()[0].split(":")) for line in result.stdout.splitlines() if line]

    first = run("--from-beginning", "--max-messages", str(half))
    second = run("--max-messages", str(total - half))
    read = sorted((int(p), int(o)) for p, o in first + second)
    assert read == sorted((p, o) for p, records in tiered.by_partition.items() for o in records)


def test_without_any_sidecar_it_is_a_plain_consumer(tiered: TieredTopic, stack: Endpoints) -> None:
    from tests.conftest import create_topic

    topic = create_topic(stack.bootstrap)
    produced = produce_mixed(stack.bootstrap, topic, 500)
    settings = tiered.reader_settings(metadata_topic=f"__tiering_metadata_none_{uuid.uuid4().hex[:6]}")
    config = {"bootstrap.servers": stack.bootstrap, "group.id": f"g-{uuid.uuid4().hex[:6]}",
              "auto.offset.reset": "earliest", "isolation.level": "read_committed"}  # fmt: skip
    with TieredConsumer(config, settings) as consumer:
        consumer.subscribe([topic])
        messages = drain(consumer, {0: max(produced) + 2}, timeout=60)[0]
    check(messages, produced, True)
    assert not any(isinstance(m, TieredMessage) for m in messages)


@pytest.mark.parametrize("membership", ["assign", "range", "cooperative-sticky"])
def test_back_to_remote_when_local_retention_passes_a_broker_reader(tiered: TieredTopic, membership: str) -> None:
    """A slow reader of the broker's data: local retention deletes past its position; it continues from
    remote at exactly that position (no skip to the new log start, as a plain consumer would). librdkafka
    stops the partition's fetcher at the broker's OffsetOutOfRange and refuses the seek of the hand-over
    back to the broker: the partition is assigned again, which a group member with an eager strategy can
    do only for its whole assignment."""
    start = tiered.log_start()
    group = f"g-{uuid.uuid4().hex[:6]}"
    config = {"bootstrap.servers": tiered.ctx.settings.bootstrap_servers, "group.id": group,
              "isolation.level": "read_uncommitted", "enable.auto.commit": False,
              # small fetches, so the broker consumer has not buffered what retention deletes
              "queued.max.messages.kbytes": 16, "max.partition.fetch.bytes": 1024, "fetch.max.bytes": 1024,
              "message.max.bytes": 1000, "receive.message.max.bytes": 4 << 20}  # fmt: skip
    if membership != "assign":  # a group member, assigned the partition at the committed start
        with closing(Consumer({"bootstrap.servers": config["bootstrap.servers"], "group.id": group})) as plain:
            plain.commit(offsets=[TopicPartition(tiered.topic, 0, start)], asynchronous=False)
        config["partition.assignment.strategy"] = membership
    with TieredConsumer(config, tiered.reader_settings()) as consumer:
        if membership == "assign":
            consumer.assign([TopicPartition(tiered.topic, 0, start)])
        else:
            consumer.subscribe([tiered.topic])
        first: list[Any] = []
        deadline = time.monotonic() + 60
        while len(first) < 10 and time.monotonic() < deadline:
            first += [m for m in consumer.consume(10 - len(first), 1.0) if m.error() is None]
        assert all(isinstance(m, Message) for m in first), "the start was served by the broker"
        position = consumer.position([TopicPartition(tiered.topic, 0)])[0].offset
        tiered.produced.update(produce_mixed(tiered.ctx.settings.bootstrap_servers, tiered.topic, 20_000, seed=777))
        wait_for(lambda: tiered.log_start() > position + 1000, 240, "local retention to pass the reader's position")
        end = tiered.end_offset()
        rest = drain(consumer, {0: end}, timeout=240)[0]
    messages = first + rest
    produced = tiered.produced
    offsets = [m.offset() for m in messages]
    assert offsets == sorted(set(offsets)) and offsets[0] == start
    want = [o for o in sorted(produced) if o >= start]
    assert offsets == want, "a gap or a duplicate across the moving boundary"
    for m in messages:
        assert as_record(m) == produced[m.offset()]
    # what the broker consumer had buffered comes first; then the rest of the deleted range from remote
    assert any(isinstance(m, TieredMessage) for m in rest), "the reader did not go back to remote"
