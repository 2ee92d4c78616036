"""The proxy's pure parts: request headers, address rewriting, ApiVersions, and the Fetch split."""

from __future__ import annotations

import datetime
import struct
import threading
import uuid
from typing import Any

import pytest
from kio.schema.errors import ErrorCode
from kio.static.primitive import i8, i16, i32, i64

from reader.cursor import ServedBatches
from reader.errors import NotInRemote, WouldBlock
from reader.proxy import fetch as fetch_module
from reader.proxy.answers import api_versions, list_offsets
from reader.proxy.fetch import FetchPlan
from reader.proxy.handlers import _acks
from reader.proxy.protocol import (
    ProtocolError,
    build,
    nested,
    new_request,
    parse,
    read_request_head,
    request_type,
    response_body_start,
    response_frame,
    response_type,
    supported_versions,
)
from reader.proxy.routing import Router
from reader.proxy.tiered import BrokerOffsets, TieredView, TopicKey


def test_request_head_and_body_round_trip() -> None:
    t = request_type(1, 17)
    topic_type = nested(t, "topics")
    part_type = nested(topic_type, "partitions")
    part = build(part_type, partition=i32(0), current_leader_epoch=i32(-1), fetch_offset=i64(42),
                 last_fetched_epoch=i32(-1), log_start_offset=i64(-1), partition_max_bytes=i32(1 << 20))  # fmt: skip
    body = build(t, max_wait=datetime.timedelta(milliseconds=500), min_bytes=i32(1), max_bytes=i32(1 << 20),
                 isolation_level=i8(0), session_id=i32(0), session_epoch=i32(-1),
                 topics=(build(topic_type, topic_id=uuid.uuid4(), partitions=(part,)),), forgotten_topics_data=(),
                 rack_id="")  # fmt: skip
    frame = new_request(1, 17, 7, "test", body)
    head = read_request_head(frame)
    assert (head.api_key, head.api_version, head.correlation_id, head.client_id) == (1, 17, 7, "test")
    assert parse(t, frame, head.body) == body


def test_garbage_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError):
        read_request_head(b"\x00\x01")
    with pytest.raises(ProtocolError):
        parse(response_type(3, 12), b"\x00\x00\x00\x07\x00\xff\xff\xff", 4)


def test_metadata_and_coordinators_point_back_at_the_proxy() -> None:
    router = Router("proxy.example", {1: 19001}, 19100, [("kafka", 9092)])
    learned: list[int] = []
    router.on_new_node = learned.append
    m = response_type(3, 12)
    broker_type = nested(m, "brokers")
    body = build(m, throttle_time=datetime.timedelta(0), cluster_id="c", controller_id=i32(1), topics=(),
                 brokers=(build(broker_type, node_id=i32(1), host="b1", port=i32(9092), rack=None),
                          build(broker_type, node_id=i32(2), host="b2", port=i32(9093), rack=None)))  # fmt: skip
    out = router.rewrite(3, body)
    assert [(b.node_id, b.host, b.port) for b in out.brokers] == [(1, "proxy.example", 19001),
                                                                  (2, "proxy.example", 19102)]  # fmt: skip
    assert router.broker_address(2) == ("b2", 9093) and learned == [1, 2]
    fc = response_type(10, 4)
    coordinator = nested(fc, "coordinators")
    found = build(coordinator, key="g", node_id=i32(2), host="b2", port=i32(9093), error_code=ErrorCode.none,
                  error_message=None)  # fmt: skip
    missing = build(coordinator, key="h", node_id=i32(-1), host="", port=i32(-1),
                    error_code=ErrorCode.coordinator_not_available, error_message=None)  # fmt: skip
    out = router.rewrite(10, build(fc, throttle_time=datetime.timedelta(0), coordinators=(found, missing)))
    assert [(c.host, c.port) for c in out.coordinators] == [("proxy.example", 19102), ("", -1)]
    old = build(response_type(10, 2), throttle_time=datetime.timedelta(0), error_code=ErrorCode.none,
                error_message=None, node_id=i32(1), host="b1", port=i32(9092))  # fmt: skip
    assert (router.rewrite(10, old).host, router.rewrite(10, old).port) == ("proxy.example", 19001)


