"""The Kafka-protocol access layer: any existing Kafka client reads tiered history through it, unchanged.

Clients bootstrap to the proxy instead of the brokers. It forwards every request and answer unchanged
(``reader.proxy.connection``) and rewrites only broker addresses (``reader.proxy.routing``), so clients
keep coming back through it, one port per broker. It answers what the broker no longer can for tiered
data: Fetch below the log start from the remote copies' own batches (``reader.proxy.fetch``, read ahead
by ``reader.cursor`` through the reader's memory pool, disk cache and download threads),
ListOffsets EARLIEST / LATEST_TIERED / by timestamp and OffsetForLeaderEpoch (``reader.proxy.answers``,
``reader.proxy.tiered``). It keeps no state but caches.

- ``load_proxy_settings(file)`` / ``ProxySettings``: the reader's settings plus a ``proxy`` section.
- ``ProxyServer(settings).run()``: serve until SIGTERM; ``running_proxy(settings)``: in a thread.
"""

from reader.proxy.config import ProxyListen, ProxySettings, ProxyTls, load_proxy_settings
from reader.proxy.server import ProxyServer, running_proxy

__all__ = ["ProxyListen", "ProxyServer", "ProxySettings", "ProxyTls", "load_proxy_settings", "running_proxy"]
