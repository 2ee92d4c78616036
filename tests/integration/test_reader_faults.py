"""The TieredConsumer's bad input and faults on the real stack: below the remote start, a deleted or
corrupted object, the store down or throttling, download paused. Errors are events naming the object; never a
wrong record; reading resumes where it stopped."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlparse

import pytest
from click.testing import CliRunner
from confluent_kafka import Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient

from deploy.stack import Endpoints
from reader import RemoteReader, TieredConsumer, TieredMessage
from tests.conftest import create_topic, set_topic_config
from tests.fault_proxy import TcpProxy
from tests.reader_harness import TieredTopic, expected, tiered_topic
from tests.s3_fault_proxy import RESET, SLOW_DOWN, S3FaultProxy
from tests.sidecar_harness import wait_for
from tiering.cli.main import main

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def tiered(stack: Endpoints, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TieredTopic]:
    with tiered_topic(stack, tmp_path_factory.mktemp("reader-faults")) as t:
        yield t


def consumer(tiered: TieredTopic, reset: str = "error", **settings: Any) -> TieredConsumer:
    config = {"bootstrap.servers": tiered.ctx.settings.bootstrap_servers, "group.id": f"g-{uuid.uuid4().hex[:6]}",
              "auto.offset.reset": reset, "enable.auto.commit": False,
              "isolation.level": "read_uncommitted"}  # fmt: skip
    return TieredConsumer(config, tiered.reader_settings(**settings))


def read_until(c: TieredConsumer, stop_offset: int, timeout: float = 60) -> tuple[list[Any], list[Any]]:
    """(messages, error events) until an error arrives or ``stop_offset`` is delivered."""
    messages, errors = [], []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not errors:
        for m in c.consume(500, 0.5):
            (errors if m.error() is not None else messages).append(m)
        if messages and messages[-1].offset() >= stop_offset:
            break
    return messages, errors


def check_records(tiered: TieredTopic, messages: list[Any]) -> None:
    offsets = [m.offset() for m in messages]
    assert offsets == sorted(set(offsets))
    for m in messages:
        assert (m.key(), m.value(), list(m.headers() or [])) == tiered.produced[m.offset()]


def copy_keys(tiered: TieredTopic, index: int) -> tuple[int, int, str]:
    with RemoteReader.open(tiered.reader_settings(), [tiered.topic]) as reader:
        seg = reader.catalog.copies(tiered.topic, 0)[index]
        copy = reader.locate(tiered.topic, 0, seg.base_offset)
    assert copy.end_offset < tiered.log_start(), "the copy must be below the broker's log start"
    return copy.base_offset, copy.end_offset, copy.log_key


def test_a_corrupted_object_is_an_error_event_naming_the_key_never_wrong_records(tiered: TieredTopic) -> None:
    _, end, key = copy_keys(tiered, 2)
    store = tiered.ctx.store
    original = store.get_bytes(key)
    damaged = bytearray(original)
    damaged[len(damaged) // 3] ^= 0x55
    store.put_bytes(key, bytes(damaged))
    try:
        with consumer(tiered, fetch_window_bytes=64 * 1024) as c:
            c.assign([TopicPartition(tiered.topic, 0, 0)])
            messages, errors = read_until(c, end)
            check_records(tiered, messages)
            assert errors and errors[0].error().code() == KafkaError._BAD_MSG and key in errors[0].error().str()
            assert c.position([TopicPartition(tiered.topic, 0)])[0].offset <= end
            store.put_bytes(key, original)
            time.sleep(1.2)  # the partition retries after RETRY_SECONDS
            more, errors = read_until(c, end + 1)
            assert not errors
            check_records(tiered, messages + more)
            assert (messages + more)[-1].offset() >= end
    finally:
        store.put_bytes(key, original)


def test_a_deleted_object_is_an_error_event_naming_the_key(tiered: TieredTopic) -> None:
    base, end, key = copy_keys(tiered, 1)
    store = tiered.ctx.store
    original = store.get_bytes(key)
    store.delete([key])
    try:
        with consumer(tiered) as c:
            c.assign([TopicPartition(tiered.topic, 0, base)])
            messages, errors = read_until(c, end)
            assert not messages
            assert errors[0].error().code() == KafkaError.KAFKA_STORAGE_ERROR and key in errors[0].error().str()
            assert c.position([TopicPartition(tiered.topic, 0)])[0].offset == base
    finally:
        store.put_bytes(key, original)


def test_store_down_gives_bounded_retries_then_an_error_and_reading_resumes(tiered: TieredTopic,
                                                                           stack: Endpoints) -> None:  # fmt: skip
    target = urlparse(stack.s3.endpoint_url)
    proxy = TcpProxy(target.hostname or "127.0.0.1", target.port or 80)
    storage = tiered.reader_settings().remote_storage.model_copy(
        update={"endpoint_url": f"http://127.0.0.1:{proxy.port}"}
    )
    try:
        with consumer(tiered, remote_storage=storage.model_dump(), read_attempts=2, read_retry_backoff_seconds=0.1,
                      fetch_window_bytes=64 * 1024, prefetch_windows=0) as c:  # fmt: skip
            c.assign([TopicPartition(tiered.topic, 0, 0)])
            messages, _ = read_until(c, 500)
            proxy.cut()
            more, errors = read_until(c, 10**9, timeout=120)  # endless retries would end there with no error
            assert errors and errors[0].error().code() == KafkaError._TRANSPORT, errors
            assert "after 2 attempts" in errors[0].error().str()
            proxy.restore()
            ry = tiered.remote_end()
            rest, errors = read_until(c, ry)
            assert not errors
            check_records(tiered, messages + more + rest)
            assert (messages + more + rest)[-1].offset() >= ry
    finally:
        proxy.close()


def test_a_throttling_store_is_retried_and_every_offset_delivered_once(tiered: TieredTopic, stack: Endpoints) -> None:
    """Every distinct GET's answer cut mid-body, then 503 SlowDown twice: the presigned ranged GETs are retried
    (``read_attempts``: the 4th gets it), no error event, every offset of the topic delivered once, byte for byte."""
    with S3FaultProxy(stack.s3.endpoint_url) as proxy:
        storage = tiered.reader_settings().remote_storage.model_copy(update={"endpoint_url": proxy.endpoint_url})
        with consumer(tiered, remote_storage=storage.model_dump(), read_attempts=4, read_retry_backoff_seconds=0.01,
                      fetch_window_bytes=64 * 1024) as c:  # fmt: skip
            c.assign([TopicPartition(tiered.topic, 0, 0)])
            messages, errors = read_until(c, 100)  # the metadata is read and reading has begun
            proxy.throttle("GetObject", RESET, SLOW_DOWN, SLOW_DOWN)
            more, more_errors = read_until(c, max(tiered.produced), timeout=240)
        assert not errors and not more_errors, (errors + more_errors)[0].error()
        check_records(tiered, messages + more)
        assert [m.offset() for m in messages + more] == sorted(tiered.produced), "offsets skipped or repeated"
        assert proxy.injected[("GetObject", SLOW_DOWN.name)] >= 2 * proxy.injected[("GetObject", RESET.name)] >= 20
        assert proxy.presigned["GetObject"] >= 30, "the ranged GETs did not go through SigV4 presigned URLs"


def test_pause_download_stops_remote_reads_until_resumed(tiered: TieredTopic) -> None:
    cli = CliRunner()
    paused = cli.invoke(main, ["topic", "pause-download", tiered.topic, "--config", str(tiered.config)])
    assert paused.exit_code == 0, paused.output
    try:
        with consumer(tiered) as c:
            c.assign([TopicPartition(tiered.topic, 0, 0)])
            got = []
            deadline = time.monotonic() + 4
            while time.monotonic() < deadline:
                got += c.consume(100, 0.5)
            assert got == [], "remote records delivered while download is paused"
            resumed = cli.invoke(main, ["topic", "resume-download", tiered.topic, "--config", str(tiered.config)])
            assert resumed.exit_code == 0, resumed.output
            messages, errors = read_until(c, 100, timeout=30)
            assert not errors and messages[0].offset() == 0 and isinstance(messages[0], TieredMessage)
    finally:
        cli.invoke(main, ["topic", "resume-download", tiered.topic, "--config", str(tiered.config)])


def test_offset_below_the_remote_start_is_out_of_range_like_the_broker(tiered: TieredTopic, stack: Endpoints) -> None:
    # the broker's own answer for an offset below its log start, on a topic without tiering
    plain_topic = create_topic(stack.bootstrap)
    admin = AdminClient({"bootstrap.servers": stack.bootstrap})
    from tests.sidecar_harness import produce_mixed

    produce_mixed(stack.bootstrap, plain_topic, 100)
    (done,) = admin.delete_records([TopicPartition(plain_topic, 0, 50)]).values()
    done.result(30)
    plain = Consumer({"bootstrap.servers": stack.bootstrap, "group.id": f"g-{uuid.uuid4().hex[:6]}",
                      "auto.offset.reset": "error"})  # fmt: skip
    plain.assign([TopicPartition(plain_topic, 0, 10)])
    broker_errors: list[Any] = []
    deadline = time.monotonic() + 30
    while not broker_errors and time.monotonic() < deadline:
        broker_errors = [m for m in plain.consume(10, 0.5) if m.error() is not None]
    plain.close()

    set_topic_config(stack.bootstrap, tiered.topic, retention_bytes=400 * 1024)  # total retention expires remote data
    with RemoteReader.open(tiered.reader_settings(), [tiered.topic]) as reader:
        wait_for(lambda: (reader.catalog.remote_offsets(tiered.topic, 0)[0] or 0) > 0, 120, "remote copies to expire")
        rx = reader.catalog.remote_offsets(tiered.topic, 0)[0]
    with consumer(tiered) as c:
        c.assign([TopicPartition(tiered.topic, 0, 0)])
        messages, errors = read_until(c, 0)
        assert not messages and errors
        assert errors[0].error().code() == broker_errors[0].error().code() == KafkaError._AUTO_OFFSET_RESET
        assert "Offset out of range" in errors[0].error().str()
    with consumer(tiered, reset="earliest") as c:
        c.assign([TopicPartition(tiered.topic, 0, 0)])
        messages, errors = read_until(c, rx)
        # retention keeps expiring meanwhile: the start is the remote start of that moment, a copy's base
        assert not errors and messages[0].offset() >= rx and isinstance(messages[0], TieredMessage)
        check_records(tiered, [m for m in messages if m.offset() in expected(tiered.produced, False)])
