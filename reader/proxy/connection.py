"""One client connection: requests forwarded to one broker connection, answers written back in order.

Two tasks per connection. The reading task takes each request frame, decides what it needs (forward as
it is, forward a rewritten request, answer from remote storage, or both) and queues a *slot* for its
answer; the writing task takes the slots in request order, reads the broker's answer for those that
went to the broker (the broker answers a connection's requests in order, so the next frame from it is
the answer of the oldest forwarded slot), completes it (rewritten addresses, remote partitions, remote
offsets) and writes it. A Produce with acks=0 gets no answer from the broker and no slot. At most
``max_in_flight`` slots wait: past that the reading task stops reading from the client.

The connection to the broker is opened at the first request: a client that never sends one costs no
broker connection. Whatever goes wrong with a connection (a garbage or oversized frame, a request that
stops half way, a broker that goes away) closes that connection, and its broker connection, with a log
line; the process and every other connection go on.

Memory (docs/design.md, "Memory and backpressure"): a request's bytes are taken from the server's request
budget while it is read and forwarded; the broker's answers and remote answers from its answer budget until
the client's socket took them. A client that stops reading holds one answer being written: the writing
task waits for it (at most ``idle_timeout_seconds``, then the connection closes), so its broker connection
stops being read (``FrameProtocol``) and no remote read starts ahead for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import struct
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from kio.static.primitive import i32

from reader.proxy import answers
from reader.proxy.authentication import Authentication
from reader.proxy.budget import ByteBudget
from reader.proxy.fetch import FETCH, FetchPlan
from reader.proxy.fetch_answer import encode_fetch_answer
from reader.proxy.fetch_request import patched_fetch_request
from reader.proxy.fetch_scan import scan_fetch
from reader.proxy.frames import FrameProtocol, sized
from reader.proxy.protocol import (
    ProtocolError,
    can_parse,
    parse,
    peek_request,
    read_request_head,
    request_frame,
    request_type,
    response_body_start,
    response_frame,
    response_type,
)
from reader.proxy.routing import DESCRIBE_CLUSTER, FIND_COORDINATOR, METADATA, PRODUCE
from reader.proxy.services import ProxyServices
from tiering_core.errors import TieringError
from tiering_core.logs import get_logger

log = get_logger(__name__)
LIST_OFFSETS, OFFSET_FOR_LEADER_EPOCH, API_VERSIONS = 2, 23, 18
_SIZE = struct.Struct(">i")
Answer = bytes | memoryview | list[bytes | memoryview]  # one buffer, or pieces to write in order
Finish = Callable[[memoryview | None], Awaitable[Answer | None]]


class ConnectionClosed(Exception):
    """Why a connection ends (its reason is logged and counted)."""

    def __init__(self, reason: str, detail: str = "") -> None:
        self.reason = reason
        super().__init__(f"{reason}: {detail}" if detail else reason)


@dataclass(slots=True)
class Slot:
    """A request's answer to come, in request order."""

    api_key: int
    version: int
    correlation_id: int
    started: float
    upstream: bool  # the broker answers it (the next frame from the broker is its answer)
    finish: Finish | None  # completes the answer; None: the broker's bytes go out unchanged
    source: str = "broker"
    held: int = 0  # answer budget bytes taken for a remote answer, given back once it is out


async def read_frame(reader: asyncio.StreamReader, max_bytes: Callable[[], int], first_timeout: float | None,
                     rest_timeout: float, who: str, budget: ByteBudget) -> bytes | None:  # fmt: skip
    """The next frame's bytes (no size prefix); None at a clean end of stream. ``max_bytes()`` is asked when
    the size has arrived (the limit rises once the connection has authenticated). The frame's size is taken
    from ``budget`` before it is read; the caller gives it back."""
    try:
        async with asyncio.timeout(first_timeout):
            head = await reader.readexactly(4)
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            raise ConnectionClosed("truncated", f"{who} closed inside a frame's size") from None
        return None
    except TimeoutError:
        raise ConnectionClosed("idle", f"no request from {who} for {first_timeout:.0f}s") from None
    (size,) = _SIZE.unpack(head)
    limit = max_bytes()
    if size < 0 or size > limit:
        raise ConnectionClosed("oversized", f"{who} sent a frame of {size} bytes (at most {limit})")
    await budget.take(size)
    frame = None
    try:
        async with asyncio.timeout(rest_timeout):
            frame = await reader.readexactly(size)
        return frame
    except asyncio.IncompleteReadError:
        raise ConnectionClosed("truncated", f"{who} closed inside a frame of {size} bytes") from None
    except TimeoutError:
        raise ConnectionClosed("stalled", f"{who} stopped sending inside a frame of {size} bytes") from None
    finally:
        if frame is None:
            budget.release(size)