def test_api_versions_are_those_both_sides_can_read() -> None:
    r = response_type(18, 3)
    key = nested(r, "api_keys")
    broker = [(0, 0, 13), (1, 0, 99), (17, 0, 1), (78, 1, 2), (9999, 0, 3)]
    body = build(r, error_code=ErrorCode.none, throttle_time=datetime.timedelta(0), supported_features=(),
                 finalized_features_epoch=i64(-1), finalized_features=(), zk_migration_ready=False,
                 api_keys=tuple(build(key, api_key=i16(k), min_version=i16(lo), max_version=i16(hi))
                                for k, lo, hi in broker))  # fmt: skip
    got = {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in api_versions(body).api_keys}
    ours = supported_versions()
    assert got[0] == (ours[0][0], 13)
    assert got[1] == ours[1]
    assert got[17] == (1, 1)  # SaslHandshake v0 is followed by raw tokens: not offered
    assert 78 not in got and 9999 not in got


def test_response_frame_has_its_size_and_header() -> None:
    body = build(response_type(3, 12), throttle_time=datetime.timedelta(0), cluster_id="c", controller_id=i32(1),
                 topics=(), brokers=())  # fmt: skip
    frame = bytes(response_frame(99, 3, 12, body))
    (size, correlation) = struct.unpack_from(">ii", frame)
    assert size == len(frame) - 4 and correlation == 99
    payload = frame[4:]
    assert parse(response_type(3, 12), payload, response_body_start(payload, 3, 12)) == body


TOPIC_ID = uuid.UUID(int=7)


