"""The remote lane (``reader/proxy/remote_lane.py``, ``native/src/remote_lane.rs``) on the real stack: clients catching
up from remote storage through the proxy are served by the compiled module while their Fetch requests are the ones
predicted, and read every record byte for byte with no offset missing, across aborted and committed transactions
(read_committed answers carry the aborted transactions the read core found) and across the remote end, where the
lane hands the connection back and the broker serves the rest. Readers we did not write (kcat, Kafka's Java console
consumer) and confluent-kafka consumers of several partitions, at both isolation levels; the metrics show lanes ran
and none failed."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from deploy.stack import Endpoints
from reader.proxy import ProxyServer
from tests.integration.test_proxy_fetch import as_record
from tests.proxy_harness import (
    UNHURRIED,
    check_exact,
    console_consume,
    kcat_consume,
    proxy_bootstrap,
    proxy_for,
    read_all,
)
from tests.reader_harness import TieredTopic, expected, tiered_topic

pytestmark = pytest.mark.integration
OUTCOMES = ("again", "request", "done", "closed", "idle", "failed", "stopped")
SMALL = 4 * 1024  # the readers' partition fetch size: a catch-up of many answers per partition, as a large topic's


@pytest.fixture(scope="module")
def tiered(stack: Endpoints, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TieredTopic]:
    """Two partitions of 30,000 mixed records each (every codec, a committed and an aborted transaction), all but
    the last 256 KiB of each in remote storage."""
    with tiered_topic(stack, tmp_path_factory.mktemp("remote-lane"), records=30_000, partitions=2) as t:
        yield t


def _runs(proxy: ProxyServer) -> dict[str, float]:
    counter = proxy.metrics.remote_lane
    return {o: counter.labels(o)._value.get() for o in OUTCOMES}


@pytest.mark.parametrize("isolation", ["read_uncommitted", "read_committed"])
def test_consumers_of_several_partitions_read_byte_for_byte_on_remote_lanes(
    stack: Endpoints, tiered: TieredTopic, isolation: str
) -> None:
    ends = {p: tiered.end_offset(p) for p in tiered.by_partition}
    assert all(tiered.log_start(p) > 0 for p in ends)
    committed = isolation == "read_committed"
    with proxy_for(tiered.config, stack.bootstrap, fetch_ahead_max_age_seconds=UNHURRIED) as proxy:
        assert proxy.remote_lanes, "the compiled module has no remote lane"
        with ThreadPoolExecutor(2) as pool:
            readers = [pool.submit(read_all, proxy_bootstrap(proxy), tiered.topic, ends,
                                   **{"isolation.level": isolation, "max.partition.fetch.bytes": SMALL})
                       for _ in range(2)]  # fmt: skip
            results = [reader.result() for reader in readers]
        runs = _runs(proxy)
        remote = proxy.metrics.fetch_partitions.labels("remote")._value.get()
    for got in results:
        for p, messages in got.items():
            check_exact([(m.offset(), as_record(m)) for m in messages], expected(tiered.by_partition[p], committed))
    assert remote > 0, "nothing was answered from remote storage"
    assert runs["again"] + runs["done"] + runs["request"] > 0, f"no remote lane ran: {runs}"
    assert runs["failed"] == 0, runs


def test_kcat_and_the_java_console_consumer_read_byte_for_byte_while_remote_lanes_run(
    stack: Endpoints, tiered: TieredTopic
) -> None:
    """kcat (librdkafka, read_committed by default) reads partition 0, the Java console consumer (fetch sessions,
    read_uncommitted) the whole topic, at once through one proxy. The lane runs are counted for the proxy, not per
    client: that at least one of the two was served on a lane is what the metrics show."""
    kcat_want = expected(tiered.by_partition[0], read_committed=True)
    java_want = {p: expected(tiered.by_partition[p], False) for p in tiered.by_partition}
    with proxy_for(tiered.config, stack.bootstrap, fetch_ahead_max_age_seconds=UNHURRIED) as proxy:
        bootstrap = proxy_bootstrap(proxy)
        with ThreadPoolExecutor(2) as pool:
            by_kcat = pool.submit(kcat_consume, bootstrap, tiered.topic, 0, len(kcat_want),
                                  ("-X", f"fetch.message.max.bytes={SMALL}"))  # fmt: skip
            by_java = pool.submit(console_consume, bootstrap, tiered.topic, sum(len(w) for w in java_want.values()),
                                  extra=("--consumer-property", f"max.partition.fetch.bytes={SMALL}"))  # fmt: skip
            kcat_got: list[Any] = by_kcat.result()
            lines = by_java.result()
        runs = _runs(proxy)
    check_exact([(o, (k, v)) for o, k, v in kcat_got], {o: (r[0], r[1]) for o, r in kcat_want.items()})
    for p, records in java_want.items():
        got = [(offset, (key, value)) for partition, offset, key, value in lines if partition == p]
        check_exact(got, {o: (r[0], r[1]) for o, r in records.items()})
    assert runs["again"] + runs["done"] + runs["request"] > 0, f"no remote lane ran: {runs}"
    assert runs["failed"] == 0, runs
