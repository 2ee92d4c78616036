"""The proxy stays up and bounded whatever clients send: garbage and oversized frames, a request cut half
way, many idle connections, more connections than allowed."""

from __future__ import annotations

import os
import resource
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from confluent_kafka.admin import AdminClient
from kio.schema.errors import ErrorCode
from prometheus_client import CollectorRegistry

from deploy.stack import Endpoints
from reader.proxy import ProxyListen, ProxyServer, load_proxy_settings, running_proxy
from reader.proxy.protocol import parse, response_type, supported_versions
from tests.conftest import create_topic
from tests.kafka_wire import LIST_OFFSETS, RawKafka, list_earliest, read_exactly
from tests.proxy_harness import proxy_bootstrap, proxy_for
from tests.sidecar_harness import wait_for, write_config

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def proxy(stack: Endpoints, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyServer]:
    config = write_config(stack, tmp_path_factory.mktemp("proxy-robust"))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 8192)), hard))
    with proxy_for(Path(config), stack.bootstrap, frame_timeout_seconds=2, max_connections=1_050,
                   max_frame_bytes=1 << 20) as p:  # fmt: skip
        yield p


def still_serves(proxy: ProxyServer) -> None:
    admin = AdminClient({"bootstrap.servers": proxy_bootstrap(proxy)})
    assert admin.list_topics(timeout=30).brokers, "the proxy no longer answers Metadata"


def closed_by_proxy(sock: socket.socket, within: float = 15) -> bool:
    sock.settimeout(within)
    try:
        while sock.recv(65536):
            pass
        return True
    except (TimeoutError, OSError) as exc:
        return not isinstance(exc, TimeoutError)


def connect(proxy: ProxyServer) -> socket.socket:
    return socket.create_connection(("127.0.0.1", proxy.bootstrap_port), 10)


def closed_reason(proxy: ProxyServer, reason: str) -> float:
    return proxy.metrics.closed_bad.labels(reason)._value.get()


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (struct.pack(">i", 200 << 20) + b"x" * 64, "oversized"),
        (struct.pack(">i", -5), "oversized"),
        (struct.pack(">i", 3) + b"abc", "error"),  # shorter than a request header
    ],
    ids=["oversized", "negative-size", "too-short"],
)
def test_bad_frames_close_only_their_connection(proxy: ProxyServer, payload: bytes, reason: str) -> None:
    before = closed_reason(proxy, reason)
    with connect(proxy) as sock:
        sock.sendall(payload)
        assert closed_by_proxy(sock), "the proxy kept a connection that sent a bad frame"
    assert closed_reason(proxy, reason) == before + 1
    still_serves(proxy)


def test_garbage_request_does_not_hurt_others(proxy: ProxyServer) -> None:
    """A frame of random bytes: that connection is closed (by the proxy or the broker it reached), others go on."""
    with connect(proxy) as sock:
        body = os.urandom(64)
        sock.sendall(struct.pack(">i", len(body)) + body)
        assert closed_by_proxy(sock, 30)
    still_serves(proxy)


def test_half_a_frame_then_silence_is_closed(proxy: ProxyServer) -> None:
    before = closed_reason(proxy, "stalled")
    with connect(proxy) as sock:
        sock.sendall(struct.pack(">i", 1000) + b"\x00\x03\x00\x0c")
        started = time.monotonic()
        assert closed_by_proxy(sock, 20)
        assert time.monotonic() - started >= 1.5  # frame_timeout_seconds=2, not at once
    assert closed_reason(proxy, "stalled") == before + 1
    still_serves(proxy)


def test_a_thousand_idle_connections_and_the_cap(proxy: ProxyServer) -> None:
    """1,000 idle connections cost no broker connection and little memory; past max_connections new ones are
    closed at once; clients still get answers."""
    me = psutil.Process()
    rss = me.memory_info().rss
    brokers = {port for _, port in proxy.router.bootstrap} | {a[1] for n in proxy.router.known_nodes()
                                                               if (a := proxy.router.broker_address(n))}  # fmt: skip

    def to_brokers() -> int:
        return len([c for c in me.net_connections("tcp") if c.raddr and c.raddr.port in brokers])

    broker_conns = to_brokers()
    socks = [connect(proxy) for _ in range(1_000)]
    try:
        deadline = time.monotonic() + 30
        while proxy.connections < 1_000 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert proxy.connections >= 1_000
        grown = (me.memory_info().rss - rss) / (1 << 20)
        assert grown < 150, f"1,000 idle connections took {grown:.0f} MiB"
        assert to_brokers() <= broker_conns + 5, "idle client connections opened broker connections"
        refused_before = proxy.metrics.refused._value.get()
        extra = [connect(proxy) for _ in range(100)]
        try:
            assert all(closed_by_proxy(s, 15) for s in extra[-40:])
            assert proxy.metrics.refused._value.get() > refused_before
        finally:
            for s in extra:
                s.close()
    finally:
        for s in socks:
            s.close()
    deadline = time.monotonic() + 30
    while proxy.connections > 10 and time.monotonic() < deadline:
        time.sleep(0.1)
    still_serves(proxy)


