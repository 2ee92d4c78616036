"""Prometheus metrics of the fetch service, named after Kafka's remote-read metrics (KIP-405/KIP-963).

Kafka's ``kafka.server:type=BrokerTopicMetrics,name=RemoteFetchBytesPerSec`` (and ``...RequestsPerSec``,
``...ErrorsPerSec``) are meters; here they are counters with the same stem, as the sidecar names its
copy metrics (``tiering/metrics.py``): ``tiering_remote_fetch_bytes_total`` and so on, labelled
``topic`` and ``partition``. Only topic-partitions that exist get labels, so a client cannot grow the
label set with made-up names. Each registry belongs to one service (tests run several).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from reader.remote import RemoteReader

_TP = ("topic", "partition")


class FetchMetrics:
    def __init__(self, reader: RemoteReader, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry()
        self.fetch_bytes = Counter(
            "tiering_remote_fetch_bytes", "Bytes read from remote storage and served (RemoteFetchBytesPerSec).",
            _TP, registry=r,
        )  # fmt: skip
        self.fetch_requests = Counter(
            "tiering_remote_fetch_requests", "Fetches served from remote storage (RemoteFetchRequestsPerSec).",
            _TP, registry=r,
        )  # fmt: skip
        self.fetch_errors = Counter(
            "tiering_remote_fetch_errors",
            "Fetches that failed on remote storage: object missing, corrupt, store unreachable "
            "(RemoteFetchErrorsPerSec).",
            _TP, registry=r,
        )  # fmt: skip
        self.fetch_seconds = Histogram(
            "tiering_remote_fetch_seconds", "Time to read and verify one fetch from remote storage.", registry=r
        )
        self.http_requests = Counter(
            "tiering_reader_http_requests", "HTTP requests answered, by route and status code.",
            ("route", "code"), registry=r,
        )  # fmt: skip
        r.register(ReaderCollector(reader))

    def fetched(self, topic: str, partition: int, size: int, seconds: float) -> None:
        labels = (topic, str(partition))
        self.fetch_requests.labels(*labels).inc()
        self.fetch_bytes.labels(*labels).inc(size)
        self.fetch_seconds.observe(seconds)

    def fetch_failed(self, topic: str, partition: int) -> None:
        self.fetch_requests.labels(topic, str(partition)).inc()
        self.fetch_errors.labels(topic, str(partition)).inc()


class ReaderCollector(Collector):
    """The reader's own totals (store GETs, downloaded bytes, retries, the store's availability, memory pool), read
    at scrape time."""

    def __init__(self, reader: RemoteReader) -> None:
        self.reader = reader

    def collect(self) -> Iterator[Metric]:
        fetcher = self.reader.fetcher
        yield CounterMetricFamily(
            "tiering_reader_store_requests", "GET requests sent to the remote store (cache misses).",
            value=fetcher.requests,
        )  # fmt: skip
        yield CounterMetricFamily(
            "tiering_reader_store_bytes", "Bytes downloaded from the remote store.", value=fetcher.bytes_fetched
        )
        yield CounterMetricFamily(
            "tiering_reader_store_retries", "GETs sent to the remote store again after it could not be reached "
            "(up to read_attempts per read, with a doubling backoff).", value=fetcher.retries,
        )  # fmt: skip
        yield GaugeMetricFamily(
            "tiering_reader_store_unavailable", "1 while the remote store cannot be reached (the last GET sent to it "
            "was refused, reset, timed out or throttled), 0 once it answers again.", value=int(fetcher.unavailable),
        )  # fmt: skip
        yield GaugeMetricFamily(
            "tiering_reader_memory_pool_bytes", "Bytes held in the reader's memory pool now (capped by "
            "prefetch_pool_bytes).", value=self.reader.pool.used,
        )  # fmt: skip
