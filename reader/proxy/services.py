"""What a client connection uses of the server: the shared services, passed in (Kroxylicious' filter context
plays this part). ``ProxyServer`` provides them; ``ClientConnection`` depends on this description only, so
the server imports the connection and never the other way round."""

from __future__ import annotations

from concurrent.futures import Executor
from typing import Any, Protocol

from reader.proxy.budget import ByteBudget
from reader.proxy.config import ProxySettings
from reader.proxy.fetch import FetchPlan
from reader.proxy.frames import FrameProtocol
from reader.proxy.lane import LaneThreads
from reader.proxy.metrics import ProxyMetrics
from reader.proxy.quotas import ClientQuotaManager
from reader.proxy.routing import Router
from reader.proxy.splice import PipePool
from reader.proxy.tiered import TieredView
from reader.proxy.turns import FetchTurns


class ProxyServices(Protocol):
    settings: ProxySettings
    metrics: ProxyMetrics
    view: TieredView  # the remote copies and the broker's offsets as last seen
    router: Router  # broker addresses <-> the proxy's ports
    quotas: ClientQuotaManager
    answers: ByteBudget  # answer bytes held for clients, over all connections
    requests: ByteBudget  # request bytes being read, over all connections
    remote_pool: Executor  # remote reads and the merges that wait on them
    offsets_pool: Executor  # ListOffsets / OffsetForLeaderEpoch completions, apart from the remote reads
    fetch_turns: FetchTurns  # a Fetch's Python work on the event loop (plan, merge, encode) one per iteration
    pipes: PipePool | None  # kernel pipes for pass-through answers (splice.py); None: every answer is buffered
    lanes: LaneThreads | None  # threads for native lanes (lane.py); None: every cycle on the event loop
    remote_lanes: bool  # remote answers may go on a remote lane too (remote_lane.py), on the same threads

    async def open_upstream(self, node: int | None) -> FrameProtocol:
        """A connection to ``node``'s broker (any bootstrap broker for None)."""
        ...

    async def ensure_listeners(self, nodes: list[int]) -> None:
        """Listen on each node's port (once) before its address is given out."""
        ...

    def count_passed(self, partitions: int) -> None: ...

    def count_fetch(self, answer: Any, plan: FetchPlan) -> None: ...