def test_an_api_versions_request_the_proxy_cannot_read_is_answered_by_it(proxy: ProxyServer) -> None:
    """Kroxylicious' ApiVersionsDowngrader: an ApiVersions version newer than the proxy's schemas is answered
    UNSUPPORTED_VERSION at v0 with the versions it can read, by the proxy itself (a newer broker's own answer
    would show the client versions the proxy cannot rewrite); the client then asks again lower."""
    before = proxy.metrics.requests.labels("api_versions", "proxy")._value.get()
    with connect(proxy) as sock:
        frame = struct.pack(">hhih", 18, 99, 7, 4) + b"test" + b"\x00\x00"
        sock.sendall(struct.pack(">i", len(frame)) + frame)
        sock.settimeout(15)
        (size,) = struct.unpack(">i", read_exactly(sock, 4))
        answer = read_exactly(sock, size)
    assert struct.unpack_from(">i", answer)[0] == 7
    body = parse(response_type(18, 0), answer, 4)
    assert body.error_code == ErrorCode.unsupported_version
    assert [(k.api_key, k.min_version, k.max_version) for k in body.api_keys] == [(18, *supported_versions()[18])]
    answered = proxy.metrics.requests.labels("api_versions", "proxy")
    wait_for(lambda: answered._value.get() == before + 1, 10, "the proxy counting its own answer")  # after the send
    still_serves(proxy)


def test_a_request_with_a_tagged_field_the_proxy_does_not_know_is_answered(
    stack: Endpoints, proxy: ProxyServer
) -> None:
    """A newer client may add a tagged field to a flexible request (KIP-482); Kafka skips a tag it does not know,
    and so does the proxy where it reads the request (ListOffsets, to complete the answer from the copies): the
    answer is the broker's own, never a closed connection."""
    topic = create_topic(stack.bootstrap, 2)

    def with_unknown_tag(frame: bytes) -> bytes:  # the body's last byte is its (empty) tag section
        assert frame[-1] == 0
        return frame[:-1] + bytes([1, 90, 3, 1, 2, 3])

    def ask(address: str) -> Any:
        with RawKafka(address) as raw:
            return raw.request(LIST_OFFSETS, 7, with_unknown_tag, **list_earliest(topic, [0, 1]))

    def led() -> bool:  # a topic just created answers NOT_LEADER_OR_FOLLOWER until its leaders are elected
        return all(p.error_code == ErrorCode.none for t in ask(stack.bootstrap).topics for p in t.partitions)

    wait_for(led, 30, "the new topic's leaders")
    through_proxy, from_broker = ask(proxy_bootstrap(proxy)), ask(stack.bootstrap)
    assert through_proxy is not None, "the proxy closed the connection"
    assert through_proxy == from_broker
    still_serves(proxy)


def test_a_broker_port_in_use_leaves_out_that_broker_only(stack: Endpoints, tmp_path: Path) -> None:
    """The listener for a broker cannot start (its port is in use): the proxy starts anyway, Metadata keeps
    answering with that broker left out (never its own address), and once the port is free the next Metadata
    answer names the broker at the proxy's port again and clients are served through it."""
    topic = create_topic(stack.bootstrap)
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    listen = ProxyListen(bootstrap_port=0, broker_ports={1: port}, broker_port_base=None)
    settings = load_proxy_settings(write_config(stack, tmp_path), proxy=listen)
    try:
        with running_proxy(settings, CollectorRegistry()) as proxy:

            def brokers() -> list[tuple[int, str, int]]:
                with RawKafka(f"127.0.0.1:{proxy.bootstrap_port}") as raw:
                    answer = raw.metadata(topic)
                assert answer is not None, "the proxy closed a Metadata request"
                return [(int(b.node_id), b.host, int(b.port)) for b in answer.brokers]

            assert brokers() == [] and 1 in proxy.router.unavailable
            busy.close()
            wait_for(lambda: brokers() == [(1, "127.0.0.1", port)], 30, "the broker named again once its port is free")
            still_serves(proxy)
    finally:
        busy.close()
