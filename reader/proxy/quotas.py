"""Client fetch quotas for the bytes the proxy answers from remote storage, as Kafka's broker applies them.

A broker counts the bytes of every Fetch answer it sends against the client's ``consumer_byte_rate``
(KIP-13; by user and/or client id, KIP-55) and throttles a client over it (KIP-219). The remote part of an
answer never passes through the broker's accounting, so without this one catch-up reader through the
proxy could take the store's and the proxy's whole bandwidth. The proxy does what the broker's
``ClientQuotaManager`` does, for the remote bytes only (the broker counts its own part):

- **Which quota.** The cluster's client quotas are read with DescribeClientQuotas (``reader.proxy.admin``)
  every ``quota_refresh_seconds``. A request's quota is resolved in Kafka's order
  (``DefaultQuotaCallback``): /config/users/<user>/clients/<client-id>, /config/users/<user>/clients/<default>,
  /config/users/<user>, /config/users/<default>/clients/<client-id>, /config/users/<default>/clients/<default>,
  /config/users/<default>, /config/clients/<client-id>, /config/clients/<default>. The entity found also
  says who shares the rate: a user's quota is shared by all its client ids, a client id's by all users.
  The user is the principal the client logged in as (``reader.proxy.authentication``: SASL PLAIN and SCRAM
  show it to the proxy; ANONYMOUS on a listener without SASL or client certificates); where the proxy
  cannot know it (GSSAPI, OAUTHBEARER, SCRAM with a delegation token, TLS client certificates, which
  end at the proxy) only the client-id quotas apply.
- **The rate.** Kafka's ``Rate`` over ``quota.window.num`` (11) samples of ``quota.window.size.seconds``
  (1 s), kept per broker (the broker's quota is per broker, so is the proxy's, by the port the client
  came to) and per user / client id as resolved above; sensors idle for an hour are dropped, as Kafka
  expires them.
- **The throttle.** An answer whose remote bytes would take the rate over the quota is not sent: as the
  broker, the proxy uncounts them and answers at once with no partitions (error NONE, session id 0, as
  Kafka's ``getThrottledResponse``) and ``throttle_time_ms`` = (rate - quota) / quota x the rate's window,
  the larger of it and the broker's own (the answer's one field covers both), then reads no further
  request from that connection for that long, as the broker mutes its channel (KIP-219; clients from Kafka
  2.0 also wait on their own and fetch the same offsets again). Fetch before v8 (clients before KIP-219)
  gets its answer after the throttle time instead, as from the broker. Measured from a client's first
  fetch over whole windows, this keeps a client at its quota within a few percent (the unit tests simulate
  it); within a window the bytes come in bursts when old samples expire, as from the broker. The cost: the
  remote records of a throttled answer were read for nothing (the next fetch reads them again, from the
  disk cache when it has them), and a broker part of the same answer is dropped too, which the broker has
  counted: it counts it again when the client fetches it again.
- **Fetch size.** As the broker, a request's ``max_bytes`` is capped for the remote part at what the
  quota allows in a window with nothing counted (quota x (samples - 1) x window): a larger answer would
  be throttled every time and the client would never progress.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kio.static.primitive import i32

from reader.proxy.admin import AdminConnection, AdminError
from reader.proxy.frames import FrameProtocol
from tiering_core.errors import TieringError
from tiering_core.logs import get_logger

log = get_logger(__name__)
DESCRIBE_CLIENT_QUOTAS = 48
CONSUMER_BYTE_RATE = "consumer_byte_rate"
SENSOR_EXPIRY_SECONDS = 3600.0  # Kafka's ClientQuotaManager.InactiveSensorExpirationTimeSeconds


class _Default:
    """``<default>``: the entity that applies to every user / client id without one of its own."""

    def __repr__(self) -> str:
        return "<default>"


DEFAULT = _Default()
# One component of a quota entity: absent (None), the default, or a name.
Component = str | _Default | None
Entity = tuple[Component, Component]  # (user, client id)


@dataclass(frozen=True, slots=True)
class ClientQuotas:
    """The cluster's ``consumer_byte_rate`` quotas by entity (bytes per second)."""

    rates: Mapping[Entity, float] = field(default_factory=dict)

    @classmethod
    def from_answer(cls, answer: Any) -> ClientQuotas:
        """The consumer_byte_rate entries of a DescribeClientQuotas answer (other quota kinds left out)."""
        rates: dict[Entity, float] = {}
        for entry in answer.entries or ():
            parts = {e.entity_type: DEFAULT if e.entity_name is None else e.entity_name for e in entry.entity}
            if set(parts) - {"user", "client-id"}:
                continue  # an IP quota (connection rates): not a byte rate
            for value in entry.values:
                if value.key == CONSUMER_BYTE_RATE:
                    rates[(parts.get("user"), parts.get("client-id"))] = float(value.value)
        return cls(rates)

    def metric_tags(self, user: str | None, client_id: str) -> tuple[str, str]:
        """Who shares a rate, Kafka's ``(user, client-id)`` metric tags (``""``: not part of it); ``user``
        None when the proxy cannot know the principal (client-id quotas only)."""
        if user is None:
            return "", client_id
        r = self.rates
        for entity, tags in (
            ((user, client_id), (user, client_id)),
            ((user, DEFAULT), (user, client_id)),
            ((user, None), (user, "")),
            ((DEFAULT, client_id), (user, client_id)),
            ((DEFAULT, DEFAULT), (user, client_id)),
            ((DEFAULT, None), (user, "")),
        ):
            if entity in r:
                return tags
        return "", client_id

    def limit(self, tags: tuple[str, str]) -> float | None:
        """The quota of a rate's tags (Kafka's ``quotaLimit``), None when none applies."""
        user, client_id = tags
        if user and client_id:
            order: tuple[Entity, ...] = ((user, client_id), (user, DEFAULT), (DEFAULT, client_id), (DEFAULT, DEFAULT))
        elif user:
            order = ((user, None), (DEFAULT, None))
        else:
            order = ((None, client_id), (None, DEFAULT))
        return next((self.rates[e] for e in order if e in self.rates), None)


