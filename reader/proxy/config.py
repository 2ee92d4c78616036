"""The proxy's configuration: the reader's settings plus a ``proxy`` section.

One file serves the sidecar, the reader services and the proxy (keys a part does not use are ignored):
``bootstrap_servers`` and ``kafka_client`` are how the proxy reaches the brokers (TLS settings of
``kafka_client`` apply to the connections it forwards too; SASL is the clients' own and passes through),
``remote_storage`` and the prefetch settings how it reads tiered data. Every bound is here, with its reason.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from reader.config import MIB, ReaderSettings
from reader.proxy.budget import SMALL_FRAME
from tiering_core.errors import ConfigError
from tiering_core.kafka_client import client_properties
from tiering_core.settings import load_settings_file

# What the proxy holds besides its budgets, estimated from above. The process itself: the interpreter,
# kio's schemas, the Kafka and S3 clients, the catalog of a few thousand partitions, threads' stacks in use.
BASE_BYTES = 192 * MIB
# One connection besides its budgeted frames: the client stream's buffer (up to twice READ_LIMIT before
# asyncio pauses it), the small answers it may hold beyond the answer budget (two, see
# reader/proxy/budget.py), the client transport's buffer after a drain (asyncio's 64 KiB high-water mark),
# and its objects (tasks, slots, a parsed request).
READ_LIMIT = 64 * 1024
CONNECTION_BYTES = 2 * READ_LIMIT + 2 * SMALL_FRAME + 64 * 1024 + 64 * 1024


class ProxyTls(BaseModel):
    """TLS towards clients (the listeners). Clients then connect with security.protocol SSL or SASL_SSL."""

    cert_file: Path = Field(description="The server certificate (PEM), chain included.")
    key_file: Path = Field(description="Its private key (PEM).")
    ca_file: Path | None = Field(default=None, description="CA certificates that client certificates must chain to.")
    client_auth: Literal["none", "requested", "required"] = Field(
        default="none", description="Kafka's ssl.client.auth: ask clients for a certificate, or require one."
    )

    def context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            ctx.load_cert_chain(self.cert_file, self.key_file)
            if self.ca_file is not None:
                ctx.load_verify_locations(self.ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"proxy.tls: cannot load {self.cert_file} / {self.key_file}: {exc}") from exc
        ctx.verify_mode = {"none": ssl.CERT_NONE, "requested": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}[
            self.client_auth
        ]
        return ctx


class ProxyListen(BaseModel):
    """Where the proxy listens and what it tells clients, and the bounds on what they may send."""

    host: str = Field(
        default="127.0.0.1",
        description="Address to listen on. Loopback unless set (0.0.0.0 in a pod or beside a broker).",
    )
    advertised_host: str | None = Field(
        default=None,
        description="The host clients are told to come back to (a DNS name, a Kubernetes Service); default: host.",
    )
    bootstrap_port: int = Field(default=9192, ge=0, le=65535, description="The port clients bootstrap to.")
    broker_ports: dict[int, int] = Field(
        default_factory=dict, description="The port that stands for each broker: {node id: port}."
    )
    broker_port_base: int | None = Field(
        default=9193,
        ge=0,
        le=65535,
        description="For brokers not in broker_ports: port = broker_port_base + node id (new brokers get a "
        "port without a configuration change). None: only broker_ports.",
    )
    tls: ProxyTls | None = Field(default=None, description="TLS towards clients; plaintext when absent.")
    max_connections: int = Field(
        default=2_000, ge=1,
        description="Client connections at once; past it a new one is closed at once. Each may cost up to "
        "CONNECTION_BYTES (384 KiB) besides the budgets (max_memory_bytes).",
    )  # fmt: skip
    max_frame_bytes: int = Field(
        default=100 * MIB, ge=64 * 1024,
        description="Largest request a client may send (Kafka's socket.request.max.bytes); a larger size "
        "closes that connection. Answers are bounded by what clients ask (fetch.max.bytes).",
    )  # fmt: skip
    sasl_server_max_receive_size: int = Field(
        default=512 * 1024, ge=1024,
        description="Largest request before a client has authenticated on a SASL listener (Kafka's "
        "sasl.server.max.receive.size): a peer that has not logged in cannot make the proxy hold max_frame_bytes.",
    )  # fmt: skip
    max_in_flight: int = Field(
        default=32, ge=1,
        description="Requests a connection may have waiting for answers; past it the proxy stops reading "
        "from that client until answers go out (bounds memory per connection).",
    )  # fmt: skip
    idle_timeout_seconds: float = Field(
        default=600.0, gt=0,
        description="A connection with no request for this long is closed (Kafka's connections.max.idle.ms).",
    )  # fmt: skip
    frame_timeout_seconds: float = Field(
        default=30.0, gt=0, description="A request whose bytes stop arriving for this long closes its connection."
    )
    upstream_connect_timeout_seconds: float = Field(default=10.0, gt=0, description="Connecting to a broker.")
    offsets_cache_seconds: float = Field(
        default=2.0, gt=0,
        description="How long a broker's high watermark and last stable offset asked by the proxy are reused for "
        "remote answers (Fetch answers passing through refresh them anyway).",
    )  # fmt: skip
    remote_cursors: int = Field(
        default=256, ge=1,
        description="Partitions read from remote at once whose read-ahead is kept between fetches (each holds "
        "up to prefetch_windows windows of the shared memory pool).",
    )  # fmt: skip
    remote_threads: int = Field(default=16, ge=1, le=256, description="Threads answering remote reads at once.")
    offsets_threads: int = Field(
        default=4, ge=1, le=64,
        description="Threads answering ListOffsets and OffsetForLeaderEpoch (and asking the cluster for its "
        "brokers): apart from the remote reads', so a queue of reads never delays an offsets answer.",
    )  # fmt: skip
    remote_memory_wait_seconds: float = Field(
        default=1.0, gt=0,
        description="How long a remote read waits for room in the memory pool (read-ahead is evicted first); "
        "past it the partition is answered without records this time and the client asks again.",
    )  # fmt: skip
    fetch_max_bytes: int = Field(
        default=55 * MIB, ge=1024,
        description="The largest answer a Fetch may ask for (the broker's fetch.max.bytes): a request's max_bytes "
        "above it is lowered to it before it is forwarded.",
    )  # fmt: skip
    answer_buffer_bytes: int = Field(
        default=128 * MIB, ge=1 * MIB,
        description="Answers held for clients over all connections (the broker's answers received, remote answers "
        "being built and sent), until the kernel took them. Past it reading from brokers pauses and remote "
        "reads wait. At least twice fetch_max_bytes (a remote answer is held as records and as encoded).",
    )  # fmt: skip
    request_buffer_bytes: int = Field(
        default=128 * MIB, ge=1 * MIB,
        description="Requests being read from clients over all connections, until forwarded; past it reading "
        "requests waits. At least max_frame_bytes.",
    )  # fmt: skip
    malloc_trim_threshold_bytes: int = Field(
        default=32 * MIB, ge=0,
        description="Freed memory the proxy keeps for its next answers rather than give back to the kernel "
        "(glibc's M_TRIM_THRESHOLD; its M_MMAP_THRESHOLD to the same, at most 32 MiB). glibc's own moving thresholds "
        "gave every ~1 MiB answer pages mapped and zeroed anew (tiering_core/allocator.py). 0: glibc's defaults.",
    )  # fmt: skip
    max_memory_bytes: int = Field(
        default=2048 * MIB, ge=64 * MIB,
        description="The proxy's memory bound, checked at start against what the other settings let it hold: "
        "BASE_BYTES + prefetch_pool_bytes + answer_buffer_bytes + 2 x request_buffer_bytes (a request is copied "
        "once as it is read) + max_connections x CONNECTION_BYTES. Set the service's memory limit above it.",
    )  # fmt: skip
    quota_refresh_seconds: float = Field(
        default=30.0, gt=0,
        description="How often the cluster's client quotas (consumer_byte_rate, as kafka-configs sets them) are "
        "read again; remote bytes count against them as the broker's own do (reader/proxy/quotas.py).",
    )  # fmt: skip
    quota_window_num: int = Field(
        default=11, ge=2, description="Samples a client's byte rate is measured over (the brokers' quota.window.num)."
    )
    quota_window_size_seconds: float = Field(
        default=1.0, gt=0, description="The length of each sample (the brokers' quota.window.size.seconds)."
    )
    zero_copy: bool = Field(
        default=True,
        description="Pass-through Fetch answers (no partition served from remote) go from the broker's socket to "
        "the client's as they arrive, with splice(2) through a kernel pipe, never copied through the proxy "
        "(Linux; plain TCP on both sides: TLS keeps the buffered path).",
    )  # fmt: skip
    zero_copy_pipes: int = Field(
        default=128, ge=1,
        description="Kernel pipes lent to pass-through answers in flight, one each (two descriptors per pipe; "
        "its pages are the answer's, counted in answer_buffer_bytes like any answer received); an answer that "
        "finds none is buffered.",
    )  # fmt: skip
    fetch_ahead: bool = Field(
        default=True,
        description="When a pass-through Fetch answer shows more data waiting, ask the broker at once, on the "
        "client's connection, for the Fetch the client will send next, and give the client that answer when its "
        "next Fetch is byte for byte the one predicted (reader/proxy/fetch_ahead.py): the broker's read overlaps "
        "the client's decoding instead of waiting for it. A wrong guess costs one answer the broker read.",
    )  # fmt: skip
    fetch_ahead_max_age_seconds: float = Field(
        default=0.1, gt=0,
        description="A Fetch answer asked ahead is given to the client only this soon after the broker gave it "
        "(older, it is dropped and the client's Fetch goes to the broker): an ACL removed or data deleted in the "
        "meantime is in force after at most this long, as if the request had taken that long on the network.",
    )  # fmt: skip
    native_lane: bool = Field(
        default=True,
        description="A client reading the broker's partitions alone whose Fetch claims an answer asked ahead hands "
        "its cycle to the compiled module (reader/proxy/lane.py): the answers asked ahead, read and served on a "
        "thread of its own without the interpreter, while its requests are the ones predicted; anything else goes "
        "back to the event loop. Needs fetch_ahead and plain TCP to the brokers.",
    )  # fmt: skip
    remote_lane: bool = Field(
        default=True,
        description="A client reading remote partitions alone (read_uncommitted, no fetch quota of the proxy's own) "
        "whose Fetch claims an answer asked ahead hands its cycle to the compiled module too "
        "(reader/proxy/remote_lane.py): the probe per answer sent, the answer built from the batches read-ahead "
        "holds and written, on a lane thread, while the broker allows every partition and the requests are the ones "
        "predicted. Needs native_lane.",
    )  # fmt: skip
    native_lanes: int = Field(
        default=64, ge=1, le=4096,
        description="Connections on a native lane at once (a thread each while it runs); the others keep the "
        "event loop's path.",
    )  # fmt: skip
    metrics_port: int | None = Field(
        default=None, ge=0, le=65535, description="Prometheus /metrics on this port (host as above); none if unset."
    )

    @model_validator(mode="after")
    def _ports(self) -> ProxyListen:
        if not self.broker_ports and self.broker_port_base is None:
            raise ValueError("set broker_ports or broker_port_base: clients need a port for each broker")
        return self

    @property
    def advertised(self) -> str:
        return self.advertised_host or self.host


class ProxySettings(ReaderSettings):
    proxy: ProxyListen = Field(default_factory=ProxyListen, description="The Kafka-protocol access layer.")

    @model_validator(mode="after")
    def _memory(self) -> ProxySettings:
        """One bound on the proxy's memory: the budgets must fit in ``max_memory_bytes``, and a single answer or
        request must fit in its budget (a frame larger than the whole budget would wait for an empty one)."""
        p = self.proxy
        if 2 * p.fetch_max_bytes > p.answer_buffer_bytes:
            raise ValueError(f"proxy.answer_buffer_bytes ({p.answer_buffer_bytes}) must be at least twice "
                             f"proxy.fetch_max_bytes ({p.fetch_max_bytes})")  # fmt: skip
        if p.max_frame_bytes > p.request_buffer_bytes:
            raise ValueError(f"proxy.request_buffer_bytes ({p.request_buffer_bytes}) must be at least "
                             f"proxy.max_frame_bytes ({p.max_frame_bytes})")  # fmt: skip
        needed = self.memory_needed()
        if needed > p.max_memory_bytes:
            raise ValueError(
                f"proxy.max_memory_bytes ({p.max_memory_bytes}) is below what the settings let the proxy hold "
                f"({needed}): {BASE_BYTES} for the process + prefetch_pool_bytes ({self.prefetch_pool_bytes}) + "
                f"proxy.answer_buffer_bytes ({p.answer_buffer_bytes}) + 2 x proxy.request_buffer_bytes "
                f"({p.request_buffer_bytes}) + proxy.max_connections ({p.max_connections}) x {CONNECTION_BYTES}; "
                "raise max_memory_bytes (and the service's memory limit) or lower the others"
            )
        return self

    def memory_needed(self) -> int:
        """What the settings let the proxy hold at most (``max_memory_bytes``' check)."""
        p = self.proxy
        return (BASE_BYTES + self.prefetch_pool_bytes + p.answer_buffer_bytes + 2 * p.request_buffer_bytes
                + p.max_connections * CONNECTION_BYTES)  # fmt: skip

    def sasl_listener(self) -> bool:
        """The brokers' listener that clients reach through the proxy needs SASL (``kafka_client``'s
        security.protocol, the one the proxy's own clients use on the same listener)."""
        props = client_properties(self.kafka_client)
        return props.get("security.protocol", "plaintext").lower().startswith("sasl")

    def client_certificate(self) -> str | None:
        """The client certificate ``kafka_client`` gives the proxy's connections to the brokers, if any."""
        props = client_properties(self.kafka_client)
        return (
            props.get("ssl.certificate.location")
            or props.get("ssl.keystore.location")
            or ("ssl.certificate.pem" if props.get("ssl.certificate.pem") else None)
        )

    def upstream_ssl(self) -> ssl.SSLContext | None:
        """TLS towards the brokers, from ``kafka_client`` (security.protocol SSL / SASL_SSL, ssl.* files)."""
        props = client_properties(self.kafka_client)
        if props.get("security.protocol", "plaintext").lower() not in ("ssl", "sasl_ssl"):
            return None
        ctx = ssl.create_default_context(cafile=props.get("ssl.ca.location"))
        if props.get("ssl.certificate.location"):
            ctx.load_cert_chain(props["ssl.certificate.location"], props.get("ssl.key.location"),
                                props.get("ssl.key.password"))  # fmt: skip
        if props.get("enable.ssl.certificate.verification", "true").lower() == "false":
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        elif props.get("ssl.endpoint.identification.algorithm", "https").lower() == "none":
            ctx.check_hostname = False
        return ctx


def load_proxy_settings(config_file: Path | None = None, **overrides: Any) -> ProxySettings:
    """Settings from ``config_file`` (.yaml/.yml/.toml), ``TIERING_*`` env vars (``TIERING_PROXY__BOOTSTRAP_PORT``)
    and ``overrides``. Raises ConfigError naming the file and the invalid fields."""
    return load_settings_file(ProxySettings, config_file, "proxy configuration", **overrides)
