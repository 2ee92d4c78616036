"""The Fetch handler: a request planned against the remote copies (``fetch.py``), the broker asked for its
part and a probe per remote partition, the broker's answer merged with the remote partitions.

Its Python work on the event loop runs in turns (``turns.py``); remote reads and merges that wait on the
store run on the remote threads. Memory (docs/design.md, "Memory and backpressure"): a remote answer's
bytes are taken from the server's answer budget before it is read, and given back once the client took it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

from kio.static.primitive import i32

from reader.proxy.fetch import FETCH, FetchPlan
from reader.proxy.fetch_ahead import Ahead, NextFetch, client_layout, given_by_body, given_by_scan, served
from reader.proxy.fetch_answer import encode_fetch_answer
from reader.proxy.fetch_request import patched_fetch_request
from reader.proxy.fetch_scan import scan_fetch
from reader.proxy.pass_through import PassThrough
from reader.proxy.protocol import (
    parse,
    read_request_head,
    request_frame,
    request_type,
    response_body_start,
    response_type,
)
from reader.proxy.remote_lane import remote_held
from reader.proxy.slots import Answer, Exchange, Request, Slot


async def fetch(x: Exchange, req: Request) -> Slot:
    """A Fetch: planned against the remote copies, the broker asked for its part and a probe per remote
    partition, the answer merged (fetch.py)."""
    frame, version, correlation_id, started = req.frame, req.version, req.correlation_id, req.started
    server = x.server
    layout = None  # a client's Fetch whose next one may be asked ahead: where its fields are (fetch_ahead.py)
    if x.fetch_ahead is not None and not req.ahead:
        body_at = read_request_head(frame).body
        layout = client_layout(frame, body_at, version)
        if (held := await x.fetch_ahead.claim(frame, layout)) is not None:
            assert layout is not None  # claimed: its key matched
            return _serve_held(req, held, NextFetch(frame, body_at, version, layout))
    turns = server.fetch_turns
    loop = asyncio.get_running_loop()
    sent = False
    async with turns:
        head = read_request_head(frame)
        client_id = head.client_id or ""
        request = parse(request_type(FETCH, version), frame, head.body)
        clamped = int(getattr(request, "max_bytes", 0)) > x.settings.fetch_max_bytes
        if clamped:  # the broker's fetch.max.bytes: one answer always fits the answer budget (config.py)
            request = dataclasses.replace(request, max_bytes=i32(x.settings.fetch_max_bytes))
        plan = FetchPlan.make(version, request, server.view)
        if not plan.unconfirmed:
            ahead = _read_ahead_budget(x, plan, client_id)
            if ahead is None or plan.probes_only:  # nothing to read before the broker is asked: in this turn
                await _ask_broker(x, plan, request, head, frame, clamped, ahead is not None)
                sent = True
    if plan.unconfirmed:
        plan = await loop.run_in_executor(server.remote_pool, FetchPlan.make, version, request, server.view, True)
        ahead = _read_ahead_budget(x, plan, client_id)
    held = ahead or 0  # answer budget taken for the remote answer
    if not sent:
        if ahead is not None and not plan.probes_only:  # the broker is asked for what the remote part left
            async with turns:
                plan.read_remote(server.view, block=False)
            if plan.ahead_unread:
                await loop.run_in_executor(server.remote_pool, plan.read_remote, server.view)
            plan.limit_upstream()
        async with turns:
            await _ask_broker(x, plan, request, head, frame, clamped, ahead is not None)
    reading: asyncio.Future[None] | None = None
    if ahead is not None and plan.ahead_unread:  # what read-ahead did not hold: read while the broker answers
        reading = loop.run_in_executor(server.remote_pool, plan.read_remote, server.view)

    gate = None if plan.remote else PassThrough(server, plan, turns)

    async def finish(slot: Slot, answer: memoryview | None) -> Answer | None:
        assert answer is not None
        nonlocal held
        start = response_body_start(answer, FETCH, version)
        if gate is not None:  # one scan (fetch_scan.py) for the decision and for asking the next Fetch ahead
            records_at: list[int] = []
            scan = scan_fetch(answer, version, start, records_at)
            if await gate.passes(scan):
                if x.fetch_ahead is not None:
                    slot.given = given_by_scan(answer, start, scan, records_at)
                return None
        if reading is not None:
            await reading  # before ``unread`` is asked: a partition is never read twice
        async with turns:
            body = parse(response_type(FETCH, version), answer, start)
            remote_now = bool(plan.unread or plan.out_of_range(body))
            if not held and remote_now:  # remote records to come: room first
                want = _remote_charge(x, plan, [max_bytes for _, _, max_bytes in plan.offsets.values()])
                held = server.answers.take_upto(want)
                x.remote_held += held
                if held < want:  # a smaller answer now rather than a wait behind clients that do not read
                    plan.max_bytes = held // 2
            if not remote_now and plan.remote:
                body, changed = plan.merge(body, server.view)
            else:
                changed = False
        if remote_now:  # remote reads, the catalog: off the event loop
            body, changed = await loop.run_in_executor(server.remote_pool, plan.merge, body, server.view)
        async with turns:
            x.fetch_allowed.update(plan.allowed)
            x.fetch_allowed.difference_update(plan.denied)
            rewritten = server.router.rewrite(FETCH, body)
            changed = changed or rewritten is not body
            body = rewritten
            slot.held = held = _account(x, held, body) if changed else held
            server.count_fetch(body, plan)
            body, throttle_ms = server.quotas.throttle(x.node_id, x.auth.user, client_id, body, version,
                                                       plan.served_remote)  # fmt: skip
            out = encode_fetch_answer(correlation_id, version, body) if changed or throttle_ms else None
            if x.fetch_ahead is not None:
                slot.given = given_by_body(body, version)
                if server.remote_lanes and not throttle_ms:
                    slot.remote = remote_held(plan, body, plan.sent)
        if throttle_ms:  # KIP-219: the (empty) answer goes out now and the connection's next requests wait
            server.metrics.throttle_seconds.inc(throttle_ms / 1000)
            x.throttled_until = max(x.throttled_until, time.monotonic() + throttle_ms / 1000)
            if version < 8:  # clients before KIP-219 do not wait on their own: the answer waits instead
                await asyncio.sleep(throttle_ms / 1000)
            return out
        if plan.remote and plan.empty(body):
            await asyncio.sleep(max(0.0, plan.max_wait_ms / 1000 - (time.perf_counter() - started)))
        return out

    source = "remote" if plan.remote else "broker"
    slot = Slot(FETCH, version, correlation_id, started, True, finish, source, gate=gate)
    if layout is not None:
        slot.next = NextFetch(frame, head.body, version, layout)
    return slot


def _serve_held(req: Request, held: Ahead, request: NextFetch) -> Slot:
    """A client Fetch (``request``) answered with the answer of the Fetch asked ahead for it (fetch_ahead.py)."""
    answer = held.answer.result()
    assert answer is not None

    async def finish(_slot: Slot, _answer: memoryview | None) -> Answer:
        return served(answer, req.correlation_id)

    slot = Slot(FETCH, req.version, req.correlation_id, req.started, False, finish, served=held, given=answer.given)
    slot.next = request
    return slot


async def _ask_broker(x: Exchange, plan: FetchPlan, request: Any, head: Any, frame: bytes, clamped: bool,
                      ahead: bool) -> None:  # fmt: skip
    """Send the broker its part of the request (patched where the plan changed it). With ``ahead`` and only
    probes asked, then read on the event loop the remote partitions read-ahead holds in memory, while the
    broker answers: no hop to a thread and back, and no thread holding the GIL when the answer arrives (both
    measured to cost more than the read, docs/design.md). Run it in a turn."""
    server = x.server
    room = max(0, server.answers.capacity - server.answers.used)
    if room < int(getattr(plan.upstream, "max_bytes", 0)):  # the broker's answer within the free room
        plan.upstream = dataclasses.replace(plan.upstream, max_bytes=i32(room))
        clamped = True
    sessionless = getattr(request, "session_epoch", -1) == -1 and getattr(request, "session_id", 0) == 0
    if clamped or plan.remote or not sessionless or plan.upstream.topics != request.topics:
        patched = patched_fetch_request(frame, head.body, plan.version, plan.upstream)  # fetch_request.py
        frame = patched if patched is not None else request_frame(head, frame, plan.upstream)
    plan.sent = frame
    await x.forward(frame)
    if ahead and plan.probes_only:
        plan.read_remote(server.view, block=False)


def _read_ahead_budget(x: Exchange, plan: FetchPlan, client_id: str) -> int | None:
    """The answer budget taken to read the remote partitions ahead of the broker's answer; None when they are
    read once it is merged. Read ahead only for topics the broker allowed on this connection before: a hint
    for speed, not a decision (``merge`` sends nothing the broker did not allow in its answer to this
    request). Caps the plan's ``max_bytes`` at the client's quota, as the broker (larger would always be
    throttled)."""
    quota_bytes = x.server.quotas.max_bytes(x.auth.user, client_id)
    if plan.remote and quota_bytes is not None:
        plan.max_bytes = min(plan.max_bytes, quota_bytes)
    if not plan.remote or not all(part.key in x.fetch_allowed for part in plan.remote):
        return None
    charge = _remote_charge(x, plan, [part.max_bytes for part in plan.remote])
    return charge if _take_ahead(x, charge) else None


def _remote_charge(x: Exchange, plan: FetchPlan, partition_max_bytes: list[int]) -> int:
    """Answer budget for a remote answer: its records (a partition gives at most the rest of one window and
    the next window's batches, the answer at most max_bytes) held twice while it is built, as records and
    encoded."""
    window = x.server.settings.fetch_window_bytes
    return 2 * min(plan.max_bytes, sum(min(m, 2 * window) for m in partition_max_bytes))


def _account(x: Exchange, held: int, body: Any) -> int:
    """The answer budget an encoded answer holds: its records twice (parsed and encoded), counted even when
    that is beyond what was taken (the first partition with data may bring one batch beyond the room)."""
    need = 2 * sum(len(p.records or b"") for t in body.responses for p in t.partitions)
    if need > held:
        x.server.answers.force(need - held)
        x.remote_held += need - held
        return need
    return held


def _take_ahead(x: Exchange, charge: int) -> bool:
    """Whether a remote read may start before the broker answers: the client is taking its answers (none
    waits in the transport) and the answer budget has room now. Otherwise it is read when the broker's
    answer is merged, within the room free then."""
    if x.client_waiting() or not x.server.answers.take_now(charge):
        return False
    x.remote_held += charge
    return True