class FakeView:
    """Partition 0 of ``t`` (id ``TOPIC_ID``) is below its log start (100) with remote data 0..150 and a cached
    high watermark of 160; partition 1 is not. ``read`` serves one batch of 10 bytes and records what it read.
    ``live``: the id the cluster gives the name now (another one: ``t`` was deleted and created again)."""

    def __init__(self, hole: bool = False, live: uuid.UUID = TOPIC_ID) -> None:
        self.hole = hole
        self.live = live
        self.reads: list[tuple[int, int]] = []
        self.not_in_remote: set[int] = set()
        self.observed: list[tuple[int, int]] = []
        self.undecided: dict[int, dict[int, int]] = {}  # partition -> open transactions a read stopped at
        self.open_txns: dict[int, int] = {}  # what ``read`` stops at under read_committed, until learned
        self.learned: list[tuple[int, int, list[tuple[int, int]]]] = []
        self.remote_partitions = {0}  # those below the log start
        self.refreshed: list[tuple[list[int], bool]] = []  # refresh_offsets calls: partitions, fresh
        self.asked_ids: list[str] = []  # live_key calls (a Metadata request each)
        self.in_memory: set[int] | None = None  # partitions a read that may not wait finds read ahead (None: all)
        self.closed = False  # the proxy stopping
        self.broken: Exception | None = None  # what ``read`` raises

    def topic_name(self, topic_id: uuid.UUID | None) -> str | None:
        return "t"

    def known_key(self, name: str) -> TopicKey:
        return TopicKey(name, TOPIC_ID)

    def live_key(self, name: str) -> TopicKey:
        self.asked_ids.append(name)
        return TopicKey(name, self.live)

    def routes_remote(self, topic: TopicKey, partition: int, offset: int) -> bool:
        return partition in self.remote_partitions and offset < 100 and not self.hole

    def tiered_names(self) -> set[str]:
        return {"t"}

    def offset_for_time(self, topic: TopicKey, partition: int, timestamp: int, below: int) -> tuple[int, int, int]:
        return (timestamp // 10, timestamp, 3)

    def earliest(self, topic: TopicKey, partition: int) -> tuple[int, int]:
        return (0, 1)

    def refresh_offsets(self, partitions: Any, fresh: bool = False) -> dict[Any, Any]:
        self.refreshed.append((sorted(p for _, p in partitions), fresh))
        return {}

    def maybe_hole(self, topic: TopicKey, partition: int, offset: int) -> bool:
        return self.hole and partition == 0

    def hole_end(self, topic: TopicKey, partition: int, offset: int) -> int | None:
        return 100 if self.hole and partition == 0 else None

    def probe_offset(self, topic: TopicKey, partition: int, settle: bool = False) -> int:
        return 100 if settle else 160

    def wants_outcomes(self, topic: TopicKey, partition: int) -> bool:
        return partition in self.undecided

    def note_undecided(self, topic: TopicKey, partition: int, undecided: Any) -> None:
        self.undecided[partition] = dict(undecided)

    def learn_outcomes(self, topic: TopicKey, partition: int, log_start: int, aborted: Any) -> None:
        self.learned.append((partition, log_start, list(aborted)))
        self.undecided.pop(partition, None)

    def broker_offsets(self, topic: TopicKey, partition: int, fresh: bool = False, block: bool = True) -> Any:
        return BrokerOffsets(100, 160, 160, 0.0)

    def read(self, topic: TopicKey, partition: int, offset: int, max_bytes: int, read_committed: bool,
             min_one: bool = True, block: bool = True) -> Any:  # fmt: skip
        if not block and self.in_memory is not None and partition not in self.in_memory:
            raise WouldBlock(f"partition {partition} is not read ahead")
        if offset in self.not_in_remote:
            raise NotInRemote(topic.name, partition, offset, 40)
        if self.broken is not None:
            raise self.broken
        self.reads.append((partition, offset))
        if read_committed and self.open_txns and not self.learned:
            return ServedBatches(b"", [], offset, undecided=self.open_txns)
        fits = min_one or max_bytes >= 10
        return ServedBatches(b"r" * 10 if fits else b"", [], offset + 1 if fits else offset)

    def known_offsets(self, topic: TopicKey, partition: int) -> Any:
        return BrokerOffsets(100, 160, 160, 0.0)

    def remote_range(self, topic: TopicKey, partition: int, current: bool = False) -> tuple[int, int]:
        return (0, 150)

    def observe(self, answered: list[tuple[TopicKey, int, int, int, int]]) -> None:
        self.observed.extend((partition, log_start) for _, partition, log_start, _, _ in answered)


def fetch_request(version: int, offsets: dict[int, int], session: tuple[int, int] = (5, 3),
                  max_bytes: int = 50 << 20) -> Any:  # fmt: skip
    t = request_type(1, version)
    topic_type = nested(t, "topics")
    part_type = nested(topic_type, "partitions")
    parts = tuple(build(part_type, partition=i32(p), current_leader_epoch=i32(-1), fetch_offset=i64(o),
                        last_fetched_epoch=i32(-1), log_start_offset=i64(-1), partition_max_bytes=i32(1 << 20))
                  for p, o in offsets.items())  # fmt: skip
    return build(t, replica_id=i32(-1), max_wait=datetime.timedelta(milliseconds=500), min_bytes=i32(1),
                 max_bytes=i32(max_bytes), isolation_level=i8(1), session_id=i32(session[0]),
                 session_epoch=i32(session[1]), topics=(build(topic_type, topic="t", topic_id=TOPIC_ID,
                 partitions=parts),), forgotten_topics_data=(), rack_id="")  # fmt: skip


@pytest.mark.parametrize("version", [4, 11, 13, 17])
def test_fetch_split_asks_the_broker_a_sessionless_request_with_a_probe_for_each_remote_partition(version: int) -> None:
    """The remote partition goes to the broker too, at its cached high watermark with no room for records: the
    broker decides whether this client may read it."""
    plan = FetchPlan.make(version, fetch_request(version, {0: 50, 1: 7}), FakeView())  # type: ignore[arg-type]
    assert [(p.partition, p.offset) for p in plan.remote] == [(0, 50)]
    assert plan.read_committed
    sent = [(int(p.partition), int(p.fetch_offset), int(p.partition_max_bytes))
            for t in plan.upstream.topics for p in t.partitions]  # fmt: skip
    assert sent == [(0, 160, 0), (1, 7, 1 << 20)]
    assert plan.upstream.max_wait == datetime.timedelta(0)  # the remote data is there now: the broker must not wait
    if version >= 7:
        assert (plan.upstream.session_id, plan.upstream.session_epoch) == (0, -1)


def test_fetch_all_remote_still_asks_the_broker_and_holes_move_to_the_log_start() -> None:
    plan = FetchPlan.make(17, fetch_request(17, {0: 10}), FakeView())  # type: ignore[arg-type]
    assert [(int(p.fetch_offset), int(p.partition_max_bytes)) for t in plan.upstream.topics
            for p in t.partitions] == [(160, 0)]  # fmt: skip
    quick = FetchPlan.make(17, fetch_request(17, {0: 120}), FakeView(hole=True))  # type: ignore[arg-type]
    assert quick.unconfirmed
    confirmed = FetchPlan.make(17, fetch_request(17, {0: 120}), FakeView(hole=True), True)  # type: ignore[arg-type]
    assert [int(p.fetch_offset) for t in confirmed.upstream.topics for p in t.partitions] == [100]


def broker_answer(version: int, key: Any, codes: dict[int, ErrorCode], top: ErrorCode = ErrorCode.none,
                  throttled: int = 0, aborted: list[tuple[int, int]] | None = None) -> Any:  # fmt: skip
    """The broker's Fetch answer: each partition with its error code (records only where none: a batch the
    probe was not meant to get) and ``aborted`` as its aborted transactions (producer id, first offset)."""
    response = response_type(1, version)
    topic_type = nested(response, "responses")
    data_type = nested(topic_type, "partitions")
    txn_type = nested(data_type, "aborted_transactions")
    txns = None if aborted is None else tuple(build(txn_type, producer_id=i64(pid), first_offset=i64(first))
                                              for pid, first in aborted)  # fmt: skip
    parts = tuple(build(data_type, partition_index=i32(p), error_code=code, high_watermark=i64(160),
                        last_stable_offset=i64(160), log_start_offset=i64(100), aborted_transactions=txns,
                        preferred_read_replica=i32(-1), records=b"b" * 7 if code == ErrorCode.none else None)
                  for p, code in codes.items())  # fmt: skip
    topics = (build(topic_type, topic="t", topic_id=key, partitions=parts),)
    return build(response, throttle_time=datetime.timedelta(milliseconds=throttled), error_code=top,
                 session_id=i32(0), responses=topics if codes else (), node_endpoints=())  # fmt: skip


@pytest.mark.parametrize("version", [12, 13])
@pytest.mark.parametrize(
    "code", [ErrorCode.topic_authorization_failed, ErrorCode.unknown_topic_id, ErrorCode.not_leader_or_follower]
)
def test_a_probe_the_broker_refuses_is_answered_with_its_refusal_and_nothing_is_read(
    version: int, code: ErrorCode
) -> None:
    view = FakeView()
    request = fetch_request(version, {0: 50, 1: 7})
    plan = FetchPlan.make(version, request, view)  # type: ignore[arg-type]
    key = request.topics[0].topic_id if version >= 13 else "t"
    merged, _ = plan.merge(broker_answer(version, key, {0: code, 1: code}), view)  # type: ignore[arg-type]
    parts = {int(p.partition_index): p for t in merged.responses for p in t.partitions}
    assert parts[0].error_code == code and not parts[0].records
    assert view.reads == [] and not plan.served_remote and plan.denied == {key}


def test_a_refused_request_sends_no_speculative_read() -> None:
    """Data read ahead of the broker's answer goes out only where that answer allows it."""
    view = FakeView()
    plan = FetchPlan.make(12, fetch_request(12, {0: 50}), view)  # type: ignore[arg-type]
    plan.read_remote(view)  # type: ignore[arg-type]
    merged, _ = plan.merge(broker_answer(12, "t", {0: ErrorCode.topic_authorization_failed}), view)  # type: ignore[arg-type]
    assert [(int(p.error_code), p.records) for t in merged.responses for p in t.partitions] == [(29, None)]
    whole = broker_answer(12, "t", {}, top=ErrorCode.unknown_server_error)
    plan = FetchPlan.make(12, fetch_request(12, {0: 50}), view)  # type: ignore[arg-type]
    plan.read_remote(view)  # type: ignore[arg-type]
    assert plan.merge(whole, view)[0] is whole  # type: ignore[arg-type]


@pytest.mark.parametrize("code", [ErrorCode.none, ErrorCode.offset_out_of_range])
def test_a_probe_the_broker_allows_is_answered_from_remote(code: ErrorCode) -> None:
    """NONE or OFFSET_OUT_OF_RANGE for the probe: authorised and led there. The probe's own records (the high
    watermark moved) never go out; the remote batch does, with the broker's offsets learned."""
    view = FakeView()
    plan = FetchPlan.make(12, fetch_request(12, {0: 50, 1: 7}), view)  # type: ignore[arg-type]
    merged, changed = plan.merge(broker_answer(12, "t", {0: code, 1: ErrorCode.none}), view)  # type: ignore[arg-type]
    parts = {int(p.partition_index): p for t in merged.responses for p in t.partitions}
    assert changed and view.reads == [(0, 50)]
    assert parts[0].error_code == ErrorCode.none and parts[0].records == b"r" * 10
    assert parts[1].records == b"b" * 7
    assert plan.allowed == {"t"} and plan.served_remote == {("t", 0)}
    assert (0, 100) in view.observed if code == ErrorCode.none else (1, 100) in view.observed


@pytest.mark.parametrize("stopping", [False, True], ids=["running", "stopping"])
def test_a_read_failing_unexpectedly_is_a_storage_error_logged_as_an_error_unless_the_proxy_stops(
    stopping: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """The partition fails with KAFKA_STORAGE_ERROR (the client retries), never the connection; a bug is an
    ERROR with its traceback, while a read the proxy's stopping cut short (its download threads shut: "cannot
    schedule new futures after shutdown") is an INFO line."""
    view = FakeView()
    view.broken, view.closed = RuntimeError("cannot schedule new futures after shutdown"), stopping
    plan = FetchPlan.make(12, fetch_request(12, {0: 50}), view)  # type: ignore[arg-type]
    with caplog.at_level("INFO", logger="reader.proxy.fetch"):
        plan.read_remote(view)  # type: ignore[arg-type]
    assert [int(part.answer.error_code) for part in plan.remote] == [ErrorCode.kafka_storage_error.value]
    levels = [(r.levelname, r.exc_info is not None) for r in caplog.records if r.name == "reader.proxy.fetch"]
    assert levels == ([("INFO", False)] if stopping else [("ERROR", True)]), levels


@pytest.mark.parametrize("version", [12, 13])
def test_a_read_that_may_not_wait_reads_in_order_up_to_the_first_partition_not_in_memory(version: int) -> None:
    """On the event loop only what read-ahead holds is read, in the request's order, up to the first partition
    that would wait; the rest is read where waiting is allowed, within what is left of max_bytes. By name, a
    partition whose id was not confirmed in this request is not read there (it asks the cluster)."""
    view = FakeView()
    view.remote_partitions, view.in_memory = {0, 1, 2}, {0, 2}
    request = fetch_request(version, {0: 50, 1: 60, 2: 70}, max_bytes=25)
    plan = FetchPlan.make(version, request, view)  # type: ignore[arg-type]
    if version < 13:
        plan.read_remote(view, block=False)  # type: ignore[arg-type]
        assert view.reads == [] and view.asked_ids == [] and plan.ahead_unread
        plan.live["t"] = True  # confirmed once in this request
    plan.read_remote(view, block=False)  # type: ignore[arg-type]
    assert view.reads == [(0, 50)] and plan.ahead_unread
    assert [part.read for part in plan.remote] == [True, False, False]
    plan.read_remote(view)  # type: ignore[arg-type]
    assert view.reads == [(0, 50), (1, 60), (2, 70)] and not plan.ahead_unread
    assert [len(part.answer.records) for part in plan.remote] == [10, 10, 0]  # 25 bytes: no room for a third


def test_the_read_on_the_event_loop_stops_at_its_time_and_leaves_the_rest_to_a_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Fetch of many remote partitions all in memory does not hold the event loop past
    ``INLINE_READ_SECONDS``: what is left is read where waiting is allowed, and nothing is read twice."""
    view = FakeView()
    view.remote_partitions = set(range(40))
    plan = FetchPlan.make(13, fetch_request(13, {p: 2 * p for p in range(40)}), view)  # type: ignore[arg-type]
    monkeypatch.setattr(fetch_module, "INLINE_READ_SECONDS", -1.0)  # its time is up before the first partition
    plan.read_remote(view, block=False)  # type: ignore[arg-type]
    assert view.reads == [] and plan.ahead_unread
    monkeypatch.setattr(fetch_module, "INLINE_READ_SECONDS", 60.0)
    plan.read_remote(view, block=False)  # type: ignore[arg-type]
    assert view.reads == [(p, 2 * p) for p in range(40)] and not plan.ahead_unread
    plan.read_remote(view)  # type: ignore[arg-type]
    assert len(view.reads) == 40


def test_open_transactions_in_the_remote_part_are_settled_by_the_brokers_answer_at_its_log_start() -> None:
    """read_committed stops at a transaction the remote copies leave open; the next fetch probes at the
    broker's log start, reads nothing before the broker answered, learns from that answer's aborted
    transactions how it ended, and then serves the remote records."""
    view = FakeView()
    view.open_txns = {7: 40}
    plan = FetchPlan.make(13, fetch_request(13, {0: 40}), view)  # type: ignore[arg-type]
    merged, _ = plan.merge(broker_answer(13, TOPIC_ID, {0: ErrorCode.none}, aborted=[]), view)  # type: ignore[arg-type]
    assert [p.records for t in merged.responses for p in t.partitions] == [b""]
    assert view.undecided == {0: {7: 40}} and not view.learned  # the probe was at the high watermark: not asked

    plan = FetchPlan.make(13, fetch_request(13, {0: 40}), view)  # type: ignore[arg-type]
    assert [int(p.fetch_offset) for t in plan.upstream.topics for p in t.partitions] == [100]
    reads = len(view.reads)
    plan.read_remote(view)  # type: ignore[arg-type]
    assert len(view.reads) == reads and plan.unread  # nothing read before the broker's word
    answer = broker_answer(13, TOPIC_ID, {0: ErrorCode.none}, aborted=[(7, 40), (9, 120)])
    merged, _ = plan.merge(answer, view)  # type: ignore[arg-type]
    assert view.learned == [(0, 100, [(7, 40), (9, 120)])]
    assert [p.records for t in merged.responses for p in t.partitions] == [b"r" * 10]


def test_the_brokers_offsets_are_asked_once_for_all_partitions_of_an_answer() -> None:
    """No admin round trip per partition: the remote partitions' offsets in one call before they are read, and
    the partitions the broker answered OFFSET_OUT_OF_RANGE that the copies hold in one fresh call."""
    view = FakeView()
    view.remote_partitions = {0, 2, 3}
    plan = FetchPlan.make(13, fetch_request(13, {0: 50, 1: 20, 2: 60, 3: 70, 4: 30}), view)  # type: ignore[arg-type]
    plan.read_remote(view)  # type: ignore[arg-type]
    assert view.refreshed == [([0, 2, 3], False)]
    codes = {0: ErrorCode.none, 1: ErrorCode.offset_out_of_range, 2: ErrorCode.none, 3: ErrorCode.none,
             4: ErrorCode.offset_out_of_range}  # fmt: skip
    merged, _ = plan.merge(broker_answer(13, TOPIC_ID, codes), view)  # type: ignore[arg-type]
    assert view.refreshed[1:] == [([1, 4], True)]
    assert plan.served_remote == {(TOPIC_ID, p) for p in range(5)}
    assert [(int(p.partition_index), int(p.error_code)) for t in merged.responses for p in t.partitions] == [
        (p, 0) for p in range(5)
    ]


def test_list_offsets_asks_nothing_for_untiered_topics_and_once_for_the_tiered_ones() -> None:
    """By timestamp and EARLIEST: a topic the tiering metadata does not know keeps the broker's answer with
    nothing asked of the cluster; a tiered one is asked its id once and its partitions' log starts in one call."""
    view = FakeView()
    request_t, answer_t = request_type(2, 7), response_type(2, 7)
    req_topic, req_part = nested(request_t, "topics"), nested(nested(request_t, "topics"), "partitions")
    ans_topic, ans_part = nested(answer_t, "topics"), nested(nested(answer_t, "topics"), "partitions")
    specs = {0: 5000, 1: 7000, 2: -2}
    asked = tuple(build(req_part, partition_index=i32(p), current_leader_epoch=i32(-1), timestamp=i64(ts))
                  for p, ts in specs.items())  # fmt: skip
    said = tuple(build(ans_part, partition_index=i32(p), error_code=ErrorCode.none, timestamp=i64(-1),
                       offset=i64(100), leader_epoch=i32(3)) for p in specs)  # fmt: skip
    request = build(request_t, replica_id=i32(-1), isolation_level=i8(0),
                    topics=tuple(build(req_topic, name=name, partitions=asked) for name in ("t", "u")))  # fmt: skip
    answer = build(answer_t, throttle_time=datetime.timedelta(0),
                   topics=tuple(build(ans_topic, name=name, partitions=said) for name in ("t", "u")))  # fmt: skip
    done = list_offsets(request, answer, view)  # type: ignore[arg-type]
    got = {(t.name, int(p.partition_index)): int(p.offset) for t in done.topics for p in t.partitions}
    assert got == {("t", 0): 500, ("t", 1): 700, ("t", 2): 0, ("u", 0): 100, ("u", 1): 100, ("u", 2): 100}
    assert view.asked_ids == ["t"] and view.refreshed == [([0, 1], False)]


def test_settled_turns_open_transactions_into_aborted_ones_or_drops_them() -> None:
    from reader.cursor import settled
    from reader.txn import TxnView
    from tiering_core.formats import AbortedTxn

    view = TxnView([AbortedTxn(0, 3, 5, 9, 5)], {7: 40, 8: 42, 9: 44})
    after = settled(view, {(7, 40): True, (8, 42): False, (9, 10): True})  # 9's is another transaction
    assert [(a.producer_id, a.first_offset) for a in after.aborted] == [(3, 5), (7, 40)]
    assert after.aborted[1].last_offset > 1 << 62  # its marker is past the remote data
    assert after.unresolved == {9: 44}


class _Copy:
    def __init__(self, epochs: list[tuple[int, int]]) -> None:
        from tiering_core.formats import EpochEntry

        self.epochs = tuple(EpochEntry(e, o) for e, o in epochs)


def test_offset_for_leader_epoch_from_the_copies_checkpoints() -> None:
    """Kafka's endOffsetFor over the oldest and newest copies' checkpoints: an epoch that ended inside the
    remote data ends where the next one starts; the last remote epoch is left to the broker."""
    view = TieredView.__new__(TieredView)
    oldest, newest = _Copy([(0, 0), (2, 100)]), _Copy([(2, 100), (5, 400), (7, 900)])
    view.remote_range = lambda topic, partition, current=False: (0, 800)  # type: ignore[method-assign]
    view._locate = lambda topic, partition, offset: oldest if offset == 0 else newest  # type: ignore[method-assign]
    t = TopicKey("t", TOPIC_ID)
    assert view.end_offset_for_epoch(t, 0, 0) == (0, 100)
    assert view.end_offset_for_epoch(t, 0, 1) == (0, 100)  # no epoch 1: the one before it, ended at 100
    assert view.end_offset_for_epoch(t, 0, 2) == (2, 400)
    assert view.end_offset_for_epoch(t, 0, 5) is None  # epoch 7 starts past the remote end: the broker knows
    assert view.end_offset_for_epoch(t, 0, 9) is None


@pytest.mark.parametrize("code", [ErrorCode.none, ErrorCode.offset_out_of_range])
def test_a_fetch_by_name_of_a_topic_created_again_is_not_answered_from_the_deleted_topics_copies(
    code: ErrorCode,
) -> None:
    """Fetch v4-12 names the topic: the broker allows the probe of the new topic of that name, and only the
    cluster's id for the name, asked now, shows that the learned id (and its copies) is a deleted topic's. The
    partition is answered with no records and no error (the client asks again) and nothing is read."""
    view = FakeView(live=uuid.UUID(int=8))
    plan = FetchPlan.make(12, fetch_request(12, {0: 50, 1: 7}), view)  # type: ignore[arg-type]
    plan.read_remote(view)  # type: ignore[arg-type]  # read ahead of the broker's answer: confirmed first too
    merged, _ = plan.merge(broker_answer(12, "t", {0: code, 1: ErrorCode.none}), view)  # type: ignore[arg-type]
    assert _sizes(merged) == {0: 0, 1: 7}
    assert [int(p.error_code) for t in merged.responses for p in t.partitions] == [0, 0]
    assert view.reads == [] and not plan.served_remote


def test_a_name_created_again_forgets_the_old_incarnation() -> None:
    """The broker's offsets and the cursors are keyed by topic id; a Metadata answer giving the name another id
    drops the old incarnation's entries (its log start would route the new topic's offsets to old copies)."""

    class Dropped:
        def __init__(self) -> None:
            self.ids: list[str] = []
            self.names: list[str] = []

        def drop(self, topic_id: str) -> None:
            self.ids.append(topic_id)

        def forget(self, name: str) -> None:
            self.names.append(name)

    view = TieredView.__new__(TieredView)
    dropped = Dropped()
    view.cursors, view.catalog = dropped, dropped  # type: ignore[assignment]
    view._offsets, view._names, view._ids, view._lock = {}, {}, {}, threading.Lock()
    old, new = TopicKey("t", TOPIC_ID), TopicKey("t", uuid.UUID(int=8))
    view.learn_name(old.id, "t")
    view.observe([(old, 0, 3960, 6000, 6000)])
    view.observe([(new, 0, 0, 10, 10)])  # by id: the new topic's answer does not meet the old one's guard
    assert view.known_log_start(old, 0) == 3960 and view.known_log_start(new, 0) == 0
    view.learn_name(new.id, "t")
    assert view.known_key("t") == new and view.known_log_start(old, 0) is None and view.known_log_start(new, 0) == 0
    assert dropped.ids == [old.kafka_id] and dropped.names == ["t"]
    assert old.kafka_id == "AAAAAAAAAAAAAAAAAAAABw"


def _sizes(answer: Any) -> dict[int, int]:
    return {int(p.partition_index): len(p.records or b"") for t in answer.responses for p in t.partitions}


def test_a_mixed_answer_stays_within_max_bytes() -> None:
    """max_bytes 12: the remote batch of 10 comes first, so the broker's 7 bytes wait (only the first partition
    with data may exceed the limit; the client fetches them again); read ahead of the broker's answer, the
    broker is asked for the 2 bytes left, and its one larger batch is dropped likewise. With max_bytes 20 both
    fit."""
    view = FakeView()
    plan = FetchPlan.make(12, fetch_request(12, {0: 50, 1: 7}, max_bytes=12), view)  # type: ignore[arg-type]
    merged, _ = plan.merge(broker_answer(12, "t", {0: ErrorCode.none, 1: ErrorCode.none}), view)  # type: ignore[arg-type]
    assert _sizes(merged) == {0: 10, 1: 0}
    plan = FetchPlan.make(12, fetch_request(12, {0: 50, 1: 7}, max_bytes=20), view)  # type: ignore[arg-type]
    merged, _ = plan.merge(broker_answer(12, "t", {0: ErrorCode.none, 1: ErrorCode.none}), view)  # type: ignore[arg-type]
    assert _sizes(merged) == {0: 10, 1: 7}
    view = FakeView()
    plan = FetchPlan.make(12, fetch_request(12, {0: 50, 1: 7}, max_bytes=12), view)  # type: ignore[arg-type]
    plan.read_remote(view)  # type: ignore[arg-type]
    plan.limit_upstream()
    assert int(plan.upstream.max_bytes) == 2
    merged, _ = plan.merge(broker_answer(12, "t", {0: ErrorCode.none, 1: ErrorCode.none}), view)  # type: ignore[arg-type]
    assert _sizes(merged) == {0: 10, 1: 0}


def test_an_answer_names_every_partition_asked_and_a_throttled_one_stays_empty() -> None:
    """A full fetch's answer names every partition (Java drops one that omits a partition), also where the
    copies no longer hold the offset; the broker's throttled empty answer (KIP-219) goes out as it is."""
    view = FakeView()
    view.not_in_remote.add(50)
    plan = FetchPlan.make(12, fetch_request(12, {0: 50, 1: 7}), view)  # type: ignore[arg-type]
    merged, _ = plan.merge(broker_answer(12, "t", {0: ErrorCode.none, 1: ErrorCode.none}), view)  # type: ignore[arg-type]
    parts = {int(p.partition_index): p for t in merged.responses for p in t.partitions}
    assert set(parts) == {0, 1} and parts[0].error_code == ErrorCode.none and not parts[0].records
    throttled = broker_answer(12, "t", {}, throttled=500)
    plan = FetchPlan.make(12, fetch_request(12, {0: 50}), FakeView())  # type: ignore[arg-type]
    assert plan.merge(throttled, FakeView())[0] is throttled  # type: ignore[arg-type]


@pytest.mark.parametrize("version", [3, 8, 9, 11])
@pytest.mark.parametrize("transactional_id", [None, "", "a-transactional-id"])
@pytest.mark.parametrize("acks", [0, 1, -1])
def test_a_produce_requests_acks_are_read_at_every_version(version: int, transactional_id: str | None,
                                                           acks: int) -> None:  # fmt: skip
    """acks=0 gets no answer from the broker, so the proxy must not wait for one (handlers.py ``_acks``)."""
    body = build(request_type(0, version), transactional_id=transactional_id, acks=i16(acks),
                 timeout=datetime.timedelta(seconds=30), topic_data=())  # fmt: skip
    assert _acks(new_request(0, version, 5, "producer", body), version) == acks
