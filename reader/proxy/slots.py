"""What a request handler gives the connection: a *slot* for the request's answer, in request order, and
what a handler sees of its connection (``Exchange``). Kroxylicious' filter context plays this part."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from reader.proxy.authentication import Authentication
from reader.proxy.config import ProxyListen
from reader.proxy.fetch_ahead import Ahead, FetchAhead, Given, NextFetch
from reader.proxy.fetch_scan import ScannedFetch
from reader.proxy.remote_lane import RemoteHeld
from reader.proxy.services import ProxyServices
from reader.proxy.splice import Gate

Answer = bytes | memoryview | list[bytes | memoryview]  # one buffer, or pieces to write in order
# completes a slot's answer from the broker's frame; given its slot rather than closing over it, so that no reference
# cycle holds the answer's buffers until the garbage collector runs (docs/design.md, "Answers freed when sent")
Finish = Callable[["Slot", memoryview | None], Awaitable[Answer | None]]


class FetchGate(Gate, Protocol):
    """A Fetch answer the broker gives alone (``pass_through.PassThrough``)."""

    async def passes(self, scan: ScannedFetch) -> bool:
        """Received whole: whether it goes out as it is (else ``finish`` completes it)."""
        ...


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
    gate: FetchGate | None = None  # a Fetch answer the broker gives alone: may go on as it arrives (splice.py)
    next: NextFetch | None = None  # a client's Fetch whose next one may be asked ahead (fetch_ahead.py)
    ahead: Ahead | None = None  # a Fetch asked ahead: its answer is held, not written
    served: Ahead | None = None  # the Fetch asked ahead whose held answer this slot writes
    given: list[Given] | None = None  # what a Fetch answer the proxy parsed gave (set by ``finish``)
    remote: RemoteHeld | None = None  # a remote answer that may go on a remote lane (set by ``finish``)


@dataclass(slots=True)
class Request:
    frame: bytes
    api_key: int
    version: int
    correlation_id: int
    started: float  # perf_counter when it was read
    ahead: bool = False  # asked by the proxy ahead of the client (fetch_ahead.py), not by the client


class Exchange(Protocol):
    """A client connection as its request handlers see it."""

    server: ProxyServices
    settings: ProxyListen  # the proxy section of the settings
    node_id: int | None
    auth: Authentication
    throttled_until: float  # monotonic time until which a client over its quota is not read (KIP-219)
    fetch_allowed: set[Any]  # topic keys whose remote reads may start before the broker answers
    remote_held: int  # answer budget bytes taken for this connection's remote answers not yet out
    fetch_ahead: FetchAhead | None  # the Fetch asked ahead of the client (None: fetch_ahead is off)

    async def forward(self, frame: bytes) -> None:
        """Send ``frame`` to the connection's broker (its answer is the next frame from it)."""
        ...

    def client_waiting(self) -> bool:
        """Answers wait in the client's transport: it is not taking them as fast as they come."""
        ...
