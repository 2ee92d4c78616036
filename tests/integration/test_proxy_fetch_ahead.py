"""Fetch ahead (``reader/proxy/fetch_ahead.py``) on the real stack: the next Fetch of a client that reads on is asked
of the broker before the client sends it, and the client gets that answer only when its Fetch is the one predicted.
Readers we did not write (kcat, Kafka's Java console consumer) and four confluent-kafka consumers of 24 partitions
read every record byte for byte with no offset missing; held answers are served to single-partition catch-ups
(the metric shows it, under a max age no load reaches: ``UNHURRIED``); a consumer that seeks back in the middle of a
catch-up (its Fetch is not the one predicted) gets exactly the records at its new offset, and so does one behind a
proxy whose held answers would always be too old (none is served); a client that asks for a held answer after the
max age gets the broker's own answer."""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from deploy.stack import Endpoints
from reader.proxy import ProxyServer
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
from tests.sidecar_harness import write_config

pytestmark = pytest.mark.integration
PARTITIONS = 24
Produced = dict[int, dict[int, tuple]]


@pytest.fixture(scope="module")
def many(stack: Endpoints) -> Iterator[tuple[str, Produced]]:
    """24 partitions of about 1,200 binary records each (0-3 KiB, lz4)."""
    yield random_topic(stack.bootstrap, PARTITIONS, 1_200)


@pytest.fixture(scope="module")
def one(stack: Endpoints) -> Iterator[tuple[str, Produced]]:
    """One partition of 6,000 binary records (about 9 MB: a catch-up of several full answers)."""
    yield random_topic(stack.bootstrap, 1, 6_000)


def _outcomes(proxy: ProxyServer) -> dict[str, float]:
    counter = proxy.metrics.fetch_ahead
    return {o: counter.labels(o)._value.get() for o in ("served", "missed", "stale", "unusable")}


def test_consumers_of_many_partitions_and_kcat_read_byte_for_byte_with_fetch_ahead_on(
    stack: Endpoints, tmp_path: Path, many: tuple[str, Produced], one: tuple[str, Produced]
) -> None:
    topic, produced = many
    single, single_produced = one
    ends = {p: max(records) + 1 for p, records in produced.items()}
    config = write_config(stack, tmp_path, broker=1)
    with proxy_for(config, stack.bootstrap, fetch_ahead_max_age_seconds=UNHURRIED) as proxy:
        bootstrap = proxy_bootstrap(proxy)
        with ThreadPoolExecutor(6) as pool:
            readers = [pool.submit(read_all, bootstrap, topic, ends) for _ in range(4)]
            by_kcat = pool.submit(kcat_consume, bootstrap, topic, 5, ends[5])
            single_kcat = pool.submit(kcat_consume, bootstrap, single, 0, len(single_produced[0]))
            for reader in readers:
                for p, messages in reader.result().items():
                    check_exact([(m.offset(), (m.key(), m.value(), list(m.headers() or []))) for m in messages],
                                produced[p])  # fmt: skip
            check_exact([(offset, (key, value, [])) for offset, key, value in by_kcat.result()], produced[5])
            check_exact([(o, (k, v, [])) for o, k, v in single_kcat.result()], single_produced[0])
        outcomes = _outcomes(proxy)
    print("fetch ahead:", outcomes)
    # How many of these readers' Fetches are asked ahead depends on the machine's timing (consumers of 24 partitions
    # change their Fetches as their queues fill; 2-10 answers were served in local runs, none in one CI run): that
    # held answers are served is asserted where the next Fetch is predictable, by the single-partition catch-ups
    # below (Kafka's console consumer, the consumer that seeks back).


def test_the_java_console_consumer_reads_every_record_with_fetches_asked_ahead(
    stack: Endpoints, tmp_path: Path
) -> None:
    """Kafka's own consumer (fetch sessions asked for, declined by the proxy) gets each record at its offset (text
    records: the console consumer prints them as lines)."""
    topic, produced = random_topic(stack.bootstrap, 1, 6_000, text=True)
    config = write_config(stack, tmp_path, broker=1)
    with proxy_for(config, stack.bootstrap, fetch_ahead_max_age_seconds=UNHURRIED) as proxy:
        got = console_consume(proxy_bootstrap(proxy), topic, len(produced[0]))
        outcomes = _outcomes(proxy)
    print("fetch ahead:", outcomes)
    assert got == [(0, o, produced[0][o][0], produced[0][o][1]) for o in sorted(produced[0])]
    assert outcomes["served"] > 0, outcomes