class ClientConnection:
    def __init__(self, server: ProxyServices, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 node_id: int | None) -> None:  # fmt: skip
        self.server = server
        self.settings = server.settings.proxy
        self.client_reader, self.client_writer = reader, writer
        self.node_id = node_id
        self.peer = str(writer.get_extra_info("peername"))
        self.slots: asyncio.Queue[Slot | None] = asyncio.Queue(self.settings.max_in_flight)
        self.upstream: FrameProtocol | None = None
        self.auth = Authentication(server.settings.sasl_listener(), server.settings.client_certificate() is not None)
        self.throttled_until = 0.0  # monotonic time until which a client over its quota is not read (KIP-219)
        self.fetch_allowed: set[Any] = set()  # topic keys whose remote reads may start before the broker answers
        self.remote_held = 0  # answer budget bytes taken for this connection's remote answers not yet out

    async def serve(self) -> None:
        tasks = [asyncio.create_task(self._read_requests()), asyncio.create_task(self._write_answers())]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                if task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
            await asyncio.gather(*tasks)
        except ConnectionClosed as exc:
            self.server.metrics.closed_bad.labels(exc.reason).inc()
            level = log.info if exc.reason in ("idle", "broker closed") else log.warning
            level("client connection closed", client=self.peer, reason=str(exc))
        except (ConnectionError, OSError, TieringError) as exc:  # a bad frame, the broker gone or unreachable
            self.server.metrics.closed_bad.labels("error").inc()
            log.warning("client connection closed", client=self.peer, reason=str(exc))
        except Exception:
            self.server.metrics.closed_bad.labels("bug").inc()
            log.error("client connection closed by an unexpected error", client=self.peer, exc_info=True)
        finally:
            for task in tasks:
                task.cancel()
            if self.upstream is not None:
                self.upstream.close()
            self.server.answers.release(self.remote_held)
            self.remote_held = 0
            self.client_writer.close()
            with contextlib.suppress(Exception):
                await self.client_writer.wait_closed()

    # -- requests -------------------------------------------------------------------------------
    async def _read_requests(self) -> None:
        s = self.settings
        while True:
            frame = await read_frame(self.client_reader, self._max_frame, s.idle_timeout_seconds,
                                     s.frame_timeout_seconds, f"client {self.peer}", self.server.requests)  # fmt: skip
            if frame is None:
                await self.slots.put(None)
                return
            if (mute := self.throttled_until - time.monotonic()) > 0:  # as the broker mutes a throttled channel
                await asyncio.sleep(mute)
            try:
                slot = await self._route(frame)
            finally:
                self.server.requests.release(len(frame))  # forwarded (or the connection is closing)
            if slot is not None:
                await self.slots.put(slot)

    def _max_frame(self) -> int:
        """Kafka's sasl.server.max.receive.size until the connection has authenticated, then max_frame_bytes."""
        s = self.settings
        return s.max_frame_bytes if self.auth.done else min(s.max_frame_bytes, s.sasl_server_max_receive_size)

    async def _route(self, frame: bytes) -> Slot | None:
        api_key, version, correlation_id = peek_request(frame)
        started = time.perf_counter()
        if not self.auth.done and can_parse(api_key, version):
            self.auth.request(api_key, version, frame)
        await self._connect()
        if not can_parse(api_key, version):
            if api_key == API_VERSIONS:  # never the broker's versions unfiltered: the client asks again lower
                downgrade = response_frame(correlation_id, API_VERSIONS, 0, answers.unsupported_api_versions())
                return Slot(api_key, version, correlation_id, started, False, _answered(downgrade), "proxy")
            await self._forward(frame)
            return Slot(api_key, version, correlation_id, started, True, None)
        if api_key == FETCH:
            return await self._fetch(frame, version, correlation_id, started)
        finish: Finish | None = None
        if api_key in (METADATA, FIND_COORDINATOR, DESCRIBE_CLUSTER, API_VERSIONS) or (
            api_key == PRODUCE and version >= 10
        ):
            finish = self._rewriting(api_key, version, correlation_id)
        elif api_key in (LIST_OFFSETS, OFFSET_FOR_LEADER_EPOCH):
            head = read_request_head(frame)
            request = parse(request_type(api_key, version), frame, head.body)
            finish = self._completing(api_key, version, correlation_id, request)
        await self._forward(frame)
        if api_key == PRODUCE and _acks(frame, version) == 0:
            return None  # the broker does not answer acks=0
        return Slot(api_key, version, correlation_id, started, True, finish)

    async def _fetch(self, frame: bytes, version: int, correlation_id: int, started: float) -> Slot:
        server = self.server
        turns = server.fetch_turns
        loop = asyncio.get_running_loop()
        async with turns:
            head = read_request_head(frame)
            request = parse(request_type(FETCH, version), frame, head.body)
            clamped = int(getattr(request, "max_bytes", 0)) > self.settings.fetch_max_bytes
            if clamped:  # the broker's fetch.max.bytes: one answer always fits the answer budget (config.py)
                request = dataclasses.replace(request, max_bytes=i32(self.settings.fetch_max_bytes))
            plan = FetchPlan.make(version, request, server.view)
        if plan.unconfirmed:
            plan = await loop.run_in_executor(server.remote_pool, FetchPlan.make, version, request, server.view, True)
        client_id = head.client_id or ""
        quota_bytes = server.quotas.max_bytes(self.auth.user, client_id)
        if plan.remote and quota_bytes is not None:  # as the broker: larger would always be throttled
            plan.max_bytes = min(plan.max_bytes, quota_bytes)
        # Read ahead of the broker's answer only for topics it allowed on this connection before: a hint for
        # speed, not a decision (``merge`` sends nothing the broker did not allow in its answer to this request).
        held = 0  # answer budget taken for the remote answer
        charge = self._remote_charge(plan, [part.max_bytes for part in plan.remote])
        reading: asyncio.Future[None] | None = None
        if plan.remote and all(part.key in self.fetch_allowed for part in plan.remote) and self._take_ahead(charge):
            held = charge
            reading = loop.run_in_executor(server.remote_pool, plan.read_remote, server.view)
            if not plan.probes_only:  # the broker is asked for what the remote part left of max_bytes
                await reading
                plan.limit_upstream()
            # else the broker answers the probes while the remote part is read (one round trip less per fetch)
        async with turns:
            room = max(0, server.answers.capacity - server.answers.used)
            if room < int(getattr(plan.upstream, "max_bytes", 0)):  # the broker's answer within the free room
                plan.upstream = dataclasses.replace(plan.upstream, max_bytes=i32(room))
                clamped = True
            sessionless = getattr(request, "session_epoch", -1) == -1 and getattr(request, "session_id", 0) == 0
            if clamped or plan.remote or not sessionless or plan.upstream.topics != request.topics:
                patched = patched_fetch_request(frame, head.body, version, plan.upstream)  # fetch_request.py
                frame = patched if patched is not None else request_frame(head, frame, plan.upstream)
        await self._forward(frame)

        async def finish(answer: memoryview | None) -> Answer | None:
            assert answer is not None
            nonlocal held
            async with turns:
                start = response_body_start(answer, FETCH, version)
                if not plan.remote:  # the broker's answer as it is, unless it has an error or addresses
                    scan = scan_fetch(answer, version, start)  # fetch_scan.py
                    plan.observe(scan.partitions, server.view)
                    if scan.plain:
                        server.count_passed(len(scan.partitions))
                        return None
            if reading is not None:
                await reading  # before ``unread`` is asked: a partition is never read twice
            async with turns:
                body = parse(response_type(FETCH, version), answer, start)
                remote_now = bool(plan.unread or plan.out_of_range(body))
                if not held and remote_now:  # remote records to come: room first
                    want = self._remote_charge(plan, [max_bytes for _, _, max_bytes in plan.offsets.values()])
                    held = server.answers.take_upto(want)
                    self.remote_held += held
                    if held < want:  # a smaller answer now rather than a wait behind clients that do not read
                        plan.max_bytes = held // 2
                if not remote_now and plan.remote:
                    body, changed = plan.merge(body, server.view)
                else:
                    changed = False
            if remote_now:  # remote reads, the catalog: off the event loop
                body, changed = await loop.run_in_executor(server.remote_pool, plan.merge, body, server.view)
            async with turns:
                self.fetch_allowed.update(plan.allowed)
                self.fetch_allowed.difference_update(plan.denied)
                rewritten = server.router.rewrite(FETCH, body)
                changed = changed or rewritten is not body
                body = rewritten
                slot.held = held = self._account(held, body) if changed else held  # ``slot`` is bound below
                server.count_fetch(body, plan)
                body, throttle_ms = server.quotas.throttle(self.node_id, self.auth.user, client_id, body, version,
                                                           plan.served_remote)  # fmt: skip
                out = encode_fetch_answer(correlation_id, version, body) if changed or throttle_ms else None
            if throttle_ms:  # KIP-219: the (empty) answer goes out now and the connection's next requests wait
                server.metrics.throttle_seconds.inc(throttle_ms / 1000)
                self.throttled_until = max(self.throttled_until, time.monotonic() + throttle_ms / 1000)
                if version < 8:  # clients before KIP-219 do not wait on their own: the answer waits instead
                    await asyncio.sleep(throttle_ms / 1000)
                return out
            if plan.remote and plan.empty(body):
                await asyncio.sleep(max(0.0, plan.max_wait_ms / 1000 - (time.perf_counter() - started)))
            return out

        slot = Slot(FETCH, version, correlation_id, started, True, finish, "remote" if plan.remote else "broker")
        return slot

    def _remote_charge(self, plan: FetchPlan, partition_max_bytes: list[int]) -> int:
        """Answer budget for a remote answer: its records (a partition gives at most one window's batches, the
        answer at most max_bytes) held twice while it is built, as records and encoded."""
        window = self.server.settings.fetch_window_bytes
        return 2 * min(plan.max_bytes, sum(min(m, window) for m in partition_max_bytes))

    def _account(self, held: int, body: Any) -> int:
        """The answer budget an encoded answer holds: its records twice (parsed and encoded), counted even when
        that is beyond what was taken (the first partition with data may bring one batch beyond the room)."""
        need = 2 * sum(len(p.records or b"") for t in body.responses for p in t.partitions)
        if need > held:
            self.server.answers.force(need - held)
            self.remote_held += need - held
            return need
        return held

    def _take_ahead(self, charge: int) -> bool:
        """Whether a remote read may start before the broker answers: the client is taking its answers (none
        waits in the transport) and the answer budget has room now. Otherwise it is read when the broker's
        answer is merged, within the room free then."""
        if self.client_writer.transport.get_write_buffer_size() or not self.server.answers.take_now(charge):
            return False
        self.remote_held += charge
        return True

    def _rewriting(self, api_key: int, version: int, correlation_id: int) -> Finish:
        async def finish(answer: memoryview | None) -> Answer | None:
            assert answer is not None
            start = response_body_start(answer, api_key, version)
            try:
                body = parse(response_type(api_key, version), answer, start)
            except ProtocolError:
                if api_key == API_VERSIONS:
                    return None  # an UNSUPPORTED_VERSION answer, written at v0: the client retries lower
                raise
            if api_key == API_VERSIONS:
                new = answers.api_versions(body)
            else:
                if api_key == METADATA:
                    for t in body.topics:
                        self.server.view.learn_name(getattr(t, "topic_id", None), t.name)
                    for b in body.brokers:  # listening (or known not to) before the addresses are given out
                        self.server.router.learn(int(b.node_id), b.host, int(b.port))
                    await self.server.ensure_listeners(self.server.router.known_nodes())
                new = self.server.router.rewrite(api_key, body)
            return None if new is body else response_frame(correlation_id, api_key, version, new)

        return finish

    def _completing(self, api_key: int, version: int, correlation_id: int, request: Any) -> Finish:
        complete = answers.list_offsets if api_key == LIST_OFFSETS else answers.offset_for_leader_epoch

        async def finish(answer: memoryview | None) -> Answer | None:
            assert answer is not None
            body = parse(response_type(api_key, version), answer, response_body_start(answer, api_key, version))
            loop = asyncio.get_running_loop()
            new = await loop.run_in_executor(self.server.offsets_pool, complete, request, body, self.server.view)
            return None if new == body else response_frame(correlation_id, api_key, version, new)

        return finish

    # -- the broker side ------------------------------------------------------------------------
    async def _connect(self) -> None:
        if self.upstream is None:
            self.upstream = await self.server.open_upstream(self.node_id)

    async def _forward(self, frame: bytes) -> None:
        assert self.upstream is not None
        await self.upstream.write_frame(frame)

    # -- answers --------------------------------------------------------------------------------
    async def _write_answers(self) -> None:
        writer = self.client_writer
        while True:
            slot = await self.slots.get()
            if slot is None:
                return
            answer = None
            if slot.upstream:
                assert self.upstream is not None
                answer = await self.upstream.next_frame()
                if answer is None:
                    raise ConnectionClosed("broker closed", f"broker of node {self.node_id} closed the connection")
                (correlation_id,) = _SIZE.unpack_from(answer, 0)
                if correlation_id != slot.correlation_id:
                    raise ConnectionClosed("protocol", f"the broker answered correlation id {correlation_id}, "
                                           f"expected {slot.correlation_id}")  # fmt: skip
            if not self.auth.done and answer is not None:
                self.auth.answered(slot.api_key, slot.version, answer)
            out = await slot.finish(answer) if slot.finish is not None else None
            if out is None:
                assert answer is not None
                writer.write(sized(answer))
                size = len(answer) + 4
            else:
                size = 0
                for piece in out if isinstance(out, list) else (out,):
                    writer.write(piece)
                    size += len(piece)
            await self._drain()
            if answer is not None:
                self.upstream.done(len(answer))  # type: ignore[union-attr]
            if slot.held:
                self.server.answers.release(slot.held)
                self.remote_held -= slot.held
            self.server.metrics.answered(slot.api_key, slot.source, size, time.perf_counter() - slot.started)

    async def _drain(self) -> None:
        """Wait until the client took the answer (all but asyncio's high-water mark of it). A client that takes
        nothing for ``idle_timeout_seconds`` is idle (Kafka's connections.max.idle.ms counts both directions):
        its connection closes and the bytes it held go back to the budgets."""
        timeout = self.settings.idle_timeout_seconds
        try:
            async with asyncio.timeout(timeout):
                await self.client_writer.drain()
        except TimeoutError:
            raise ConnectionClosed("idle", f"client {self.peer} took no answer for {timeout:.0f}s") from None


def _answered(frame: memoryview) -> Finish:
    """A slot's completion for an answer the proxy gives itself (no broker frame)."""

    async def finish(_answer: memoryview | None) -> memoryview:
        return frame

    return finish


def _acks(frame: bytes, version: int) -> int:
    """A Produce request's acks (after the header and the transactional id)."""
    head = read_request_head(frame)
    pos = head.body
    if version >= 9:  # compact nullable string: length + 1 as an unsigned varint
        length, shift = 0, 0
        while True:
            b = frame[pos]
            pos += 1
            length |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
        pos += max(length - 1, 0)
    else:
        (length,) = struct.unpack_from(">h", frame, pos)
        pos += 2 + max(length, 0)
    (acks,) = struct.unpack_from(">h", frame, pos)
    return acks
