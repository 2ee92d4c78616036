"""Ranged GETs with bounded retries, a download rate limit, a concurrency cap and an optional disk cache.

``get(key, start, end)``: ``end`` inclusive, as ``RemoteStore.get_range``. While the store is
unreachable a GET is attempted ``read_attempts`` times with doubling backoff, then
``RemoteUnavailable`` is raised; the caller can simply call again later (nothing is half-delivered).
A missing object is ``RemoteObjectMissing`` naming the key, at once (no retry can bring it back).
For the metrics, ``retries`` counts the GETs sent again and ``unavailable`` says whether the last GET
that reached for the store found it unreachable (until one is answered again).
The store owns how a range is read (on S3: presigned URLs on keep-alive connections, ``s3_ranges``).
"""

from __future__ import annotations

import threading
import time

from reader.config import ReaderSettings
from reader.disk_cache import DiskCache
from reader.errors import RemoteObjectMissing, RemoteReadError, RemoteUnavailable
from tiering_core.logs import get_logger
from tiering_core.ratelimit import RateLimiter
from tiering_core.stores.base import ObjectNotFound, RemoteStore, RemoteStoreError, StoreUnavailable

log = get_logger(__name__)


class RangeFetcher:
    """Thread-safe; counts requests and bytes (``requests``, ``bytes_fetched``) for metrics and benchmarks."""

    def __init__(self, store: RemoteStore, settings: ReaderSettings) -> None:
        self.store = store
        self.attempts = settings.read_attempts
        self.backoff = settings.read_retry_backoff_seconds
        self.limiter = RateLimiter(settings.download_bytes_per_second) if settings.download_bytes_per_second else None
        self.slots = threading.BoundedSemaphore(settings.download_max_concurrency)
        self.cache = DiskCache(settings.disk_cache_dir, settings.disk_cache_bytes) if settings.disk_cache_dir else None
        self.requests = 0
        self.bytes_fetched = 0
        self.retries = 0
        self.unavailable = False
        self._count_lock = threading.Lock()

    def get(self, key: str, start: int, end: int, *, cacheable: bool = False) -> bytes:
        """Bytes ``start..end`` (inclusive) of ``key``; fewer if the object is shorter.

        ``cacheable``: the range is a fixed window worth keeping in the disk cache.
        """
        if cacheable and self.cache is not None:
            cached = self.cache.get(key, start, end)
            if cached is not None:
                return cached
        data = self._retrying(key, lambda: self.store.read_range(key, start, end), end - start + 1)
        if cacheable and self.cache is not None:
            self.cache.put(key, start, end, data)
        return data

    def forget(self, key: str) -> None:
        """The object ``key`` was found damaged: none of its windows is served from the disk cache again."""
        if self.cache is not None:
            self.cache.discard(key)

    def get_object(self, key: str, limit: int) -> bytes:
        """A whole small object (a manifest) of at most ``limit`` bytes, read as a range on the store's fast path
        (on S3 a presigned GET on a kept connection: about a third of the CPU of boto3's ``get_object``, which a
        reader paid for every copy it entered). RemoteReadError naming the key for a larger object: nothing
        larger is read into memory."""
        data = self._retrying(key, lambda: self.store.read_range(key, 0, limit), 0)  # one byte more: a longer shows
        if len(data) > limit:
            raise RemoteReadError(f"reading {key}: the object is larger than the {limit} bytes it may have")
        return data

    def _retrying(self, key: str, call, expected: int) -> bytes:
        delay = self.backoff
        for attempt in range(1, self.attempts + 1):
            if self.limiter is not None and expected:
                self.limiter.acquire(expected)
            try:
                with self.slots:
                    data = call()
            except ObjectNotFound as exc:
                self.unavailable = False
                raise RemoteObjectMissing(key, exc.key) from exc
            except StoreUnavailable as exc:
                self.unavailable = True
                if attempt == self.attempts:
                    raise RemoteUnavailable(key, attempt, exc) from exc
                log.warning("remote store unreachable; retrying", key=key, attempt=attempt, error=str(exc))
                with self._count_lock:
                    self.retries += 1
                time.sleep(delay)
                delay *= 2
                continue
            except RemoteStoreError as exc:
                self.unavailable = False
                raise RemoteReadError(f"reading {key}: {exc}") from exc
            self.unavailable = False
            with self._count_lock:
                self.requests += 1
                self.bytes_fetched += len(data)
            return data
        raise AssertionError("unreachable")
