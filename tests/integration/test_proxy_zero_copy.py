"""Pass-through Fetch answers moved from the broker's socket to the client's through a kernel pipe as they arrive
(``reader/proxy/splice.py``), on the real stack at production shape: a topic of 24 partitions of binary records
read at once by four confluent-kafka consumers and by kcat, every record byte for byte, no offset missing; with
the default pipes, with one pipe for the whole proxy (answers that find none are buffered) and with zero copy
turned off; and an offset the broker no longer has, rewritten in place and then served from remote."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from deploy.stack import Endpoints
from tests.kafka_wire import RawKafka, batch_count, partition_errors
from tests.proxy_harness import check_exact, kcat_consume, proxy_bootstrap, proxy_for, random_topic, read_all
from tests.reader_harness import tiered_topic
from tests.sidecar_harness import wait_for, write_config

pytestmark = pytest.mark.integration
PARTITIONS = 24


@pytest.fixture(scope="module")
def local_topic(stack: Endpoints) -> Iterator[tuple[str, dict[int, dict[int, tuple]]]]:
    """A topic of 24 partitions, about 1,200 records of 0-3 KiB of random bytes each (every byte value, lz4),
    nothing tiered; the records by partition and offset."""
    yield random_topic(stack.bootstrap, PARTITIONS, 1_200)


@pytest.mark.parametrize("listen", [{}, {"zero_copy_pipes": 1}, {"zero_copy": False}], ids=["pipes", "one-pipe", "off"])
def test_many_consumers_read_every_partition_byte_for_byte_through_the_pipes(
    stack: Endpoints, tmp_path: Path, local_topic: tuple[str, dict[int, dict[int, tuple]]], listen: dict
) -> None:
    topic, produced = local_topic
    ends = {p: max(records) + 1 for p, records in produced.items()}
    config = write_config(stack, tmp_path, broker=1)
    with proxy_for(config, stack.bootstrap, fetch_ahead=False, **listen) as proxy:  # answers read whole: not spliced
        bootstrap = proxy_bootstrap(proxy)
        with ThreadPoolExecutor(5) as pool:
            readers = [pool.submit(read_all, bootstrap, topic, ends) for _ in range(4)]
            partition = 5
            by_kcat = pool.submit(kcat_consume, bootstrap, topic, partition, ends[partition])
            for reader in readers:
                got = reader.result()
                for p, messages in got.items():
                    check_exact([(m.offset(), (m.key(), m.value(), list(m.headers() or []))) for m in messages],
                                produced[p])  # fmt: skip
            check_exact([(offset, (key, value, [])) for offset, key, value in by_kcat.result()], produced[partition])
        outcomes = {o: proxy.metrics.zero_copy.labels(o)._value.get() for o in ("spliced", "changed", "buffered")}
    if listen.get("zero_copy", True):
        assert outcomes["spliced"] > 0, outcomes
    else:
        assert outcomes == {"spliced": 0, "changed": 0, "buffered": 0}


@pytest.mark.parametrize("version", [12, 13])
def test_an_offset_the_broker_no_longer_has_is_answered_in_place_then_from_remote(
    stack: Endpoints, tmp_path: Path, version: int
) -> None:
    """A fresh proxy does not know the broker's log start yet, so a Fetch at offset 0 of a tiered topic goes to the
    broker, which answers OFFSET_OUT_OF_RANGE. The answer goes on as it arrives, so that partition is rewritten in
    place: NONE, no records, the broker's high watermark and the remote start as log start; the client (which
    resets nothing) asks again and gets offset 0 from remote storage."""
    with tiered_topic(stack, tmp_path, records=6_000, local_retention=64 * 1024) as t:
        end, log_start = t.end_offset(0), t.log_start(0)
        assert log_start > 0
        with (
            proxy_for(t.config, stack.bootstrap, fetch_ahead=False) as proxy,  # answers read whole are not spliced
            RawKafka(f"127.0.0.1:{proxy.router.port_for(1)}") as raw,
        ):
            topic_id = raw.metadata(t.topic).topics[0].topic_id
            first = raw.fetch(version, t.topic, topic_id, 0, 0)
            assert first is not None
            partition = first.responses[0].partitions[0]
            assert int(partition.error_code) == 0 and not partition.records
            assert (int(partition.high_watermark), int(partition.log_start_offset)) == (end, 0)
            changed = proxy.metrics.zero_copy.labels("changed")  # counted once the answer is out: wait for it
            wait_for(lambda: changed._value.get() == 1, 10, "the answer counted as changed in place")
            second = raw.fetch(version, t.topic, topic_id, 0, 0)
            assert second is not None and partition_errors(second) == [0]
            records = second.responses[0].partitions[0].records
            assert batch_count(records) > 0 and int.from_bytes(records[:8], "big") == 0  # the first batch's base
