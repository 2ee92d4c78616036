"""One client connection: requests forwarded to one broker connection, answers written back in order.

Two tasks per connection. The reading task takes each request frame, hands it to the handler of its API
key (``handlers.py``: forward it as it is, forward a rewritten request, answer from remote storage, or
both) and queues the *slot* the handler gives for its answer; the writing task takes the slots in
request order, reads the broker's answer for those that went to the broker (the broker answers a
connection's requests in order, so the next frame from it is the answer of the oldest forwarded slot),
completes it with the slot's ``finish`` (rewritten addresses, remote partitions, remote offsets) and
writes it. A Produce with acks=0 gets no answer from the broker and no slot. At most
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
import functools
import struct
import time
from collections.abc import Awaitable, Callable
from typing import Any

from reader.proxy.authentication import Authentication
from reader.proxy.budget import SMALL_FRAME, ByteBudget
from reader.proxy.fetch import FETCH
from reader.proxy.fetch_ahead import FetchAhead, Given, Held, NextFetch, next_fetch, served
from reader.proxy.frames import UPSTREAM_MAX_FRAME, FrameProtocol, Unread, sized
from reader.proxy.handlers import handler_for
from reader.proxy.lane import Lane, LaneThreads, account
from reader.proxy.protocol import can_parse, peek_request, read_request_head
from reader.proxy.remote_lane import Chain, RemoteLane
from reader.proxy.services import ProxyServices
from reader.proxy.slots import Answer, Request, Slot
from reader.proxy.splice import Relay
from tiering_core.errors import TieringError
from tiering_core.logs import get_logger

log = get_logger(__name__)
_SIZE = struct.Struct(">i")
UNREAD_UP_TO = (1 << 31) - 1  # a pass-through answer of any size goes through a pipe (one, a chunk at a time)


class ConnectionClosed(Exception):
    """Why a connection ends (its reason is logged and counted)."""

    def __init__(self, reason: str, detail: str = "") -> None:
        self.reason = reason
        super().__init__(f"{reason}: {detail}" if detail else reason)


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
        s = self.settings
        self.fetch_ahead = (
            FetchAhead(s.fetch_ahead_max_age_seconds, server.metrics.fetch_ahead) if s.fetch_ahead else None
        )
        self.asking: asyncio.Task[None] | None = None  # a Fetch being asked ahead (``_ask_ahead``)
        self.order = asyncio.Lock()  # a request is forwarded and its slot queued in one step, whoever asks it
        self.writing = False  # the writing task holds a slot (lane.py: a lane starts only while it holds none)
        self.lane: Lane | None = None  # the connection's native lane, made at its first use (lane.py)
        self.remote_lane: RemoteLane | None = None  # its remote lane, the same way (remote_lane.py)
        sock = writer.get_extra_info("socket")
        plain = sock is not None and writer.get_extra_info("sslcontext") is None
        self.client_fd = sock.fileno() if plain else None  # answers may be spliced to it (splice.py)

    async def serve(self) -> None:
        tasks = [asyncio.create_task(self._read_requests()), asyncio.create_task(self._write_answers())]
        try:
            await asyncio.gather(*tasks)  # the first error of either ends the connection
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
            for task in (*tasks, self.asking):
                if task is not None:
                    task.cancel()
            # A task keeps its error, whose traceback keeps this frame (it raised the error here): without the
            # tasks let go, that reference cycle would keep the frames of the connection's tasks (the last request
            # routed, the answer being written) until the garbage collector runs (docs/design.md, "Answers freed
            # when sent")
            tasks.clear()
            while not self.slots.empty():  # answers never to go out: let go of them with their plans and views now
                self.slots.get_nowait()
            for lane in (self.lane, self.remote_lane):  # its thread lets go of the sockets before they close
                if lane is not None:
                    await lane.stop()
                    lane.close()
            if self.fetch_ahead is not None:
                self.fetch_ahead.close()
            if self.upstream is not None:
                self.upstream.close()
            self.server.answers.release(self.remote_held)
            self.remote_held = 0
            self.client_writer.close()
            with contextlib.suppress(Exception):
                await self.client_writer.wait_closed()
            # asyncio keeps the client socket's error (in the reader and the protocol's closed future) with its
            # traceback; where a write raised it, the traceback's frame was called by the writing task, whose frame
            # holds this connection, which holds the reader: a cycle holding the answer being written
            if (error := self.client_reader.exception()) is not None:
                error.__traceback__ = None

    # -- requests -------------------------------------------------------------------------------
    async def _read_requests(self) -> None:
        s = self.settings
        pending: bytes | None = None  # a request a lane read and gave back (lane.py)
        while True:
            if pending is not None:
                frame, pending = pending, None
                await self.server.requests.take(len(frame))
            else:
                frame = await read_frame(self.client_reader, self._max_frame, s.idle_timeout_seconds,
                                         s.frame_timeout_seconds, f"client {self.peer}",
                                         self.server.requests)  # fmt: skip
            if frame is None:
                await self.slots.put(None)
                return
            if (mute := self.throttled_until - time.monotonic()) > 0:  # as the broker mutes a throttled channel
                await asyncio.sleep(mute)
            async with self.order:
                try:
                    slot = await self._route(frame)
                finally:
                    self.server.requests.release(len(frame))  # forwarded (or the connection is closing)
                if slot is not None and self._lane_may_take(slot):
                    try:
                        pending = await self._run_lane(slot)
                    except EOFError:
                        await self.slots.put(None)
                        return
                    continue
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
        return await handler_for(api_key, version)(self, Request(frame, api_key, version, correlation_id, started))

    # -- the broker side ------------------------------------------------------------------------
    async def _connect(self) -> None:
        if self.upstream is None:
            self.upstream = await self.server.open_upstream(self.node_id)

    async def forward(self, frame: bytes) -> None:
        assert self.upstream is not None
        await self.upstream.write_frame(frame)

    def client_waiting(self) -> bool:
        return bool(self.client_writer.transport.get_write_buffer_size())

    # -- answers --------------------------------------------------------------------------------
    async def _write_answers(self) -> None:
        writer = self.client_writer
        while True:
            self.writing = False
            slot = await self.slots.get()
            if slot is None:
                return
            self.writing = True
            answer = None
            if slot.upstream:
                assert self.upstream is not None
                answer = await self.upstream.next_frame(self._unread_up_to(slot))
                if isinstance(answer, Unread):
                    answer = await self._splice(slot, answer)
                    if answer is None:  # moved to the client as the broker sent it
                        continue
                if answer is None:
                    raise ConnectionClosed("broker closed", f"broker of node {self.node_id} closed the connection")
                (correlation_id,) = _SIZE.unpack_from(answer, 0)
                if correlation_id != slot.correlation_id:
                    raise ConnectionClosed("protocol", f"the broker answered correlation id {correlation_id}, "
                                           f"expected {slot.correlation_id}")  # fmt: skip
            if not self.auth.done and answer is not None:
                self.auth.answered(slot.api_key, slot.version, answer)
            out = await slot.finish(slot, answer) if slot.finish is not None else None
            if slot.ahead is not None:  # asked ahead of the client: held for its next Fetch, not written
                assert answer is not None
                slot.ahead.arrived(self._held(slot, answer, out), functools.partial(self._done, slot, len(answer)))
                continue
            # wanted() notes when the answer went out, whatever it gave (slot.given: what its ``finish`` read)
            if slot.next is not None and self.fetch_ahead is not None and self.fetch_ahead.wanted() and slot.given:
                self._ask_ahead(slot.next, slot.given)
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
            self._done(slot, len(answer) if answer is not None else 0)
            if slot.served is not None:
                slot.served.free()
            self.server.metrics.answered(slot.api_key, slot.source, size, time.perf_counter() - slot.started)

    def _done(self, slot: Slot, received: int) -> None:
        """A slot's answer is out (or dropped): the broker frame's ``received`` bytes and its remote answer's
        budget go back."""
        if received:
            assert self.upstream is not None
            self.upstream.done(received)
        if slot.held:
            self.server.answers.release(slot.held)
            self.remote_held -= slot.held
            slot.held = 0

    # -- fetch ahead (fetch_ahead.py) -------------------------------------------------------------
    def _held(self, slot: Slot, answer: memoryview, out: Answer | None) -> Held | None:
        """The answer of a Fetch asked ahead as it will be written, if it is one to serve: not one without
        records (the client's own Fetch may wait at the broker for data; this one was asked with no wait), nor
        one throttled, with an error or with node endpoints."""
        given = slot.given
        if given is None or not any(part.records for part in given):
            return None
        if out is None:
            return Held([sized(answer)], given, local=slot.gate is not None)
        return Held(list(out) if isinstance(out, list) else [out], given, remote=slot.remote)

    def _ask_ahead(self, request: NextFetch, given: list[Given]) -> None:
        """Ask the broker now for the Fetch the client will send next if the answer to ``request`` (which gave
        ``given``) shows more data waiting. Not while the client is throttled, before it authenticated, or while
        the answer budget is more than half used: answers asked ahead are the first thing to go when memory is
        short, so they never make a client's own answer wait for room."""
        assert self.fetch_ahead is not None
        if self.throttled_until > time.monotonic() or (self.asking is not None and not self.asking.done()):
            return
        answers = self.server.answers
        if not self.auth.done or 2 * answers.used > answers.capacity:
            return
        frame = next_fetch(request, given)
        if frame is not None:
            self.asking = asyncio.create_task(self._send_ahead(frame, request, self.fetch_ahead.routed))

    async def _send_ahead(self, frame: bytes, request: NextFetch, routed: int) -> None:
        """Send the Fetch asked ahead through the Fetch handler and queue its slot, in order with the client's
        requests. A broken broker connection is left to the reading and writing tasks, which see it too; any
        other failure may have sent the request without its slot, so the broker connection is closed and the
        connection ends as for a broker gone (never an answer out of order)."""
        try:
            await self._queue_ahead(frame, request, routed)
        except (ConnectionError, OSError) as exc:  # the connection's own tasks see it and close the connection
            log.info("a Fetch asked ahead found the broker connection broken", client=self.peer, reason=str(exc))
        except Exception:
            log.error("a Fetch asked ahead failed; the connection closes", client=self.peer, exc_info=True)
            if self.upstream is not None:
                self.upstream.close()

    async def _queue_ahead(self, frame: bytes, request: NextFetch, routed: int) -> None:
        assert self.fetch_ahead is not None
        async with self.order:
            asked = self.fetch_ahead.ask(frame, request, routed)
            if asked is None:
                return
            ahead, send = asked
            (correlation_id,) = _SIZE.unpack_from(send, 4)
            req = Request(send, FETCH, request.version, correlation_id, time.perf_counter(), ahead=True)
            slot = await handler_for(FETCH, request.version)(self, req)
            assert slot is not None
            slot.ahead = ahead
            await self.slots.put(slot)
            self.fetch_ahead.held = ahead  # queued: the client's next Fetch may claim it

    # -- the native lane (lane.py) --------------------------------------------------------------
    def _lane_may_take(self, slot: Slot) -> bool:
        """Whether the client's Fetch that claimed an answer asked ahead (``slot``) may start a lane: the answer is
        the broker's to a request of the broker's partitions alone, or one from remote storage a remote lane may
        serve (remote_lane.py; the client has no fetch quota of the proxy's), the connection is plain TCP,
        authenticated and not throttled, every answer before it is out, and nothing is buffered on either side."""
        held = slot.served
        if self.server.lanes is None or held is None or slot.next is None or self.client_fd is None:
            return False
        answer = held.answer.result()
        if answer is None:
            return False
        if answer.remote is not None:
            client_id = read_request_head(slot.next.frame).client_id or ""
            if not self.server.remote_lanes or self.server.quotas.max_bytes(self.auth.user, client_id) is not None:
                return False
        elif not answer.local or len(answer.pieces) != 1:
            return False
        if not self.auth.done or self.throttled_until > time.monotonic() or self.writing or not self.slots.empty():
            return False
        if self.asking is not None and not self.asking.done():
            return False
        transport = self.client_writer.transport
        buffered = getattr(self.client_reader, "_buffer", None)  # what asyncio's StreamReader holds, not yet read
        return buffered is not None and not buffered and not transport.get_write_buffer_size()

    async def _run_lane(self, slot: Slot) -> bytes | None:
        """Serve ``slot`` (its held answer) and the client's Fetch requests after it on a lane, while they are the
        ones predicted; the client frame it gave back (None: nothing pending). Where the lane cannot take it after
        all, the slot is queued as usual. Raises EOFError when the client closed between requests."""
        held, request = slot.served, slot.next
        assert held is not None and request is not None and self.upstream is not None
        answer = held.answer.result()
        assert answer is not None
        threads = self.server.lanes
        assert threads is not None and self.client_fd is not None
        broker_fd = self.upstream.socket_fd()
        if broker_fd is None or not threads.acquire():
            await self.slots.put(slot)
            return None
        try:
            if answer.remote is not None:
                return await self._run_remote_lane(slot, threads, broker_fd)
            return await self._run_native_lane(slot, threads, broker_fd)
        finally:
            threads.release()

    async def _run_native_lane(self, slot: Slot, threads: LaneThreads, broker_fd: int) -> bytes | None:
        held, request, budget, s = slot.served, slot.next, self.server.answers, self.settings
        assert held is not None and request is not None and self.upstream is not None and self.client_fd is not None
        answer = held.answer.result()
        assert answer is not None
        if self.lane is None or self.lane.version != slot.version:
            if self.lane is not None:
                self.lane.close()
            self.lane = Lane(self.client_fd, broker_fd, slot.version, min(s.max_frame_bytes, SMALL_FRAME),
                             UPSTREAM_MAX_FRAME, s.fetch_max_bytes, s.fetch_ahead_max_age_seconds,
                             s.frame_timeout_seconds, s.idle_timeout_seconds)  # fmt: skip
        bound = self.lane.start(request.frame, served(answer, slot.correlation_id)[0])
        charge = 2 * bound if bound is not None else 0
        if bound is None or not budget.take_now(charge):
            await self.slots.put(slot)
            return None
        try:
            if not self.upstream.lend():
                await self.slots.put(slot)
                return None
            held.free()  # the lane holds its own copy
            lane = self.lane
            return await self._lane_runs(lambda: lane.run(threads), slot.version, self.server.metrics.native_lane,
                                         "broker", self.server.count_passed)  # fmt: skip
        finally:
            budget.release(charge)

    async def _run_remote_lane(self, slot: Slot, threads: LaneThreads, broker_fd: int) -> bytes | None:
        """``_run_lane`` for a remote answer: the remote lane handed the answers read-ahead holds (``Chain``), more
        handed each time it comes back for them (waiting for the store, on a remote thread, when none is in memory:
        the client waits for that read on any path), none once the client has a fetch quota of the proxy's (the
        cluster's quotas are read while lanes run: its answers are counted and throttled on the event loop)."""
        held, request, server, s = slot.served, slot.next, self.server, self.settings
        assert held is not None and request is not None and self.upstream is not None and self.client_fd is not None
        answer = held.answer.result()
        assert answer is not None and answer.remote is not None
        if self.remote_lane is None or self.remote_lane.version != slot.version:
            if self.remote_lane is not None:
                self.remote_lane.close()
            self.remote_lane = RemoteLane(self.client_fd, broker_fd, slot.version, min(s.max_frame_bytes, SMALL_FRAME),
                                          UPSTREAM_MAX_FRAME, s.fetch_ahead_max_age_seconds, s.frame_timeout_seconds,
                                          s.idle_timeout_seconds)  # fmt: skip
        lane = self.remote_lane
        if not lane.start(request, served(answer, slot.correlation_id), answer.remote, answer.given):
            await self.slots.put(slot)
            return None
        chain = Chain(answer.remote, request, answer.given, server.view, server.answers)
        try:
            if not self.upstream.lend():
                lane.lane.finish()  # let go of the answer's pieces at its next run; this one goes the usual way
                await self.slots.put(slot)
                return None
            chain.hand(lane, block=False)
            loop = asyncio.get_running_loop()

            client_id = read_request_head(request.frame).client_id or ""

            async def run() -> tuple[Any, ...]:
                if server.quotas.max_bytes(self.auth.user, client_id) is not None:
                    chain.ended = True  # a quota set meanwhile: the answer due goes out, the rest on the loop
                    lane.lane.finish(drop_queued=True)
                nothing = not lane.lane.queued() and not chain.hand(lane, block=False)
                if nothing and not await loop.run_in_executor(server.remote_pool, chain.hand, lane, True):
                    lane.lane.finish()
                result = await lane.run(threads)
                chain.served(result[3])
                return result

            held.free()  # the lane holds the answer's pieces; its batches are in the chain's budget from here
            return await self._lane_runs(run, slot.version, server.metrics.remote_lane, "remote",
                                         lambda n: server.metrics.fetch_partitions.labels("remote").inc(n))  # fmt: skip
        finally:
            chain.close()

    async def _lane_runs(self, run: Callable[[], Awaitable[tuple[Any, ...]]], version: int, runs: Any, source: str,
                         count_partitions: Callable[[int], None]) -> bytes | None:  # fmt: skip
        """A lane's runs (``run``: one run; ``runs``: its counter of runs, ``source``: where its answers come from),
        both sockets lent to it, until it gives the connection back."""
        upstream, transport = self.upstream, self.client_writer.transport
        assert upstream is not None and self.fetch_ahead is not None
        transport.pause_reading()
        try:
            while True:
                result = await run()
                account(result, version, runs, source, self.server.metrics, self.fetch_ahead,
                        self.server.view, count_partitions)  # fmt: skip
                outcome, detail, pending = result[0], result[1], result[2]
                if outcome != "again":
                    break
        finally:
            upstream.take_back()
            if not transport.is_closing():
                transport.resume_reading()
        self.fetch_ahead.answered = time.monotonic()
        if outcome == "request":
            return bytes(pending)
        if outcome == "done":
            return None
        if outcome == "closed":
            raise EOFError
        if outcome == "idle":
            timeout = self.settings.idle_timeout_seconds
            raise ConnectionClosed("idle", f"client {self.peer} took no answer for {timeout:.0f}s")
        if detail.startswith("the broker closed"):
            raise ConnectionClosed("broker closed", f"broker of node {self.node_id} closed the connection")
        raise ConnectionClosed("lane", f"client {self.peer}'s native lane ended ({outcome}): {detail}")

    # -- zero-copy pass-through (splice.py) ------------------------------------------------------
    def _unread_up_to(self, slot: Slot) -> int:
        """How large an answer of ``slot`` may be to go through a pipe rather than a buffer (splice.py): any
        pass-through Fetch answer on plain sockets once the connection authenticated (the SASL exchange reads
        its answers), unless the proxy reads it to ask the next Fetch ahead or holds it; 0: it is received
        into a buffer."""
        if self.server.pipes is None or slot.gate is None or not self.auth.done or self.client_fd is None:
            return 0
        if slot.next is not None or slot.ahead is not None:
            return 0
        return UNREAD_UP_TO

    async def _splice(self, slot: Slot, unread: Unread) -> memoryview | None:
        """The answer left in the broker's socket: sent on through a pipe as it arrives (None), or, where
        nothing went out and it must be read whole, returned in a buffer (after its size prefix)."""
        upstream, pipes = self.upstream, self.server.pipes
        assert upstream is not None and pipes is not None and slot.gate is not None and self.client_fd is not None
        broker_fd = upstream.socket_fd()
        if broker_fd is None:
            raise ConnectionClosed("protocol", "the broker connection is not plain TCP")
        await self._flushed()
        relay = Relay(pipes, broker_fd, self.client_fd)
        timeout = self.settings.idle_timeout_seconds
        try:
            got = await relay.relay(unread.head, unread.size, slot.version, slot.correlation_id, slot.gate, timeout)
        except TimeoutError:
            raise ConnectionClosed("idle", f"client {self.peer} took no answer for {timeout:.0f}s") from None
        finally:
            relay.close()
        upstream.unread_done()
        if isinstance(got, bytearray):
            self.server.metrics.zero_copy.labels("buffered").inc()
            return memoryview(got)[4:]
        upstream.done(unread.size)
        self.server.metrics.zero_copy.labels("changed" if got.changed else "spliced").inc()
        self.server.metrics.answered(slot.api_key, slot.source, 4 + unread.size, time.perf_counter() - slot.started)
        return None

    async def _flushed(self) -> None:
        """Wait until the client's transport holds nothing (a spliced answer goes after every byte before it)."""
        transport = self.client_writer.transport
        if transport.get_write_buffer_size():
            low, high = transport.get_write_buffer_limits()
            transport.set_write_buffer_limits(high=0, low=0)
            try:
                await self._drain()
            finally:
                transport.set_write_buffer_limits(high=high, low=low)

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
