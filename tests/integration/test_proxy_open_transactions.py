"""read_committed through the proxy when a transaction begun in the remote part has its marker only on the
broker: two transactions (one aborted, one committed) stay open while other producers' records roll several
segments, then end, so their markers land in the broker's active segment, which is never uploaded. The sidecar
tiers the segments before it and local retention deletes them: the transactions' records are remote only,
their outcomes local only. Kafka's own consumer and librdkafka read from offset 0 with read_committed and get
every record of the committed transaction and none of the aborted one, without waiting for that segment to
roll and be uploaded (days with the default segment.ms)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner
from confluent_kafka import Producer

from deploy.stack import Endpoints
from tests.conftest import create_topic
from tests.proxy_harness import check_exact, console_consume, proxy_bootstrap, proxy_for, read_all
from tests.reader_harness import running_sidecar
from tests.sidecar_harness import wait_for, write_config
from tiering.cli.main import main

pytestmark = pytest.mark.integration
SEGMENT = 64 * 1024


@dataclass
class OpenAcrossTiering:
    topic: str
    config: Path
    produced: dict[int, tuple[bytes, bytes]]  # offset -> (key, value), the aborted transaction's included
    aborted: set[int]  # the aborted transaction's offsets
    end: int  # the partition's end offset (markers included)


def _produce(producer: Producer, topic: str, produced: dict[int, tuple[bytes, bytes]], key: bytes, n: int,
             size: int = 200) -> None:  # fmt: skip
    def report(err: object, msg: object) -> None:
        assert err is None, f"delivery failed: {err}"
        produced[msg.offset()] = (msg.key(), msg.value())  # type: ignore[attr-defined]

    for i in range(n):
        value = f"{key.decode()}-{i}-".encode().ljust(size, b"x")
        producer.produce(topic, key=key, value=value, partition=0, on_delivery=report)
        producer.poll(0)


@pytest.fixture(scope="module")
def tiered(stack: Endpoints, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpenAcrossTiering]:
    topic = create_topic(stack.bootstrap, 1, internal_segment_bytes=SEGMENT)
    produced: dict[int, tuple[bytes, bytes]] = {}
    plain = Producer({"bootstrap.servers": stack.bootstrap, "linger.ms": 5, "batch.size": 16384})
    txns = {}
    for outcome in ("abort", "commit"):
        txns[outcome] = Producer({"bootstrap.servers": stack.bootstrap, "linger.ms": 5,
                                  "transactional.id": f"open-{outcome}-{uuid.uuid4().hex[:6]}"})  # fmt: skip
        txns[outcome].init_transactions(30)
        txns[outcome].begin_transaction()
    for _ in range(4):  # the transactions' records spread over several segments, other records between
        for outcome, producer in txns.items():
            _produce(producer, topic, produced, f"txn-{outcome}".encode(), 50)
            producer.flush(30)
        _produce(plain, topic, produced, b"plain", 400)
        assert plain.flush(30) == 0
    # two more segments of other records: local retention by bytes releases the last transactional record's
    # segment only when what follows it is at least local.retention.bytes (one segment), and where the segments
    # roll depends on the batches, so 400 records alone sometimes left that segment local for good
    _produce(plain, topic, produced, b"plain", 2 * SEGMENT // 200)
    assert plain.flush(30) == 0
    txn_offsets = {o for o, (k, _) in produced.items() if k.startswith(b"txn-")}
    aborted = {o for o, (k, _) in produced.items() if k == b"txn-abort"}
    txns["abort"].abort_transaction(30)
    txns["commit"].commit_transaction(30)
    _produce(plain, topic, produced, b"after", 20)  # beside the markers, in the active segment
    assert plain.flush(30) == 0
    config = write_config(stack, tmp_path_factory.mktemp("open-txns"))
    result = CliRunner().invoke(main, ["topic", "enable", topic, "--local-retention-bytes", str(SEGMENT),
                                       "--config", str(config)])  # fmt: skip
    assert result.exit_code == 0, result.output
    with running_sidecar(config) as (ctx, _sidecar):

        def log_start() -> int:
            return ctx.cluster.local_offsets([(topic, 0)])[(topic, 0)].lx

        wait_for(lambda: log_start() > max(txn_offsets), 300, "the transactions' records to be remote only")
        offsets = ctx.cluster.local_offsets([(topic, 0)])[(topic, 0)]
        end = offsets.lz
        # the markers (and the records after them) are the broker's only: its active segment is never uploaded
        assert offsets.lx <= max(produced) and len(produced) + 2 == end, (offsets, len(produced))
        yield OpenAcrossTiering(topic, config, produced, aborted, end)


def test_librdkafka_read_committed_gets_the_committed_transaction_and_not_the_aborted_one(
    stack: Endpoints, tiered: OpenAcrossTiering
) -> None:
    want = {o: r for o, r in tiered.produced.items() if o not in tiered.aborted}
    with proxy_for(tiered.config, stack.bootstrap) as proxy:
        got = read_all(proxy_bootstrap(proxy), tiered.topic, {0: tiered.end}, timeout=90,
                       **{"isolation.level": "read_committed"})[0]  # fmt: skip
    check_exact([(m.offset(), (m.key(), m.value())) for m in got], want)


def test_kafka_console_consumer_read_committed_gets_the_same(stack: Endpoints, tiered: OpenAcrossTiering) -> None:
    want = {o: r for o, r in tiered.produced.items() if o not in tiered.aborted}
    with proxy_for(tiered.config, stack.bootstrap) as proxy:
        lines = console_consume(proxy_bootstrap(proxy), tiered.topic, len(want), isolation="read_committed",
                                timeout_ms=60_000)  # fmt: skip
    assert [offset for _, offset, _, _ in lines] == sorted(want)
    assert all((key, value) == want[offset] for _, offset, key, value in lines)
