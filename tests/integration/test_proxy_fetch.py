"""The proxy on the real stack: Kafka clients read a tiered topic from offset 0, remote and broker parts."""

from __future__ import annotations

import gc
import socket
import struct
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from deploy.stack import Endpoints
from reader.proxy.fetch import FetchPlan
from reader.proxy.fetch_ahead import Ahead, Given, Held
from reader.proxy.pass_through import PassThrough
from reader.proxy.slots import Request, Slot
from tests.kafka_wire import FETCH, RawKafka, batch_count, fetch_fields, partition_errors, read_exactly
from tests.proxy_harness import (
    UNHURRIED,
    check_exact,
    console_consume,
    kcat_consume,
    proxy_bootstrap,
    proxy_for,
    random_topic,
    read_all,
)
from tests.reader_harness import TieredTopic, expected, tiered_topic
from tests.sidecar_harness import write_config

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def tiered(stack: Endpoints, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TieredTopic]:
    with tiered_topic(stack, tmp_path_factory.mktemp("proxy"), records=20_000, partitions=2) as t:
        yield t


def as_record(m: Any) -> tuple:
    return (m.key(), m.value(), list(m.headers() or []))


@pytest.mark.containers
@pytest.mark.parametrize("isolation", ["read_uncommitted", "read_committed"])
def test_confluent_consumer_reads_everything_from_zero(stack: Endpoints, tiered: TieredTopic, isolation: str) -> None:
    """A plain confluent_kafka.Consumer through the proxy gets every record once, byte for byte, across the
    remote / broker boundary; the remote part came from remote storage, answers asked ahead among them."""
    ends = {p: tiered.end_offset(p) for p in tiered.by_partition}
    assert all(tiered.log_start(p) > 0 for p in ends)
    with proxy_for(tiered.config, stack.bootstrap, fetch_ahead_max_age_seconds=UNHURRIED) as proxy:
        got = read_all(proxy_bootstrap(proxy), tiered.topic, ends, **{"isolation.level": isolation})
        remote = proxy.metrics.fetch_partitions.labels("remote")._value.get()
        ahead = proxy.metrics.fetch_ahead.labels("served")._value.get()
    committed = isolation == "read_committed"
    for p, messages in got.items():
        check_exact([(m.offset(), as_record(m)) for m in messages], expected(tiered.by_partition[p], committed))
    assert remote > 0, "nothing was answered from remote storage"
    assert ahead > 0, "no Fetch asked ahead was served (reader/proxy/fetch_ahead.py)"


@contextmanager
def collector_off() -> Iterator[Callable[[], list[str]]]:
    """The block runs with Python's cyclic garbage collector off; what it is given names (by type) the proxy's
    request and answer state that only the collector could free, found among the unreachable objects then."""

    def in_cycles() -> list[str]:
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        return [type(found).__qualname__ for found in gc.garbage if _left_in_cycles(found)]

    gc.collect()
    gc.disable()
    try:
        yield in_cycles
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


def _left_in_cycles(found: object) -> bool:
    """A request's or an answer's state in the proxy, or a view of a received answer (64 KiB or more)."""
    if isinstance(found, memoryview):
        return found.nbytes >= 1 << 16
    return isinstance(found, (Slot, Request, Ahead, Held, Given, FetchPlan, PassThrough))


def test_every_answer_is_freed_once_sent_without_the_garbage_collector(stack: Endpoints, tiered: TieredTopic) -> None:
    """With Python's cyclic garbage collector off, a consumer reads the tiered topic (remote part, broker tail) and
    a local topic of several answers (passed through, Fetch asked ahead) through the proxy, byte for byte, and
    nothing of an answer is left in a reference cycle: no slot, held answer, plan or view of a received answer
    among what only the collector could free. An answer kept alive by a cycle outlives the budget that counted it
    (its bytes given back when it was sent) until the next collection, every page of the next answer then new
    memory (docs/design.md, "Answers freed when sent")."""
    local, produced = random_topic(stack.bootstrap, 1, 6_000)
    ends = {p: tiered.end_offset(p) for p in tiered.by_partition}
    with collector_off() as in_cycles, proxy_for(tiered.config, stack.bootstrap,
                                                 fetch_ahead_max_age_seconds=UNHURRIED) as proxy:  # fmt: skip
        got = read_all(proxy_bootstrap(proxy), tiered.topic, ends, **{"isolation.level": "read_uncommitted"})
        got_local = read_all(proxy_bootstrap(proxy), local, {0: len(produced[0])})
        served = proxy.metrics.fetch_ahead.labels("served")._value.get()
        remote = proxy.metrics.fetch_partitions.labels("remote")._value.get()
        left = in_cycles()
    for p, messages in got.items():
        check_exact([(m.offset(), as_record(m)) for m in messages], expected(tiered.by_partition[p], False))
    check_exact([(m.offset(), as_record(m)) for m in got_local[0]], produced[0])
    assert remote > 0 and served > 0, (remote, served)
    assert not left, f"left in reference cycles: {sorted(set(left))} ({len(left)} objects)"


