"""A consumer group of TieredConsumers while new data arrives, the sidecar keeps tiering (the broker's log
start moves) and members join and leave: every record once, in order per partition, identical."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Producer

from deploy.stack import Endpoints
from reader import TieredConsumer, TieredMessage
from tests.reader_harness import TieredTopic, expected, tiered_topic

pytestmark = pytest.mark.integration
PARTITIONS = 3


@pytest.fixture(scope="module")
def tiered(stack: Endpoints, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TieredTopic]:
    with tiered_topic(stack, tmp_path_factory.mktemp("reader-group"), records=10_000, partitions=PARTITIONS,
                      local_retention=64 * 1024) as t:  # fmt: skip
        yield t


class Member(threading.Thread):
    """One group member consuming in its own thread until told to stop."""

    def __init__(self, config: dict[str, Any], tiered: TieredTopic, got: dict[int, list], lock: threading.Lock) -> None:
        super().__init__(daemon=True)
        self.consumer = TieredConsumer(config, tiered.reader_settings())
        self.consumer.subscribe([tiered.topic])
        self.got, self.lock = got, lock
        self.stop = threading.Event()
        self.errors: list[Any] = []

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                for m in self.consumer.consume(200, 0.5):
                    if m.error() is not None:
                        self.errors.append(m.error())
                        continue
                    with self.lock:
                        self.got[m.partition()].append((m.offset(), m.key(), m.value(), list(m.headers() or []),
                                                        isinstance(m, TieredMessage)))  # fmt: skip
        finally:
            self.consumer.close()


def produce_more(bootstrap: str, topic: str, stop: threading.Event, produced: dict[int, dict[int, tuple]]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "compression.type": "zstd"})

    def report(err: Any, msg: Any) -> None:
        assert err is None, err
        produced[msg.partition()][msg.offset()] = (msg.key(), msg.value(), [])

    i = 0
    while not stop.is_set():
        for p in range(PARTITIONS):
            key = f"more-{i}".encode()
            producer.produce(topic, key=key, value=b"v" * (i % 200), partition=p, on_delivery=report)
        i += 1
        if i % 100 == 0:
            producer.poll(0)
            time.sleep(0.05)
    assert producer.flush(60) == 0


def test_group_members_share_partitions_across_rebalances_while_the_boundary_moves(tiered: TieredTopic) -> None:
    group = f"g-{uuid.uuid4().hex[:6]}"
    config = {"bootstrap.servers": tiered.ctx.settings.bootstrap_servers, "group.id": group,
              "auto.offset.reset": "earliest", "isolation.level": "read_committed",
              "session.timeout.ms": 10000, "auto.commit.interval.ms": 1000}  # fmt: skip
    produced = {p: dict(tiered.by_partition[p]) for p in range(PARTITIONS)}
    got: dict[int, list] = {p: [] for p in range(PARTITIONS)}
    lock = threading.Lock()
    starts = {p: tiered.log_start(p) for p in range(PARTITIONS)}
    stop_producing = threading.Event()
    producer = threading.Thread(target=produce_more, args=(tiered.ctx.settings.bootstrap_servers, tiered.topic,
                                                           stop_producing, produced), daemon=True)  # fmt: skip
    producer.start()
    first, second = Member(config, tiered, got, lock), Member(config, tiered, got, lock)
    first.start()
    second.start()
    time.sleep(8)
    third = Member(config, tiered, got, lock)  # joins: a rebalance
    third.start()
    time.sleep(8)
    first.stop.set()  # leaves: another rebalance
    first.join(60)
    time.sleep(5)
    stop_producing.set()
    producer.join(120)
    ends = {p: tiered.end_offset(p) for p in range(PARTITIONS)}

    def done() -> bool:
        with lock:
            return all(got[p] and got[p][-1][0] >= max(expected(produced[p], True)) for p in range(PARTITIONS))

    deadline = time.monotonic() + 240
    while not done() and time.monotonic() < deadline:
        time.sleep(1)
    for member in (second, third):
        member.stop.set()
        member.join(60)
    assert not (first.errors or second.errors or third.errors), first.errors + second.errors + third.errors
    moved = {p: tiered.log_start(p) for p in range(PARTITIONS)}
    assert any(moved[p] > starts[p] for p in range(PARTITIONS)), "the broker's log start did not move meanwhile"
    for p in range(PARTITIONS):
        offsets = [g[0] for g in got[p]]
        assert len(offsets) == len(set(offsets)), f"partition {p}: duplicates"
        assert offsets == sorted(offsets), f"partition {p}: out of order"
        want = expected(produced[p], True)
        missing, extra = sorted(set(want) - set(offsets)), sorted(set(offsets) - set(want))
        assert not missing and not extra, f"partition {p}: missing {missing[:5]}, extra {extra[:5]}"
        for offset, key, value, headers, _ in got[p]:
            assert (key, value, headers) == want[offset], f"partition {p} offset {offset} differs"
        assert any(g[4] for g in got[p]) and not all(g[4] for g in got[p]), f"partition {p}: not remote then broker"
        assert max(offsets) < ends[p]


def test_close_commits_and_leaves_the_group_even_when_on_revoke_raises(tiered: TieredTopic) -> None:
    """``close`` leaves the group by ``unsubscribe`` and a poll that serves the revocation (librdkafka can hang in
    an unassign its own close serves); the user's on_revoke raising there still closes the inner consumer, the
    group is left at once (the next member gets every partition long before the first one's 60 s session ends),
    and it goes on exactly after what the first member was given."""
    group = f"g-{uuid.uuid4().hex[:6]}"
    config = {"bootstrap.servers": tiered.ctx.settings.bootstrap_servers, "group.id": group,
              "auto.offset.reset": "earliest", "session.timeout.ms": 60_000}  # fmt: skip

    def refuse(_consumer: Any, _partitions: list) -> None:
        raise RuntimeError("on_revoke refused")

    first = TieredConsumer(config, tiered.reader_settings())
    first.subscribe([tiered.topic], on_revoke=refuse)
    given: dict[int, int] = {}
    deadline = time.monotonic() + 60
    while len(given) < PARTITIONS and time.monotonic() < deadline:
        for m in first.consume(100, 0.5):
            assert m.error() is None, m.error()
            given[m.partition()] = m.offset()
    assert len(given) == PARTITIONS, f"the first member read only partitions {sorted(given)}"
    with pytest.raises(RuntimeError, match="on_revoke refused"):
        first.close()
    with pytest.raises(RuntimeError, match="closed"):
        first.consume(1, 0)
    with pytest.raises(RuntimeError, match="Consumer closed"):
        first._inner.assignment()  # librdkafka's consumer itself was closed, not left open behind the error
    second = TieredConsumer(config, tiered.reader_settings())
    second.subscribe([tiered.topic])
    firsts: dict[int, int] = {}
    deadline = time.monotonic() + 30  # half the first member's session: only a group it left gives partitions
    try:
        while len(firsts) < PARTITIONS and time.monotonic() < deadline:
            for m in second.consume(100, 0.5):
                assert m.error() is None, m.error()
                firsts.setdefault(m.partition(), m.offset())
    finally:
        second.close()
    assert firsts == {p: o + 1 for p, o in given.items()}, "the second member did not go on where the first stopped"
