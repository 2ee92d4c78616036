"""Prometheus metrics of the proxy: requests, bytes and latency by API and by source, connections.

``source`` says who answered: ``broker`` (forwarded, maybe with addresses rewritten), ``remote`` (a Fetch
answered, at least in part, from remote storage), ``proxy`` (answered by the proxy alone).
``tiering_proxy_fetch_partitions_total{source}`` counts fetched partitions by where their data came
from: the remote hit ratio is its ``remote`` share. The reader's own totals (store GETs, downloaded
bytes, memory pool) come with them.
"""

from __future__ import annotations

from kio.schema.index import api_key_map
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from reader.http.metrics import ReaderCollector
from reader.remote import RemoteReader

_LABELS = ("api", "source")


def api_name(key: int) -> str:
    return api_key_map.get(key, f"api_{key}")


class ProxyMetrics:
    def __init__(self, reader: RemoteReader, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry()
        self.requests = Counter("tiering_proxy_requests", "Requests answered, by API and source.", _LABELS, registry=r)
        self.response_bytes = Counter(
            "tiering_proxy_response_bytes", "Bytes of the answers sent to clients, by API and source.", _LABELS,
            registry=r,
        )  # fmt: skip
        self.seconds = Histogram(
            "tiering_proxy_request_seconds", "From a request's arrival to its answer's being written, by API and "
            "source.", _LABELS, registry=r,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )  # fmt: skip
        self.fetch_partitions = Counter(
            "tiering_proxy_fetch_partitions", "Partitions answered in Fetch requests, by where their data came from "
            "(remote / broker): the remote hit ratio.", ("source",), registry=r,
        )  # fmt: skip
        self.remote_errors = Counter(
            "tiering_proxy_remote_errors", "Partitions of Fetch answers that failed on remote storage (answered "
            "KAFKA_STORAGE_ERROR, retried by the client).", registry=r,
        )  # fmt: skip
        self.throttle_seconds = Counter(
            "tiering_proxy_throttle_seconds", "Throttle time given to clients over their fetch quota for the bytes "
            "answered from remote storage (throttle_time_ms in Fetch answers).", registry=r,
        )  # fmt: skip
        self.zero_copy = Counter(
            "tiering_proxy_zero_copy_answers", "Pass-through Fetch answers left in the broker's socket for splice: "
            "moved to the client without entering the proxy (spliced), read into it after all because they needed "
            "a change (changed), or because the pipes ran out or the scan failed (buffered).", ("outcome",),
            registry=r,
        )  # fmt: skip
        self.fetch_ahead = Counter(
            "tiering_proxy_fetch_ahead", "Fetch requests asked of the broker ahead of the client, by what became of "
            "them: served (the client's next Fetch was the one predicted), missed (it was another), stale (older "
            "than fetch_ahead_max_age_seconds), unusable (the broker's answer needed a change).", ("outcome",),
            registry=r,
        )  # fmt: skip
        self.remote_lane = Counter(
            "tiering_proxy_remote_lane_runs", "Runs of remote lanes (reader/proxy/remote_lane.py), by how they ended: "
            "again (came back for more answers or the metrics and went on), request (gave a client frame back: not "
            "the one predicted, a probe the broker refused, too old), done (the answers handed served: the remote "
            "end, read-ahead empty), closed, idle, failed, stopped.", ("outcome",), registry=r,
        )  # fmt: skip
        self.native_lane = Counter(
            "tiering_proxy_native_lane_runs", "Runs of native lanes (reader/proxy/lane.py), by how they ended: again "
            "(came back for the metrics and went on), request (gave a client frame back), done (nothing asked ahead: "
            "no more data waiting, a slow client, an answer too old), closed, idle, failed, stopped.", ("outcome",),
            registry=r,
        )  # fmt: skip
        self.connections = Gauge("tiering_proxy_connections", "Client connections open now.", registry=r)
        self.refused = Counter(
            "tiering_proxy_connections_refused", "Client connections closed at once (max_connections reached).",
            registry=r,
        )  # fmt: skip
        self.closed_bad = Counter(
            "tiering_proxy_connections_closed", "Client connections the proxy closed, by reason (a garbage or "
            "oversized frame, a stalled request, idle, the broker gone).", ("reason",), registry=r,
        )  # fmt: skip
        r.register(ReaderCollector(reader))

    def answered(self, api_key: int, source: str, size: int, seconds: float) -> None:
        labels = (api_name(api_key), source)
        self.requests.labels(*labels).inc()
        self.response_bytes.labels(*labels).inc(size)
        self.seconds.labels(*labels).observe(seconds)