@pytest.mark.parametrize("read_first", [False, True], ids=["no-answer-read", "first-answer-begun"])
def test_a_client_gone_mid_answer_leaves_nothing_in_reference_cycles(stack: Endpoints, tiered: TieredTopic,
                                                                     read_first: bool) -> None:  # fmt: skip
    """With the cyclic garbage collector off, a client sends Fetch requests of the remote part and resets its
    connection (RST), either with no answer read or once the first answer has begun to come (its size read, the
    others queued or being read): the proxy's connection ends on the error, and nothing of its requests or answers
    is left in a reference cycle. The error's traceback holds the frames of the connection's tasks (the last
    request routed, an answer being written); kept in a cycle, those would hold their buffers and answer budget
    until the next collection."""
    with collector_off() as in_cycles, proxy_for(tiered.config, stack.bootstrap) as proxy:
        raw = RawKafka(f"127.0.0.1:{proxy.router.port_for(1)}")
        topic_id = raw.metadata(tiered.topic).topics[0].topic_id
        for offset in (0, 100, 200):
            raw.send(FETCH, 13, **fetch_fields(13, tiered.topic, topic_id, {0: offset, 1: offset}, 4 << 20))
        if read_first:
            read_exactly(raw.sock, 4)
        raw.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with RST
        raw.close()
        deadline = time.monotonic() + 30
        while proxy.metrics.connections._value.get() and time.monotonic() < deadline:
            time.sleep(0.05)
        open_connections = proxy.metrics.connections._value.get()
        errors = proxy.metrics.closed_bad.labels("error")._value.get()
        left = in_cycles()
    assert open_connections == 0 and errors == 1, (open_connections, errors)
    assert not left, f"left in reference cycles: {sorted(set(left))} ({len(left)} objects)"


@pytest.mark.parametrize("isolation", ["read_uncommitted", "read_committed"])
def test_java_console_consumer_from_beginning(stack: Endpoints, tiered: TieredTopic, isolation: str) -> None:
    """Kafka's own console consumer (Java client, fetch sessions, position validation) through the proxy
    reads every record from offset 0 once, keys and values as produced."""
    committed = isolation == "read_committed"
    want = {p: expected(tiered.by_partition[p], committed) for p in tiered.by_partition}
    with proxy_for(tiered.config, stack.bootstrap) as proxy:
        lines = console_consume(proxy_bootstrap(proxy), tiered.topic, sum(len(w) for w in want.values()), isolation)
    for p, records in want.items():
        got = [(offset, (key, value)) for partition, offset, key, value in lines if partition == p]
        check_exact(got, {o: (r[0], r[1]) for o, r in records.items()})


def test_kcat_reads_a_partition_from_the_beginning(stack: Endpoints, tiered: TieredTopic) -> None:
    """kcat (librdkafka's own C consumer) through the proxy: every record of partition 0 once, keys and
    values byte for byte (kcat's default isolation is read_committed)."""
    want = expected(tiered.by_partition[0], read_committed=True)
    with proxy_for(tiered.config, stack.bootstrap) as proxy:
        got = kcat_consume(proxy_bootstrap(proxy), tiered.topic, 0, len(want))
    check_exact([(o, (k, v)) for o, k, v in got], {o: (r[0], r[1]) for o, r in want.items()})


