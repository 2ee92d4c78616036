"""A RemoteStore that reports every request to the metrics.

``tiering_remote_store_requests_total`` and ``tiering_remote_store_errors_total`` count requests and
failures by operation; ``tiering_remote_store_unavailable`` is 1 from a request that could not reach
the store (StoreUnavailable: refused, reset, timed out, 5xx or throttled past retries) until the next
request the store answers, so it follows an outage as it happens. ``probe`` asks the store something
cheap when nothing else did for a while, so the gauge does not stay stale on an idle sidecar.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import BinaryIO, TypeVar

from tiering.metrics import SidecarMetrics
from tiering_core.stores.base import (
    IncompleteUpload,
    ObjectNotFound,
    Part,
    RemoteStore,
    RemoteStoreError,
    StoreUnavailable,
)

T = TypeVar("T")


class ObservedStore:
    def __init__(self, inner: RemoteStore, metrics: SidecarMetrics, probe_key: str) -> None:
        self.inner = inner
        self.endpoint = inner.endpoint
        self.part_size = inner.part_size
        self.metrics = metrics
        self.probe_key = probe_key
        self.last_request = time.monotonic()

    def _observe(self, operation: str, fn: Callable[[], T]) -> T:
        self.metrics.store_requests.labels(operation=operation).inc()
        self.last_request = time.monotonic()
        try:
            result = fn()
        except StoreUnavailable:
            self._failed(operation, "unavailable", reachable=False)
            raise
        except ObjectNotFound:
            self._failed(operation, "not_found", reachable=True)
            raise
        except RemoteStoreError:
            self._failed(operation, "refused", reachable=True)
            raise
        except Exception:
            self._failed(operation, "other", reachable=True)
            raise
        self.metrics.store_unavailable.set(0)
        return result

    def _failed(self, operation: str, error: str, *, reachable: bool) -> None:
        self.metrics.store_errors.labels(operation=operation, error=error).inc()
        self.metrics.store_unavailable.set(0 if reachable else 1)

    def idle_seconds(self) -> float:
        return time.monotonic() - self.last_request

    def probe(self) -> None:
        """One cheap request (HEAD of a key that need not exist) to learn whether the store answers."""
        self.head(self.probe_key)

    def put_file(self, key: str, fileobj: BinaryIO, length: int) -> None:
        self._observe("put", lambda: self.inner.put_file(key, fileobj, length))

    def put_parts(self, key: str, fd: int, length: int, parts: Iterable[Part]) -> None:
        self._observe("put", lambda: self.inner.put_parts(key, fd, length, parts))

    def put_bytes(self, key: str, data: bytes) -> None:
        self._observe("put", lambda: self.inner.put_bytes(key, data))

    def get_range(self, key: str, start: int, end: int) -> bytes:
        return self._observe("get", lambda: self.inner.get_range(key, start, end))

    def read_range(self, key: str, start: int, end: int) -> bytes:
        return self._observe("get", lambda: self.inner.read_range(key, start, end))

    def get_bytes(self, key: str) -> bytes:
        return self._observe("get", lambda: self.inner.get_bytes(key))

    def read_url(self, key: str, seconds: int) -> str:
        return self.inner.read_url(key, seconds)  # signing is local: no request to count

    def head(self, key: str) -> int | None:
        return self._observe("head", lambda: self.inner.head(key))

    def list_keys(self, prefix: str) -> list[str]:
        return self._observe("list", lambda: self.inner.list_keys(prefix))

    def delete(self, keys: Iterable[str]) -> None:
        batch = list(keys)
        self._observe("delete", lambda: self.inner.delete(batch))

    def incomplete_uploads(self, prefix: str) -> list[IncompleteUpload]:
        return self._observe("list", lambda: self.inner.incomplete_uploads(prefix))

    def abort_upload(self, upload: IncompleteUpload) -> None:
        self._observe("abort", lambda: self.inner.abort_upload(upload))
