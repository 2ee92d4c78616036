"""The proxy on the real stack: Kafka clients read a tiered topic from offset 0, remote and broker parts."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deploy.stack import Endpoints
from tests.proxy_harness import check_exact, console_consume, kcat_consume, proxy_bootstrap, proxy_for, read_all
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
    remote / broker boundary; the remote part came from remote storage."""
    ends = {p: tiered.end_offset(p) for p in tiered.by_partition}
    assert all(tiered.log_start(p) > 0 for p in ends)
    with proxy_for(tiered.config, stack.bootstrap) as proxy:
        got = read_all(proxy_bootstrap(proxy), tiered.topic, ends, **{"isolation.level": isolation})
        remote = proxy.metrics.fetch_partitions.labels("remote")._value.get()
    committed = isolation == "read_committed"
    for p, messages in got.items():
        check_exact([(m.offset(), as_record(m)) for m in messages], expected(tiered.by_partition[p], committed))
    assert remote > 0, "nothing was answered from remote storage"


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
