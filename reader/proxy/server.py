"""The proxy's listeners: one bootstrap port, one port per broker, each client connection served on its own.

``ProxyServer`` runs on one asyncio event loop: accepting, framing and forwarding are non-blocking; remote
reads run on a bounded thread pool (``remote_threads``) beside the reader's own download threads, and
offsets answers (ListOffsets, OffsetForLeaderEpoch: the catalog's waits, the cluster's answers) on a pool
of their own (``offsets_threads``), so reads queued behind a full memory pool never delay them. The
byte budgets of requests and answers held for clients are the server's (``reader/proxy/budget.py``).
``ProxyServer.run()`` serves until SIGTERM/SIGINT; ``running_proxy(settings)`` runs one in a background
thread (the demo, the benchmarks, the tests).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server

from reader.catalog import MetadataCatalog
from reader.proxy.budget import ByteBudget
from reader.proxy.config import READ_LIMIT, ProxySettings
from reader.proxy.connection import ClientConnection
from reader.proxy.fetch import FetchPlan
from reader.proxy.frames import UPSTREAM_MAX_FRAME, FrameProtocol
from reader.proxy.lane import LaneThreads, available
from reader.proxy.metrics import ProxyMetrics
from reader.proxy.quotas import ClientQuotaManager
from reader.proxy.remote_lane import available as remote_lane_available
from reader.proxy.routing import Router
from reader.proxy.splice import PipePool, pipe_max_size
from reader.proxy.tiered import TieredView
from reader.proxy.turns import FetchTurns
from reader.remote import RemoteReader
from tiering_core.allocator import keep_freed_memory
from tiering_core.errors import TieringError
from tiering_core.kafka_client import client_properties
from tiering_core.kafka_cluster import KafkaCluster
from tiering_core.logs import get_logger
from tiering_core.stores.factory import open_store

log = get_logger(__name__)
# Python 3.11's asyncio keeps what a send() did not take in a bytearray and deletes the sent head after
# each later send(): a 1 MiB Fetch answer sent in 64 KiB pieces moved about 8 MiB in memory (measured:
# 1.7 ms of CPU per answer). A send buffer that holds whole answers (the kernel caps it at wmem_max)
# lets the first send() take all of it.
SEND_BUFFER = 4 << 20


class UpstreamUnavailable(TieringError):
    """No broker could be reached for a client connection (it is closed; the client reconnects)."""


def _bootstrap(servers: str) -> list[tuple[str, int]]:
    out = []
    for item in servers.split(","):
        host, _, port = item.strip().rpartition(":")
        out.append((host.strip("[]") or "localhost", int(port)))
    return out


class ProxyServer:
    def __init__(self, settings: ProxySettings, registry: CollectorRegistry | None = None) -> None:
        self.settings = settings
        p = settings.proxy
        props = client_properties(settings.kafka_client)
        self.cluster = KafkaCluster(settings.bootstrap_servers, client_config=props)
        store = open_store(settings.remote_storage)
        catalog = MetadataCatalog(settings, store, self.cluster, None).start()
        self.reader = RemoteReader(settings, catalog, store)
        self.view = TieredView(self.reader, self.cluster, p.offsets_cache_seconds, p.remote_cursors,
                               p.remote_memory_wait_seconds)  # fmt: skip
        self.router = Router(p.advertised, p.broker_ports, p.broker_port_base, _bootstrap(settings.bootstrap_servers))
        self.metrics = ProxyMetrics(self.reader, registry)
        self.quotas = ClientQuotaManager(p.quota_window_num, p.quota_window_size_seconds)
        self.remote_pool = ThreadPoolExecutor(p.remote_threads, thread_name_prefix="proxy-remote")
        self.offsets_pool = ThreadPoolExecutor(p.offsets_threads, thread_name_prefix="proxy-offsets")
        self.answers = ByteBudget(p.answer_buffer_bytes)
        self.requests = ByteBudget(p.request_buffer_bytes)
        self.fetch_turns = FetchTurns()
        self.upstream_ssl = settings.upstream_ssl()
        zero_copy = p.zero_copy and hasattr(os, "splice") and self.upstream_ssl is None
        self.pipes = PipePool(p.zero_copy_pipes, pipe_max_size()) if zero_copy else None
        native_lane = p.native_lane and p.fetch_ahead and available() and self.upstream_ssl is None
        self.lanes = LaneThreads(p.native_lanes) if native_lane else None
        self.remote_lanes = self.lanes is not None and p.remote_lane and remote_lane_available()
        self.client_ssl = p.tls.context() if p.tls is not None else None
        self.servers: dict[int | None, asyncio.base_events.Server] = {}
        self.connections = 0
        self._listening: dict[int, asyncio.Future[None]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._metrics_server: Any = None

    # -- life cycle -----------------------------------------------------------------------------
    async def start(self) -> None:
        p = self.settings.proxy
        self.servers[None] = await asyncio.start_server(self._accept(None), p.host, p.bootstrap_port,
                                                        ssl=self.client_ssl, limit=READ_LIMIT)  # fmt: skip
        nodes = set(p.broker_ports)
        try:
            brokers = await asyncio.get_running_loop().run_in_executor(self.offsets_pool, self._cluster_brokers)
        except Exception as exc:  # the cluster may come later: brokers are learned from Metadata answers too
            log.warning("could not list the cluster's brokers at start", error=str(exc))
            brokers = {}
        for node, (host, port) in brokers.items():
            self.router.learn(node, host, port)
            nodes.add(node)
        await self.ensure_listeners(sorted(nodes))
        quotas = self.quotas.follow(lambda: self.open_upstream(None), client_properties(self.settings.kafka_client),
                                    p.quota_refresh_seconds, p.upstream_connect_timeout_seconds)  # fmt: skip
        self._tasks.add(asyncio.create_task(quotas))
        if p.metrics_port is not None:
            self._metrics_server = start_http_server(p.metrics_port, p.host, registry=self.metrics.registry)
        self._warn_tls_identities()
        log.info("proxy listening", bootstrap=f"{p.advertised}:{self.bootstrap_port}",
                 brokers={n: self.router.port_for(n) for n in sorted(nodes)})  # fmt: skip

    def _warn_tls_identities(self) -> None:
        """A TLS client identity cannot pass through a proxy (as Kroxylicious says too): say so at start."""
        cert = self.settings.client_certificate()
        if cert is not None:
            log.warning("the brokers see the proxy's client certificate on every connection it forwards, so TLS "
                        "clients all get its principal and ACLs; clients keep their own principal with SASL, which "
                        "passes through", certificate=cert)  # fmt: skip
        tls = self.settings.proxy.tls
        if tls is not None and tls.client_auth != "none":
            log.warning("client certificates are checked by the proxy but their identity does not reach the "
                        "brokers: authorisation is by the principal each client logs in as with SASL",
                        client_auth=tls.client_auth)  # fmt: skip

    @property
    def bootstrap_port(self) -> int:
        return self.servers[None].sockets[0].getsockname()[1]

    def _cluster_brokers(self) -> dict[int, tuple[str, int]]:
        brokers = self.cluster.admin.list_topics(timeout=10).brokers
        return {int(b.id): (b.host, int(b.port)) for b in brokers.values()}

    async def ensure_listeners(self, nodes: list[int]) -> None:
        """Listen on the port of each node (once); returns when each listens or has failed. A node with no port,
        or whose port cannot be listened on (in use), is logged once and left out of the addresses clients get
        (``Router.unavailable``: its partitions have no reachable leader, which clients retry), and its port is
        tried again at the next Metadata answer; never an error for the client asking, nor for the others."""
        for node in nodes:
            if node not in self._listening:
                self._listening[node] = asyncio.ensure_future(self._listen(node))
        await asyncio.gather(*(self._listening[n] for n in nodes))

    async def _listen(self, node: int) -> None:
        p = self.settings.proxy
        if not self.router.has_port(node):
            self._unavailable(node, "no port for it: add it to proxy.broker_ports or set proxy.broker_port_base")
            return
        port = self.router.port_for(node)
        try:
            self.servers[node] = await asyncio.start_server(self._accept(node), p.host, port, ssl=self.client_ssl,
                                                            limit=READ_LIMIT)  # fmt: skip
        except OSError as exc:
            self._listening.pop(node, None)  # tried again at the next Metadata answer
            self._unavailable(node, f"cannot listen on {p.host}:{port}: {exc}")
            return
        if node in self.router.unavailable:
            log.info("listening for the broker again", node=node, port=port)
            self.router.unavailable.discard(node)

    def _unavailable(self, node: int, reason: str) -> None:
        if node not in self.router.unavailable:
            log.error("a broker is left out of the addresses clients get; its clients retry", node=node,
                      reason=reason)  # fmt: skip
        self.router.unavailable.add(node)

    async def close(self) -> None:
        for server in self.servers.values():
            server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._metrics_server is not None:
            self._metrics_server[0].shutdown()
        self.remote_pool.shutdown(wait=False, cancel_futures=True)
        self.offsets_pool.shutdown(wait=False, cancel_futures=True)
        self.view.close()
        self.reader.close()
        if self.pipes is not None:
            self.pipes.close()
        if self.lanes is not None:
            self.lanes.close()

    def run(self) -> None:
        """Serve until SIGTERM or SIGINT (``tiering proxy serve``), the process' allocator set for its answers
        (``proxy.malloc_trim_threshold_bytes``)."""
        keep_freed_memory(self.settings.proxy.malloc_trim_threshold_bytes)

        async def main() -> None:
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, stop.set)
            await self.start()
            try:
                await stop.wait()
            finally:
                log.info("proxy stopping")
                await self.close()

        asyncio.run(main())

    # -- connections ----------------------------------------------------------------------------
    def _accept(self, node: int | None):
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            if self.connections >= self.settings.proxy.max_connections:
                self.metrics.refused.inc()
                log.warning("connection refused: max_connections reached",
                            client=str(writer.get_extra_info("peername")),
                            max_connections=self.settings.proxy.max_connections)  # fmt: skip
                writer.close()
                return
            sock = writer.get_extra_info("socket")
            if sock is not None:  # one send() takes a whole Fetch answer (see SEND_BUFFER)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
            self.connections += 1
            self.metrics.connections.inc()
            task = asyncio.current_task()
            if task is not None:
                self._tasks.add(task)
            try:
                await ClientConnection(self, reader, writer, node).serve()
            except asyncio.CancelledError:
                pass  # the proxy is stopping
            finally:
                self.connections -= 1
                self.metrics.connections.dec()
                if task is not None:
                    self._tasks.discard(task)

        return handle

    async def open_upstream(self, node: int | None) -> FrameProtocol:
        """A connection to ``node``'s broker (to any bootstrap broker for the bootstrap port)."""
        if node is None:
            targets = list(self.router.bootstrap)
        else:
            address = self.router.broker_address(node)
            if address is None:
                brokers = await asyncio.get_running_loop().run_in_executor(self.offsets_pool, self._cluster_brokers)
                for n, (host, port) in brokers.items():
                    self.router.learn(n, host, port)
                address = self.router.broker_address(node)
            if address is None:
                raise UpstreamUnavailable(f"broker {node} is not in the cluster's metadata")
            targets = [address]
        errors = []
        loop = asyncio.get_running_loop()
        for host, port in targets:
            try:
                async with asyncio.timeout(self.settings.proxy.upstream_connect_timeout_seconds):
                    _, protocol = await loop.create_connection(
                        lambda: FrameProtocol(UPSTREAM_MAX_FRAME, self.answers), host, port, ssl=self.upstream_ssl,
                        server_hostname=host if self.upstream_ssl else None,
                    )  # fmt: skip
                    return protocol
            except (OSError, TimeoutError) as exc:
                errors.append(f"{host}:{port}: {exc or 'timed out'}")
        raise UpstreamUnavailable(f"no broker reachable for node {node}: {'; '.join(errors)}")

    def count_passed(self, partitions: int) -> None:
        """A Fetch answer passed through as the broker gave it: its partitions all came from the broker."""
        self.metrics.fetch_partitions.labels("broker").inc(partitions)

    def count_fetch(self, answer: Any, plan: FetchPlan) -> None:
        remote_keys = plan.served_remote
        key_field = "topic_id" if plan.version >= 13 else "topic"
        for t in answer.responses:
            for p in t.partitions:
                source = "remote" if (getattr(t, key_field), int(p.partition_index)) in remote_keys else "broker"
                self.metrics.fetch_partitions.labels(source).inc()
                if source == "remote" and int(p.error_code) == 56:
                    self.metrics.remote_errors.inc()


@contextlib.contextmanager
def running_proxy(settings: ProxySettings, registry: CollectorRegistry | None = None) -> Iterator[ProxyServer]:
    """A proxy serving on its own event loop thread until the block ends."""
    server = ProxyServer(settings, registry)
    loop = asyncio.new_event_loop()
    started = threading.Event()
    failed: list[BaseException] = []

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(server.start())
        except BaseException as exc:
            failed.append(exc)
            started.set()
            return
        started.set()
        loop.run_forever()
        loop.run_until_complete(server.close())
        loop.close()

    thread = threading.Thread(target=run, name="proxy-loop", daemon=True)
    thread.start()
    started.wait(120)
    if failed:
        server.reader.close()
        raise failed[0]
    try:
        yield server
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(60)
