"""The cluster's key prefix, applied inside the store.

Every object of a cluster lives under one prefix (``remote_storage.prefix``, ``kafka-tiering`` by default).
``open_store`` wraps the backend in ``PrefixedStore``, so the rest of the code names objects by their keys
under the prefix (``orders-<topicId>/3/<base>-<id>.log``, ``metadata-snapshots/...``) and never adds it:
one place knows it, and a second backend adds only its own module to ``tiering_core/stores/``. The backend's
errors name the whole key (``s3://bucket/kafka-tiering/orders-.../3/...log``), which is what an operator
looks up; listings give keys back under the prefix, as they were put. The backend's key is exactly
``<prefix>/<key>``, what every caller wrote before, for any prefix (an empty one included): the objects of
a running cluster keep their names, and a sweep or listing never reaches beyond ``<prefix>/``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import BinaryIO

from tiering_core.stores.base import IncompleteUpload, Part, RemoteStore


class PrefixedStore:
    def __init__(self, inner: RemoteStore, prefix: str) -> None:
        self.inner = inner
        self.prefix = prefix
        self._head = f"{prefix}/"
        self.endpoint = inner.endpoint
        self.part_size = inner.part_size

    @property
    def location(self) -> str:
        """Where the cluster's objects are, for messages: the store's endpoint and the prefix."""
        return f"{self.endpoint}/{self.prefix}"

    def full_key(self, key: str) -> str:
        """The backend's key of ``key`` (for tools that read the bucket with their own client)."""
        return self._head + key

    def _inside(self, full: str) -> str:
        return full[len(self._head) :]

    def put_file(self, key: str, fileobj: BinaryIO, length: int) -> None:
        self.inner.put_file(self._head + key, fileobj, length)

    def put_parts(self, key: str, fd: int, length: int, parts: Iterable[Part]) -> None:
        self.inner.put_parts(self._head + key, fd, length, parts)

    def put_bytes(self, key: str, data: bytes) -> None:
        self.inner.put_bytes(self._head + key, data)

    def get_range(self, key: str, start: int, end: int) -> bytes:
        return self.inner.get_range(self._head + key, start, end)

    def read_range(self, key: str, start: int, end: int) -> bytes:
        return self.inner.read_range(self._head + key, start, end)

    def get_bytes(self, key: str) -> bytes:
        return self.inner.get_bytes(self._head + key)

    def read_url(self, key: str, seconds: int) -> str:
        return self.inner.read_url(self._head + key, seconds)

    def head(self, key: str) -> int | None:
        return self.inner.head(self._head + key)

    def list_keys(self, prefix: str) -> list[str]:
        return [self._inside(k) for k in self.inner.list_keys(self._head + prefix)]

    def delete(self, keys: Iterable[str]) -> None:
        self.inner.delete(self._head + k for k in keys)

    def incomplete_uploads(self, prefix: str) -> list[IncompleteUpload]:
        return [replace(u, key=self._inside(u.key)) for u in self.inner.incomplete_uploads(self._head + prefix)]

    def abort_upload(self, upload: IncompleteUpload) -> None:
        self.inner.abort_upload(replace(upload, key=self._head + upload.key))
