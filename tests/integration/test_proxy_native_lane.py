"""The native lane (``reader/proxy/lane.py``, ``native/src/fetch_lane.rs``) on the real stack: a client reading the
broker's partitions whose Fetch claims an answer asked ahead is served by the compiled module until it asks something
else. Readers we did not write (kcat, Kafka's Java console consumer) and four confluent-kafka consumers of 24
partitions read every record byte for byte with no offset missing while lanes run (the metrics show they did); a raw
client's Metadata request in the middle of a lane is given back to the event loop and answered, and its Fetch
requests after it are the broker's answers byte for byte; a client that closes in the middle of a lane, and a proxy
stopped under one, end cleanly."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from deploy.stack import Endpoints
from reader.proxy import ProxyServer
from tests.integration.test_proxy_fetch_ahead import PARTITIONS, _after_last_batch
from tests.kafka_wire import RawKafka
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
from tests.sidecar_harness import wait_for, write_config

pytestmark = pytest.mark.integration


def _runs(proxy: ProxyServer) -> dict[str, float]:
    counter = proxy.metrics.native_lane
    outcomes = ("again", "request", "done", "closed", "idle", "failed", "stopped")
    return {o: counter.labels(o)._value.get() for o in outcomes}


def _served(proxy: ProxyServer) -> float:
    return proxy.metrics.fetch_ahead.labels("served")._value.get()


def test_readers_we_did_not_write_and_consumers_of_many_partitions_read_byte_for_byte_on_lanes(
    stack: Endpoints, tmp_path: Path
) -> None:
    topic, produced = random_topic(stack.bootstrap, PARTITIONS, 1_200)
    single, single_produced = random_topic(stack.bootstrap, 1, 6_000, text=True)
    ends = {p: max(records) + 1 for p, records in produced.items()}
    config = write_config(stack, tmp_path, broker=1)
    with proxy_for(config, stack.bootstrap, fetch_ahead_max_age_seconds=UNHURRIED) as proxy:
        assert proxy.lanes is not None, "the compiled module has no native lane"
        bootstrap = proxy_bootstrap(proxy)
        with ThreadPoolExecutor(6) as pool:
            readers = [pool.submit(read_all, bootstrap, topic, ends) for _ in range(4)]
            by_kcat = pool.submit(kcat_consume, bootstrap, single, 0, len(single_produced[0]))
            by_java = pool.submit(console_consume, bootstrap, single, len(single_produced[0]))
            for reader in readers:
                for p, messages in reader.result().items():
                    check_exact([(m.offset(), (m.key(), m.value(), list(m.headers() or []))) for m in messages],
                                produced[p])  # fmt: skip
            records = single_produced[0]
            check_exact([(o, (k, v, [])) for o, k, v in by_kcat.result()], records)
            assert by_java.result() == [(0, o, records[o][0], records[o][1]) for o in sorted(records)]
        runs, served = _runs(proxy), _served(proxy)
    print("native lane runs:", runs, "answers asked ahead and served:", served)
    assert sum(runs.values()) > 0 and served > 0, (runs, served)
    assert runs["failed"] == 0, runs


def _read_on(through: RawKafka, straight: RawKafka, topic: str, topic_id: object, steps: int, offset: int = 0) -> int:
    """Fetch after Fetch where the last answer ended (the one predicted: the cycle goes to a lane), each answer the
    broker's own at that offset; the offset after the last."""
    for step in range(steps):
        got = through.fetch(13, topic, topic_id, 0, offset, 16 * 1024)  # type: ignore[arg-type]
        want = straight.fetch(13, topic, topic_id, 0, offset, 16 * 1024)  # type: ignore[arg-type]
        assert got is not None and want is not None
        records = got.responses[0].partitions[0].records
        assert records and records == want.responses[0].partitions[0].records, f"step {step}, offset {offset}"
        offset = _after_last_batch(records)
    return offset


def test_a_request_in_the_middle_of_a_lane_is_answered_and_the_fetches_after_it_are_the_brokers(
    stack: Endpoints, tmp_path: Path
) -> None:
    """A raw client reads on (each Fetch where the last answer's last batch ended: the one predicted), so its cycle
    goes to a lane; a Metadata request in the middle is given back and answered as the broker answers it, and every
    Fetch answer before and after it is byte for byte the broker's own at that offset."""
    topic, _ = random_topic(stack.bootstrap, 1, 20_000)
    with (
        proxy_for(
            write_config(stack, tmp_path, broker=1), stack.bootstrap, fetch_ahead_max_age_seconds=UNHURRIED
        ) as proxy,  # fmt: skip
        RawKafka(f"127.0.0.1:{proxy.router.port_for(1)}") as through,
        RawKafka(stack.bootstrap) as straight,
    ):
        described = through.metadata(topic)
        assert described is not None
        topic_id = described.topics[0].topic_id
        offset = _read_on(through, straight, topic, topic_id, 6)
        again = through.metadata(topic)
        assert again is not None and again.topics[0].topic_id == topic_id
        assert [b.port for b in again.brokers] == [proxy.router.port_for(1)]
        _read_on(through, straight, topic, topic_id, 6, offset)
        runs = _runs(proxy)
    print("native lane runs:", runs)
    assert runs["request"] >= 1, runs  # the Metadata request came back from a lane
    assert runs["failed"] == 0, runs


def test_a_client_closing_and_a_proxy_stopping_in_the_middle_of_lanes_end_cleanly(
    stack: Endpoints, tmp_path: Path
) -> None:
    """A client that closes while its lane waits for its next Fetch ends that lane (closed), its thread free again,
    and the proxy goes on serving; a proxy stopped while a lane waits stops it and closes within seconds."""
    topic, _ = random_topic(stack.bootstrap, 1, 20_000)
    config = write_config(stack, tmp_path, broker=1)
    with RawKafka(stack.bootstrap) as straight:
        with proxy_for(config, stack.bootstrap, fetch_ahead_max_age_seconds=UNHURRIED) as proxy:
            lanes = proxy.lanes
            assert lanes is not None
            threads = proxy.settings.proxy.native_lanes
            port = f"127.0.0.1:{proxy.router.port_for(1)}"
            with RawKafka(port) as through:
                described = through.metadata(topic)
                assert described is not None
                topic_id = described.topics[0].topic_id
                _read_on(through, straight, topic, topic_id, 5)
                wait_for(lambda: lanes.free < threads, 60, "a lane running")
            wait_for(lambda: lanes.free == threads, 10, "the lane ended with its client")
            assert _runs(proxy)["closed"] == 1, _runs(proxy)
            second = RawKafka(port)
            _read_on(second, straight, topic, topic_id, 5)  # the proxy goes on serving, on a lane again
            wait_for(lambda: lanes.free < threads, 60, "a second lane running")
            began = time.monotonic()
        stopped = time.monotonic() - began
        second.close()
    assert stopped < 10, f"the proxy took {stopped:.1f}s to stop under a lane"
    print("native lane runs:", _runs(proxy))
    assert _runs(proxy)["failed"] == 0