@pytest.mark.parametrize("max_age", [UNHURRIED, 1e-6], ids=["unhurried", "always-too-old"])
def test_a_consumer_that_seeks_back_mid_catch_up_gets_the_records_at_its_new_offset(
    stack: Endpoints, tmp_path: Path, one: tuple[str, Produced], max_age: float
) -> None:
    topic, produced = one
    records = produced[0]
    end = max(records) + 1
    with proxy_for(write_config(stack, tmp_path, broker=1), stack.bootstrap,
                   fetch_ahead_max_age_seconds=max_age) as proxy:  # fmt: skip
        consumer = Consumer({"bootstrap.servers": proxy_bootstrap(proxy), "group.id": f"seek-{tmp_path.name}",
                             "enable.auto.commit": False, "fetch.max.bytes": 256 * 1024,
                             "message.max.bytes": 256 * 1024, "max.partition.fetch.bytes": 256 * 1024})  # fmt: skip
        got: list[tuple[int, tuple]] = []
        seek_at = 0
        try:
            consumer.assign([TopicPartition(topic, 0, 0)])
            sought = False
            while not got or got[-1][0] < end - 1:
                for m in consumer.consume(200, 1.0):
                    assert m.error() is None, m.error()
                    got.append((m.offset(), (m.key(), m.value(), list(m.headers() or []))))
                if not sought and got and got[-1][0] >= end // 2:
                    consumer.seek(TopicPartition(topic, 0, end // 4))  # the Fetch asked ahead is not the next one
                    sought = True
                    seek_at = len(got)
        finally:
            consumer.close()
        outcomes = _outcomes(proxy)
    print("fetch ahead:", outcomes)
    before, after = got[:seek_at], got[seek_at:]
    check_exact(before, {o: r for o, r in records.items() if o <= before[-1][0]})
    check_exact(after, {o: r for o, r in records.items() if o >= end // 4})  # from the offset sought, nothing else
    if max_age < 1e-3:  # nothing young enough to serve: none served (and, the client always late, none asked)
        assert outcomes["served"] == 0, outcomes
    else:
        assert outcomes["served"] > 0, outcomes


def _after_last_batch(records: bytes) -> int:
    """The offset after the last whole record batch (base offset + last offset delta + 1), read by hand."""
    pos, end = 0, -1
    while pos + 61 <= len(records):
        base, length = struct.unpack_from(">qi", records, pos)
        if pos + 12 + length > len(records):
            break
        end = base + struct.unpack_from(">i", records, pos + 23)[0] + 1
        pos += 12 + length
    return end


def test_an_answer_held_too_long_is_dropped_and_that_fetch_is_the_brokers_own(
    stack: Endpoints, tmp_path: Path, one: tuple[str, Produced]
) -> None:
    """A client that reads on at once is served the answer asked ahead; one that asks for it after more than the
    max age gets the broker's answer to its own request instead (the held one dropped), and every answer is byte
    for byte what the broker gives straight at that offset."""
    topic, _ = one
    with (
        proxy_for(write_config(stack, tmp_path, broker=1), stack.bootstrap, fetch_ahead_max_age_seconds=3.0) as proxy,
        RawKafka(f"127.0.0.1:{proxy.router.port_for(1)}") as through,
        RawKafka(stack.bootstrap) as straight,
    ):
        described = through.metadata(topic)
        assert described is not None
        topic_id, offset = described.topics[0].topic_id, 0
        for pause in (0, 0, 7.0, 0):  # far from the max age either way, on a loaded machine too
            time.sleep(pause)
            got = through.fetch(13, topic, topic_id, 0, offset, 64 * 1024)
            want = straight.fetch(13, topic, topic_id, 0, offset, 64 * 1024)
            assert got is not None and want is not None
            records = got.responses[0].partitions[0].records
            assert records and records == want.responses[0].partitions[0].records
            offset = _after_last_batch(records)
        outcomes = _outcomes(proxy)
    assert outcomes == {"served": 1, "missed": 0, "stale": 1, "unusable": 0}, outcomes