def test_a_proxy_started_before_any_sidecar_serves_what_is_tiered_later(stack: Endpoints, tmp_path: Path) -> None:
    """The proxy starts while the cluster has no tiering metadata yet; a sidecar then tiers a topic: a client
    reading from offset 0 through the proxy gets the remote part, not a reset to the broker's log start."""
    shared = {"prefix": f"it-{uuid.uuid4().hex[:8]}", "metadata_topic": f"__tiering_metadata_{uuid.uuid4().hex[:8]}"}
    (tmp_path / "proxy").mkdir()
    with (
        proxy_for(write_config(stack, tmp_path / "proxy", **shared), stack.bootstrap) as proxy,
        tiered_topic(stack, tmp_path, records=6_000, local_retention=64 * 1024, **shared) as t,
    ):
        got = read_all(proxy_bootstrap(proxy), t.topic, {0: t.end_offset(0)},
                       **{"isolation.level": "read_uncommitted"})[0]  # fmt: skip
        log_start = t.log_start(0)
    assert log_start > 0
    check_exact([(m.offset(), as_record(m)) for m in got], expected(t.produced, read_committed=False))


def test_mixed_fetches_stay_within_fetch_max_bytes(stack: Endpoints, tiered: TieredTopic) -> None:
    """librdkafka with fetch.max.bytes 64 KiB and receive.message.max.bytes 1.5 times that reads partition 0
    from remote and partition 1 from the broker in the same fetches: every answer stays within Kafka's limit
    (a larger one is 'Invalid response size' and a reconnect), and every record arrives once, byte for byte."""
    starts = {0: 0, 1: tiered.log_start(1)}
    ends = {p: tiered.end_offset(p) for p in starts}
    errors: list[str] = []
    with proxy_for(tiered.config, stack.bootstrap) as proxy:
        consumer = Consumer({"bootstrap.servers": proxy_bootstrap(proxy), "group.id": f"limits-{uuid.uuid4().hex}",
                             "enable.auto.commit": False, "fetch.max.bytes": 64 << 10, "message.max.bytes": 32 << 10,
                             "receive.message.max.bytes": 96 << 10, "isolation.level": "read_uncommitted",
                             "error_cb": lambda e: errors.append(e.str())})  # fmt: skip
        try:
            consumer.assign([TopicPartition(tiered.topic, p, o) for p, o in starts.items()])
            got: dict[int, list[Any]] = {p: [] for p in starts}
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline:
                for m in consumer.consume(1000, 1.0):
                    if m.error() is None:
                        got[m.partition()].append(m)
                    else:
                        errors.append(m.error().str())
                positions = consumer.position([TopicPartition(tiered.topic, p) for p in starts])
                if all(tp.offset >= ends[tp.partition] for tp in positions):
                    break
        finally:
            consumer.close()
        remote = proxy.metrics.fetch_partitions.labels("remote")._value.get()
    assert not errors, errors[:5]
    assert remote > 0, "nothing was answered from remote storage"
    for p, messages in got.items():
        want = {o: r for o, r in expected(tiered.by_partition[p], False).items() if o >= starts[p]}
        check_exact([(m.offset(), as_record(m)) for m in messages], want)


def test_a_mixed_fetch_answer_keeps_kafkas_max_bytes_rule(stack: Endpoints, tiered: TieredTopic) -> None:
    """A raw Fetch of partition 0 from offset 0 (remote) and partition 1 from its log start (broker) with
    max_bytes 64 KiB, twice on one connection (the second reads remote data ahead of the broker's answer): the
    answer's records stay within max_bytes, except when a single partition returns a single larger batch."""
    limit = 64 << 10
    with proxy_for(tiered.config, stack.bootstrap) as proxy, RawKafka(f"127.0.0.1:{proxy.router.port_for(1)}") as raw:
        topic_id = raw.metadata(tiered.topic).topics[0].topic_id
        assert raw.fetch_many(12, tiered.topic, topic_id, {0: tiered.log_start(0), 1: tiered.log_start(1)}, 1024)
        for _ in range(2):
            answer = raw.fetch_many(12, tiered.topic, topic_id, {0: 0, 1: tiered.log_start(1)}, limit)
            assert answer is not None and partition_errors(answer) == [0, 0]
            sizes = {int(p.partition_index): p.records or b"" for t in answer.responses for p in t.partitions}
            with_data = [r for r in sizes.values() if r]
            assert sizes[0], "nothing from remote"
            total = sum(len(r) for r in with_data)
            assert total <= limit or (len(with_data) == 1 and batch_count(with_data[0]) == 1), (
                f"{total} bytes of records in {len(with_data)} partitions for max_bytes {limit}"
            )