@dataclass(slots=True)
class _Sample:
    start_ms: float
    total: float = 0.0


class Rate:
    """Kafka's ``Rate`` over a ``SampledTotal``: the total of the samples not older than ``samples`` windows,
    divided by the time they cover, counted as at least ``samples - 1`` whole windows (so a new sensor's
    first bytes do not read as an enormous rate)."""

    def __init__(self, samples: int, window_ms: float) -> None:
        self.samples_max, self.window_ms = samples, window_ms
        self.samples: list[_Sample] = []
        self.current = 0

    def record(self, value: float, now_ms: float) -> None:
        if not self.samples:
            self.samples.append(_Sample(now_ms))
        sample = self.samples[self.current]
        if now_ms - sample.start_ms >= self.window_ms:  # complete: the next one starts now
            self.current = (self.current + 1) % self.samples_max
            if self.current >= len(self.samples):
                self.samples.append(_Sample(now_ms))
            else:
                self.samples[self.current] = _Sample(now_ms)
            sample = self.samples[self.current]
        sample.total += value

    def measure(self, now_ms: float) -> float:
        """Bytes per second."""
        size = self.window_size(now_ms)
        return sum(s.total for s in self.samples) / (size / 1000)

    def window_size(self, now_ms: float) -> float:
        """The time the rate is over, in ms (Kafka's ``Rate.windowSize``; drops obsolete samples first)."""
        expiry = self.samples_max * self.window_ms
        for i, s in enumerate(self.samples):
            if now_ms - s.start_ms >= expiry:
                self.samples[i] = _Sample(now_ms)
        oldest = min((s.start_ms for s in self.samples), default=now_ms)
        elapsed = now_ms - oldest
        full = int(elapsed // self.window_ms)
        if full < self.samples_max - 1:
            elapsed += (self.samples_max - 1 - full) * self.window_ms
        return max(elapsed, 1.0)


@dataclass(slots=True)
class _Sensor:
    rate: Rate
    used: float


class ClientQuotaManager:
    """The fetch quotas of the proxy's remote bytes. Used on the event loop only (no lock)."""

    def __init__(self, samples: int, window_seconds: float) -> None:
        self.samples, self.window_ms = samples, window_seconds * 1000
        self.quotas = ClientQuotas()
        self.sensors: dict[tuple[int | None, str, str], _Sensor] = {}

    def update(self, quotas: ClientQuotas) -> None:
        """New quotas from the cluster; sensors idle for an hour are dropped."""
        if quotas != self.quotas:
            log.info("client quotas changed", consumer_byte_rate={_entity_name(e): r for e, r in quotas.rates.items()})
        self.quotas = quotas
        now = time.monotonic()
        for key in [k for k, s in self.sensors.items() if now - s.used > SENSOR_EXPIRY_SECONDS]:
            del self.sensors[key]

    def max_bytes(self, user: str | None, client_id: str) -> int | None:
        """At most this many remote bytes in one answer: what the quota allows in a window with nothing
        recorded (Kafka's ``getMaxValueInQuotaWindow``), None without a quota."""
        limit = self.quotas.limit(self.quotas.metric_tags(user, client_id))
        return None if limit is None else int(limit * (self.samples - 1) * self.window_ms / 1000)

    def throttle(self, node: int | None, user: str | None, client_id: str, answer: Any, version: int,
                 served_remote: set[tuple[Any, int]]) -> tuple[Any, int]:  # fmt: skip
        """Count a Fetch answer's remote bytes (its partitions in ``served_remote``) to the client's rate at
        the broker ``node``: the answer and 0, or, when this takes the rate over the quota, the answer with
        its throttle time and that time in ms."""
        throttle_ms = self.record(node, user, client_id, remote_bytes(answer, version, served_remote))
        return (throttled(answer, throttle_ms), throttle_ms) if throttle_ms else (answer, 0)

    def record(self, node: int | None, user: str | None, client_id: str, value: int, now: float | None = None) -> int:
        """Count ``value`` remote bytes to the client's rate at the broker ``node``: 0, or the throttle time in
        ms when they would take it over the quota (then they are not counted: the answer goes out empty)."""
        if not self.quotas.rates:
            return 0
        tags = self.quotas.metric_tags(user, client_id)
        limit = self.quotas.limit(tags)
        if limit is None:
            return 0
        now = time.monotonic() if now is None else now
        sensor = self.sensors.get((node, *tags))
        if sensor is None:
            sensor = self.sensors[(node, *tags)] = _Sensor(Rate(self.samples, self.window_ms), now)
        sensor.used = now
        now_ms = now * 1000
        sensor.rate.record(value, now_ms)
        observed = sensor.rate.measure(now_ms)
        if observed <= limit:
            return 0
        throttle_ms = round((observed - limit) / limit * sensor.rate.window_size(now_ms))
        if throttle_ms > 0:
            sensor.rate.record(-value, now_ms)  # Kafka's unrecordQuotaSensor: the records are not sent
        return throttle_ms

    async def follow(self, connect: Callable[[], Awaitable[FrameProtocol]], props: dict[str, str],
                     every: float, timeout: float) -> None:  # fmt: skip
        """Read the cluster's client quotas now and every ``every`` seconds until cancelled; a failed read
        keeps the quotas last read (logged when the failure begins and when it ends)."""
        failing: str | None = None
        while True:
            try:
                self.update(await describe_client_quotas(connect, props, timeout))
                if failing is not None:
                    log.info("client quotas read again")
                failing = None
            except (TieringError, OSError) as exc:
                if str(exc) != failing:
                    log.warning("the cluster's client quotas could not be read; the last ones read stay in force",
                                error=str(exc))  # fmt: skip
                failing = str(exc)
            await asyncio.sleep(every)


async def describe_client_quotas(connect: Callable[[], Awaitable[FrameProtocol]], props: dict[str, str],
                                 timeout: float) -> ClientQuotas:  # fmt: skip
    """Every client quota entity of the cluster (DescribeClientQuotas v1, no filter, as ``kafka-configs
    --describe --entity-type clients --entity-type users`` asks), on a connection of the proxy's own."""
    async with asyncio.timeout(timeout):
        protocol = await connect()
    admin = AdminConnection(protocol, timeout)
    try:
        await admin.login(props)
        answer = await admin.request(DESCRIBE_CLIENT_QUOTAS, 1, components=(), strict=False)
    finally:
        admin.close()
    if answer.error_code != 0:
        raise AdminError(f"DescribeClientQuotas: {answer.error_code.name} {answer.error_message or ''}".strip())
    return ClientQuotas.from_answer(answer)


def remote_bytes(answer: Any, version: int, served_remote: set[tuple[Any, int]]) -> int:
    """Record bytes of a Fetch answer's partitions answered from the remote copies."""
    key_field = "topic_id" if version >= 13 else "topic"
    return sum(len(p.records or b"") for t in answer.responses for p in t.partitions
               if (getattr(t, key_field), int(p.partition_index)) in served_remote)  # fmt: skip


def throttled(answer: Any, throttle_ms: int) -> Any:
    """The broker's answer to a throttled Fetch (``FetchContext.getThrottledResponse``): no partitions, no
    session, ``throttle_time_ms`` the larger of the broker's (for its part) and the proxy's."""
    changes: dict[str, Any] = {
        "responses": (),
        "throttle_time": max(answer.throttle_time, datetime.timedelta(milliseconds=throttle_ms)),
    }
    if hasattr(answer, "session_id"):
        changes["session_id"] = i32(0)
    if hasattr(answer, "node_endpoints"):
        changes["node_endpoints"] = ()
    return dataclasses.replace(answer, **changes)


def _entity_name(entity: Entity) -> str:
    user, client_id = entity
    parts = ([] if user is None else [f"users/{user}"]) + ([] if client_id is None else [f"clients/{client_id}"])
    return "/".join(parts)
