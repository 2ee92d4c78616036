"""Client fetch quotas through the proxy on the real stack: remote bytes count against the quota set with
kafka-configs on the running broker, as the broker's own would (reader/proxy/quotas.py).

A topic of about 40 MB in 16 KiB records is tiered; librdkafka consumers read its remote part from offset 0
through the proxy over and over (back to 0 at the remote end). With ``consumer_byte_rate`` 5 MB/s on one
client id, that client gets 5 MB/s, measured from its side over three whole quota windows from before its
first fetch (33 s of Kafka's 11 samples of 1 s). Within that span Kafka's rate lets the bytes come in bursts
of about a window's worth (55 MB) each time the oldest sample expires, 11 s or more apart, the first at the
first fetch: a span starting at the first bytes instead can end just after a fourth burst began and count up to
a third too much, or miss part of the first and count too little, so the span starts when the client does.
A second client without a quota reads at the same time, unthrottled and far faster. Before any quota is set,
no answer is throttled.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from click.testing import CliRunner
from confluent_kafka import Consumer, Producer, TopicPartition

from deploy.kafka import run_kafka_tool
from deploy.stack import Endpoints
from reader.proxy import ProxyServer
from tests.conftest import create_topic
from tests.kafka_wire import RawKafka, record_bytes
from tests.proxy_harness import UNHURRIED, proxy_bootstrap, proxy_for
from tests.reader_harness import running_sidecar
from tests.sidecar_harness import wait_for, write_config
from tiering.cli.main import main

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # a rate measured over 33 s
QUOTA = 5_000_000  # bytes/s, as kafka-configs takes consumer_byte_rate
RECORD = 16 * 1024
RECORDS = 2560  # 40 MiB
WHOLE_WINDOWS = 33.0  # seconds: three of the broker's quota windows (quota.window.num 11 x 1 s)


@dataclass
class Tiered:
    topic: str
    config: Path
    remote_end: int  # the first offset only the broker has


@pytest.fixture(scope="module")
def tiered(stack: Endpoints, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tiered]:
    tmp = tmp_path_factory.mktemp("quotas")
    topic = create_topic(stack.bootstrap, 1, internal_segment_bytes=1 << 20)
    producer = Producer({"bootstrap.servers": stack.bootstrap, "linger.ms": 20, "batch.size": 1 << 20})
    for i in range(RECORDS):
        producer.produce(topic, os.urandom(RECORD), key=str(i).encode())
        producer.poll(0)
    assert producer.flush(60) == 0
    config = write_config(stack, tmp)
    result = CliRunner().invoke(main, ["topic", "enable", topic, "--local-retention-bytes", str(2 << 20),
                                       "--config", str(config)])  # fmt: skip
    assert result.exit_code == 0, result.output
    with running_sidecar(config) as (ctx, _sidecar):

        def log_start() -> int:
            return ctx.cluster.local_offsets([(topic, 0)])[(topic, 0)].lx

        wait_for(lambda: log_start() > RECORDS * 0.9, 240, "the sidecar to tier the topic")
        yield Tiered(topic, config, log_start())


def configs(stack: Endpoints, *args: str) -> None:
    """kafka-configs on the running broker."""
    result = run_kafka_tool("kafka.admin.ConfigCommand", "--bootstrap-server", stack.bootstrap, *args, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]


@dataclass
class Reading:
    """What a looping consumer read: when it was assigned (before its first fetch), (monotonic time, bytes of
    remote records so far) after each poll, and the largest throttle time librdkafka reported."""

    started: float = 0.0
    progress: list[tuple[float, int]] = field(default_factory=list)
    throttle_ms: int = 0

    def rate(self, start: float, seconds: float) -> float:
        """Bytes per second from ``start`` to ``start + seconds``."""
        at_start = max((b for t, b in self.progress if t <= start), default=0)
        at_end = max((b for t, b in self.progress if t <= start + seconds), default=0)
        return (at_end - at_start) / seconds

    @property
    def first(self) -> float:
        return next(t for t, b in self.progress if b > 0)


def read_remote_part(bootstrap: str, t: Tiered, client_id: str, stop: threading.Event, out: Reading) -> None:
    """Read offsets [0, remote_end) again and again; librdkafka's prefetch of the broker's part past the
    remote end is dropped by the seek back, so every byte counted came from remote storage."""

    def stats(text: str) -> None:
        brokers = json.loads(text).get("brokers", {}).values()
        out.throttle_ms = max([out.throttle_ms, *(int(b.get("throttle", {}).get("max", 0)) for b in brokers)])

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"quota-{uuid.uuid4().hex[:8]}",
                         "client.id": client_id, "enable.auto.commit": False, "statistics.interval.ms": 1000,
                         "stats_cb": stats, "queued.max.messages.kbytes": 4096})  # fmt: skip
    try:
        out.started = time.monotonic()
        consumer.assign([TopicPartition(t.topic, 0, 0)])
        total = 0
        while not stop.is_set():
            for m in consumer.consume(256, 0.2):
                assert m.error() is None, m.error()
                if m.offset() < t.remote_end:
                    total += len(m.value()) + len(m.key())
                if m.offset() >= t.remote_end - 1:
                    consumer.seek(TopicPartition(t.topic, 0, 0))
                    break
            out.progress.append((time.monotonic(), total))
    finally:
        consumer.close()


def reading(proxy: ProxyServer, t: Tiered, client_id: str, stop: threading.Event) -> tuple[Reading, threading.Thread]:
    out = Reading()
    thread = threading.Thread(target=read_remote_part, args=(proxy_bootstrap(proxy), t, client_id, stop, out),
                              daemon=True)  # fmt: skip
    thread.start()
    return out, thread


def test_a_client_over_its_quota_gets_the_quota_and_others_are_not_slowed(stack: Endpoints, tiered: Tiered) -> None:
    limited, free = f"quota-limited-{uuid.uuid4().hex[:6]}", f"quota-free-{uuid.uuid4().hex[:6]}"
    with proxy_for(tiered.config, stack.bootstrap, quota_refresh_seconds=1.0) as proxy:
        # no quota set: answers far beyond what 5 MB/s allows in a window (50 MB) are not throttled. The first may
        # come without records: a proxy that has not yet seen the broker's log start passes the fetch on, and the
        # broker's OFFSET_OUT_OF_RANGE is answered in place, no records (reader/proxy/pass_through.py)
        with RawKafka(proxy_bootstrap(proxy)) as raw:
            answers = [raw.fetch(12, tiered.topic, uuid.UUID(int=0), 0, 0, 1 << 20) for _ in range(64)]
        assert all(a is not None for a in answers)
        assert all(record_bytes(a) > 0 for a in answers[1:])
        assert {a.throttle_time.total_seconds() for a in answers} == {0}

        configs(stack, "--alter", "--entity-type", "clients", "--entity-name", limited, "--add-config",
                f"consumer_byte_rate={QUOTA}")  # fmt: skip
        try:
            wait_for(lambda: proxy.quotas.quotas.rates.get((None, limited)) == QUOTA, 30, "the proxy to read the quota")
            stop_limited, stop_free = threading.Event(), threading.Event()
            slow, slow_thread = reading(proxy, tiered, limited, stop_limited)
            fast, fast_thread = reading(proxy, tiered, free, stop_free)
            wait_for(lambda: bool(slow.progress) and slow.progress[-1][1] > 0, 60, "the limited client's first bytes")
            time.sleep(12)
            stop_free.set()
            fast_thread.join(30)
            wait_for(lambda: time.monotonic() > slow.started + WHOLE_WINDOWS + 1, 60, "three quota windows")
            stop_limited.set()
            slow_thread.join(30)
        finally:
            configs(stack, "--alter", "--entity-type", "clients", "--entity-name", limited, "--delete-config",
                    "consumer_byte_rate")  # fmt: skip
        throttled_seconds = proxy.metrics.throttle_seconds._value.get()
    limited_rate = slow.rate(slow.started, WHOLE_WINDOWS)
    free_rate = fast.rate(fast.first + 1, 10)
    print(f"limited {limited_rate / 1e6:.2f} MB/s (max throttle {slow.throttle_ms} ms), free {free_rate / 1e6:.2f} "
          f"MB/s (max throttle {fast.throttle_ms} ms), throttled {throttled_seconds:.1f} s in all")  # fmt: skip
    assert 0.9 * QUOTA <= limited_rate <= 1.1 * QUOTA
    assert slow.throttle_ms > 0 and throttled_seconds > 0
    assert free_rate > 3 * QUOTA
    assert fast.throttle_ms == 0


def test_a_quota_set_while_a_client_reads_on_a_remote_lane_counts_what_it_reads_next(
    stack: Endpoints, tiered: Tiered
) -> None:
    """A client without a quota reads the remote part once, at about 6 MB/s, on one remote lane
    (reader/proxy/remote_lane.py; fetch ahead's max age long enough that its pauses do not end it). A quota set for
    it a second in holds from the lane's next run: the lane stops handing answers and the client's Fetch requests go
    back to the event loop, which counts their remote bytes to the quota (and throttles them once over it). A lane
    that went on would serve the rest of the remote part with nothing counted."""
    client = f"quota-late-{uuid.uuid4().hex[:6]}"
    pace = 6_000_000  # bytes/s: the remote part (about 40 MB) takes some seconds
    with proxy_for(tiered.config, stack.bootstrap, quota_refresh_seconds=1.0,
                   fetch_ahead_max_age_seconds=UNHURRIED) as proxy:  # fmt: skip
        consumer = Consumer({"bootstrap.servers": proxy_bootstrap(proxy), "group.id": f"quota-{client}",
                             "client.id": client, "enable.auto.commit": False,
                             "queued.max.messages.kbytes": 2048})  # fmt: skip
        quota_set, read_at_quota, total = False, None, 0
        try:
            consumer.assign([TopicPartition(tiered.topic, 0, 0)])
            started = time.monotonic()
            while True:
                messages = consumer.consume(16, 0.2)
                for m in messages:
                    assert m.error() is None, m.error()
                    if m.offset() < tiered.remote_end:
                        total += len(m.value()) + len(m.key())
                if any(m.offset() >= tiered.remote_end - 1 for m in messages):
                    break
                time.sleep(max(0.0, started + total / pace - time.monotonic()))
                if not quota_set and time.monotonic() > started + 1:
                    configs(stack, "--alter", "--entity-type", "clients", "--entity-name", client, "--add-config",
                            f"consumer_byte_rate={QUOTA}")  # fmt: skip
                    quota_set = True
                if read_at_quota is None and proxy.quotas.quotas.rates.get((None, client)) == QUOTA:
                    read_at_quota = total
        finally:
            consumer.close()
            if quota_set:
                configs(stack, "--alter", "--entity-type", "clients", "--entity-name", client, "--delete-config",
                        "consumer_byte_rate")  # fmt: skip
        counted = sum(sample.total for key, sensor in proxy.quotas.sensors.items() if client in key
                      for sample in sensor.rate.samples)  # fmt: skip
        runs = {o: proxy.metrics.remote_lane.labels(o)._value.get() for o in ("again", "done", "request")}
    assert read_at_quota is not None, "the proxy read the quota only after the client reached the remote end"
    after = total - read_at_quota
    print(f"read {total / 1e6:.1f} MB, {after / 1e6:.1f} MB after the proxy read the quota, {counted / 1e6:.1f} MB "
          f"counted to it; lane runs {runs}")  # fmt: skip
    assert runs["again"] > 0, f"the client was not on a lane for long: {runs}"
    # what a lane run serves after the quota came (at most a second at the pace) and librdkafka's queue are not counted
    assert counted >= after - 2 * pace - (2 << 20), "the bytes read after the quota were not counted to it"
