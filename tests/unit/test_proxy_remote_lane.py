"""What the proxy hands a remote lane (``reader/proxy/remote_lane.Chain``), over a fake read core: each answer's
partitions read as ``FetchPlan.read_remote`` reads them (the first partition with data may bring one batch past the
room, the others what fits in ``max_bytes``), every position moved only once a whole answer was read (a read that
would wait in the middle of an answer skips no offset), the answer budget taken per answer handed and given back as
answers are served, when the lane ends, and by a hand that finishes after it ended."""

from __future__ import annotations

from typing import Any

from reader.cursor import ServedBatches
from reader.errors import NotInRemote, WouldBlock
from reader.proxy.budget import ByteBudget
from reader.proxy.fetch_ahead import Given, NextFetch, client_layout
from reader.proxy.protocol import read_request_head
from reader.proxy.remote_lane import Chain, RemoteHeld, RemotePartition
from reader.proxy.tiered import TopicKey
from tests.unit.test_proxy_fetch_ahead import TOPICS, _batches, _request

VERSION = 13
BATCH = len(_batches(0, [1]))  # one batch of one record


class FakeView:
    """Partitions of one-record batches from offset 0 up to ``ends``; ``blocked``: partitions whose next read
    would wait."""

    def __init__(self, ends: dict[int, int]) -> None:
        self.ends = ends
        self.blocked: set[int] = set()
        self.reads: list[tuple[int, int, int, bool]] = []

    def read(self, topic: TopicKey, partition: int, offset: int, max_bytes: int, read_committed: bool,
             min_one: bool = True, block: bool = True) -> ServedBatches:  # fmt: skip
        self.reads.append((partition, offset, max_bytes, min_one))
        if partition in self.blocked and not block:
            raise WouldBlock("not downloaded yet")
        if offset >= self.ends[partition]:
            raise NotInRemote("the broker has it")
        count = max(1 if min_one else 0, max_bytes // BATCH)
        count = min(count, self.ends[partition] - offset)
        return ServedBatches(_batches(offset, [1] * count), [], offset + count)


class FakeLane:
    def __init__(self) -> None:
        self.handed: list[tuple[list[Any], Any]] = []
        self.lane = self

    def extend(self, records: list[Any], aborted: Any = None) -> None:
        self.handed.append((records, aborted))


def _chain(view: FakeView, budget: ByteBudget, max_bytes: int, partition_max_bytes: int) -> Chain:
    name, topic_id = TOPICS[0]
    topic = TopicKey(name, topic_id)
    frame, _ = _request(VERSION)  # partitions 0 and 1 of two topics, at offsets 1000 and 2000
    start = read_request_head(frame).body
    layout = client_layout(frame, start, VERSION)
    assert layout is not None
    parts = tuple(RemotePartition(topic_id, topic, p, partition_max_bytes, 0) for p in range(2))
    held = RemoteHeld(parts, max_bytes, False, b"probe")
    given = [Given(topic_id, p, 10**6, 10**6, None) for p in range(2)]  # answer 0 gave nothing: offsets as asked
    return Chain(held, NextFetch(frame, start, VERSION, layout), given, view, budget)  # type: ignore[arg-type]


def _offsets(records: Any) -> list[int]:
    return [int.from_bytes(bytes(r[:8]), "big") for r in records if r is not None]


def test_answers_are_read_as_the_plan_reads_them_and_handed_in_order() -> None:
    view, budget, lane = FakeView({0: 1010, 1: 2010}), ByteBudget(1 << 20), FakeLane()
    chain = _chain(view, budget, max_bytes=3 * BATCH, partition_max_bytes=2 * BATCH)
    assert chain.hand(lane, block=False) == 5 and chain.ended  # then the remote end of partition 0
    first, aborted = lane.handed[0]
    assert aborted is None and _offsets(first) == [1000, 2000]  # partition 0 two batches, partition 1 what fits
    assert len(first[0]) == 2 * BATCH and len(first[1]) == BATCH
    assert _offsets(lane.handed[1][0]) == [1002, 2001]
    assert budget.used == sum(len(r) for records, _ in lane.handed for r in records if r is not None)
    chain.served(4)
    chain.close()
    assert budget.used == 0


def test_a_read_that_would_wait_in_the_middle_of_an_answer_moves_no_position() -> None:
    view, budget, lane = FakeView({0: 1010, 1: 2010}), ByteBudget(1 << 20), FakeLane()
    chain = _chain(view, budget, max_bytes=1 << 20, partition_max_bytes=BATCH)
    view.blocked.add(1)
    assert chain.hand(lane, block=False) == 0 and not chain.ended
    assert budget.used == 0
    view.blocked.clear()
    assert chain.hand(lane, block=False) > 0
    assert _offsets(lane.handed[0][0]) == [1000, 2000]  # partition 0 read again from where the answer began


def test_a_hand_that_ends_after_the_lane_gives_its_budget_back() -> None:
    view, budget, lane = FakeView({0: 1010, 1: 2010}), ByteBudget(1 << 20), FakeLane()
    chain = _chain(view, budget, max_bytes=1 << 20, partition_max_bytes=BATCH)
    read = view.read

    def closing(*args: Any, **kwargs: Any) -> ServedBatches:
        chain.close()  # the lane ends while this hand reads (on a remote thread)
        return read(*args, **kwargs)

    view.read = closing  # type: ignore[method-assign]
    assert chain.hand(lane, block=True) == 0 and not lane.handed
    assert budget.used == 0


def test_the_budget_bounds_what_is_handed() -> None:
    view, lane = FakeView({0: 1200, 1: 2200}), FakeLane()
    budget = ByteBudget(5 * BATCH)
    chain = _chain(view, budget, max_bytes=1 << 20, partition_max_bytes=BATCH)
    assert chain.hand(lane, block=False) == 2 and chain.ended  # two answers of two batches, no room for a third
    assert budget.used == 4 * BATCH
    chain.close()
    assert budget.used == 0
