"""The proxy's request handlers by API key (Kroxylicious' filters): what each kind of request needs on its
way to the broker and what its answer needs on the way back. A connection only moves frames and keeps their
order (connection.py); the table here decides, per API key and version:

- Fetch: planned against the remote copies and merged (fetch_handler.py);
- Metadata, FindCoordinator, DescribeCluster, ApiVersions, Produce v10+: the answer's broker addresses
  rewritten to the proxy's (ApiVersions: only the versions the proxy can read are offered);
- ListOffsets, OffsetForLeaderEpoch: the broker's answer completed from the remote copies, on the offsets
  threads;
- a version the proxy cannot read: passed through as bytes, but an ApiVersions it cannot read is answered
  UNSUPPORTED_VERSION at v0 (the client asks again lower; Kroxylicious' ``ApiVersionsDowngrader``);
- everything else: passed through as bytes (a Produce with acks=0 gets no answer and no slot).
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Awaitable, Callable
from typing import Any

from reader.proxy import answers
from reader.proxy.fetch import FETCH
from reader.proxy.fetch_handler import fetch
from reader.proxy.protocol import (
    ProtocolError,
    can_parse,
    parse,
    read_request_head,
    request_type,
    response_body_start,
    response_frame,
    response_type,
)
from reader.proxy.routing import DESCRIBE_CLUSTER, FIND_COORDINATOR, METADATA, PRODUCE
from reader.proxy.slots import Answer, Exchange, Finish, Request, Slot
from reader.proxy.wire import string_length

LIST_OFFSETS, OFFSET_FOR_LEADER_EPOCH, API_VERSIONS = 2, 23, 18
Handler = Callable[[Exchange, Request], Awaitable[Slot | None]]


def handler_for(api_key: int, version: int) -> Handler:
    """The handler of a request (a version the proxy cannot read is passed through, ApiVersions downgraded)."""
    if not can_parse(api_key, version):
        return _downgrade if api_key == API_VERSIONS else _forward
    return HANDLERS.get(api_key, _forward)


async def _forward(x: Exchange, req: Request) -> Slot:
    await x.forward(req.frame)
    return Slot(req.api_key, req.version, req.correlation_id, req.started, True, None)


async def _downgrade(x: Exchange, req: Request) -> Slot:
    """Never the broker's versions unfiltered: the client asks again lower."""
    frame = response_frame(req.correlation_id, API_VERSIONS, 0, answers.unsupported_api_versions())
    return Slot(req.api_key, req.version, req.correlation_id, req.started, False, _answered(frame), "proxy")


async def _addresses(x: Exchange, req: Request) -> Slot:
    await x.forward(req.frame)
    finish = _rewriting(x, req.api_key, req.version, req.correlation_id)
    return Slot(req.api_key, req.version, req.correlation_id, req.started, True, finish)


async def _produce(x: Exchange, req: Request) -> Slot | None:
    """Produce v10+ answers may name leaders (KIP-951): their addresses are rewritten. acks=0: no answer."""
    finish = _rewriting(x, PRODUCE, req.version, req.correlation_id) if req.version >= 10 else None
    await x.forward(req.frame)
    if _acks(req.frame, req.version) == 0:
        return None  # the broker does not answer acks=0
    return Slot(req.api_key, req.version, req.correlation_id, req.started, True, finish)


async def _offsets(x: Exchange, req: Request) -> Slot:
    head = read_request_head(req.frame)
    request = parse(request_type(req.api_key, req.version), req.frame, head.body)
    finish = _completing(x, req.api_key, req.version, req.correlation_id, request)
    await x.forward(req.frame)
    return Slot(req.api_key, req.version, req.correlation_id, req.started, True, finish)


def _rewriting(x: Exchange, api_key: int, version: int, correlation_id: int) -> Finish:
    async def finish(_slot: Slot, answer: memoryview | None) -> Answer | None:
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
                    x.server.view.learn_name(getattr(t, "topic_id", None), t.name)
                for b in body.brokers:  # listening (or known not to) before the addresses are given out
                    x.server.router.learn(int(b.node_id), b.host, int(b.port))
                await x.server.ensure_listeners(x.server.router.known_nodes())
            new = x.server.router.rewrite(api_key, body)
        return None if new is body else response_frame(correlation_id, api_key, version, new)

    return finish


def _completing(x: Exchange, api_key: int, version: int, correlation_id: int, request: Any) -> Finish:
    complete = answers.list_offsets if api_key == LIST_OFFSETS else answers.offset_for_leader_epoch

    async def finish(_slot: Slot, answer: memoryview | None) -> Answer | None:
        assert answer is not None
        body = parse(response_type(api_key, version), answer, response_body_start(answer, api_key, version))
        loop = asyncio.get_running_loop()
        new = await loop.run_in_executor(x.server.offsets_pool, complete, request, body, x.server.view)
        return None if new == body else response_frame(correlation_id, api_key, version, new)

    return finish


def _answered(frame: memoryview) -> Finish:
    """A slot's completion for an answer the proxy gives itself (no broker frame)."""

    async def finish(_slot: Slot, _answer: memoryview | None) -> memoryview:
        return frame

    return finish


def _acks(frame: bytes, version: int) -> int:
    """A Produce request's acks (after the header and the nullable transactional id)."""
    length, pos = string_length(frame, read_request_head(frame).body, version >= 9)
    (acks,) = struct.unpack_from(">h", frame, pos + length)
    return acks


HANDLERS: dict[int, Handler] = {
    FETCH: fetch,
    METADATA: _addresses,
    FIND_COORDINATOR: _addresses,
    DESCRIBE_CLUSTER: _addresses,
    API_VERSIONS: _addresses,
    PRODUCE: _produce,
    LIST_OFFSETS: _offsets,
    OFFSET_FOR_LEADER_EPOCH: _offsets,
}
