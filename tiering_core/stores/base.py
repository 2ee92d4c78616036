"""The remote store interface and its errors.

Contracts (every implementation):
- ``put_file`` streams ``length`` bytes of an open file from ``offset``; memory stays bounded
  whatever the size. Overwriting a key replaces it whole. A failed put leaves no object.
- ``put_parts`` uploads an open file part by part, each with the CRC-32C its caller computed, and
  fails unless the bytes stored are the bytes those CRCs were computed from.
- ``get_range(key, start, end)``: ``end`` is *inclusive*, as in HTTP ranges.
- ``delete`` of a missing key is not an error (idempotent).
- A put that never ends (the process crashed) leaves an ``IncompleteUpload``, invisible to ``list_keys``,
  until ``abort_upload``; aborting one that is gone already is not an error (idempotent).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import BinaryIO, Protocol

from tiering_core.errors import TieringError


class RemoteStoreError(TieringError):
    """A remote store request failed. Nothing local was changed; retry later."""


class ObjectNotFound(RemoteStoreError):
    """The key does not exist. For a segment this means a lost or deleted copy: never serve it."""

    def __init__(self, key: str) -> None:
        self.key = key
        super().__init__(f"remote object not found: {key}")


class StoreUnavailable(RemoteStoreError):
    """The store could not be reached or did not serve (network, endpoint down, 5xx or throttled past
    botocore's retries). Nothing is deleted locally; retry with backoff."""

    def __init__(self, endpoint: str, cause: object, what: str = "") -> None:
        self.endpoint = endpoint
        during = f" ({what})" if what else ""
        hint = ""
        if "CERTIFICATE_VERIFY_FAILED" in str(cause):  # botocore's SSLError and ssl's own both say so
            hint = (
                "; the endpoint's TLS certificate is not signed by a CA this host trusts: set remote_storage.ca_bundle"
            )
        super().__init__(f"remote store {endpoint} is unreachable{during}: {cause}{hint}")


@dataclass(frozen=True, slots=True)
class IncompleteUpload:
    """An upload begun and neither completed nor aborted: on S3 a multipart upload, whose parts the store
    keeps (and bills) until it is aborted; on a filesystem store a temp file. ``initiated_ms`` is the
    store's clock (S3's ``Initiated``; the temp file's last write)."""

    key: str
    upload_id: str
    initiated_ms: int


@dataclass(frozen=True, slots=True)
class Part:
    """Bytes ``[offset, offset + size)`` of a file being uploaded, and their CRC-32C (Castagnoli)."""

    offset: int
    size: int
    crc32c: int


def consecutive_parts(key: str, parts: Iterable[Part], length: int, part_size: int) -> Iterator[Part]:
    """``parts``, checked as they are taken: consecutive from offset 0, ``part_size`` bytes each but the
    last, ``length`` bytes in all (a caller's mistake raises ValueError before anything is completed)."""
    position = 0
    for part in parts:
        expected = min(part_size, length - position)
        if part.offset != position or part.size != expected or expected <= 0:
            raise ValueError(f"upload of {key}: part {part} given, expected {expected} bytes at offset {position}")
        position += part.size
        yield part
    if position != length:
        raise ValueError(f"upload of {key}: parts end at byte {position}, expected {length}")


class RemoteStore(Protocol):
    endpoint: str
    part_size: int  # the bytes of each part ``put_parts`` takes (all but the last)

    def put_file(self, key: str, fileobj: BinaryIO, length: int) -> None:
        """Upload ``length`` bytes read from ``fileobj`` (positioned at the start) to ``key``."""

    def put_parts(self, key: str, fd: int, length: int, parts: Iterable[Part]) -> None:
        """Upload bytes ``[0, length)`` of the open file ``fd`` to ``key``, in ``parts`` (see
        ``consecutive_parts``), each read from ``fd`` as it is sent.

        A part is taken from ``parts`` only when it can be sent (a few ahead of those in flight), so the
        caller may read and validate each one as it is asked for; an exception from ``parts`` aborts the
        upload (nothing is stored) and propagates. The store checks each part's bytes against its CRC-32C
        (S3 verifies the checksum header), so the object holds exactly the bytes the caller computed the
        CRCs from, even if the file read differently the second time.
        """

    def put_bytes(self, key: str, data: bytes) -> None: ...

    def get_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes ``start..end`` (inclusive) of ``key``; ObjectNotFound if it does not exist. Retried by the store
        (a connection reset, a throttled answer) as its client does."""

    def read_range(self, key: str, start: int, end: int) -> bytes:
        """``get_range`` in one attempt on the store's fastest path, for a caller that retries itself (the
        reader's fetcher): StoreUnavailable when the store did not answer."""

    def get_bytes(self, key: str) -> bytes: ...

    def read_url(self, key: str, seconds: int) -> str:
        """A URL that serves ranged GETs of ``key`` for ``seconds`` with no credentials of its own (an S3
        presigned URL; a ``file:`` URL for the filesystem store): how a reader in another process or language
        (the Spark source's JVM tasks) reads an object the driver chose, without this store's client."""

    def head(self, key: str) -> int | None:
        """The object's size, or None if it does not exist."""

    def list_keys(self, prefix: str) -> list[str]: ...

    def delete(self, keys: Iterable[str]) -> None:
        """Delete the keys; missing ones are fine (idempotent)."""

    def incomplete_uploads(self, prefix: str) -> list[IncompleteUpload]:
        """Uploads to keys under ``prefix`` begun and neither completed nor aborted (some may be in progress)."""

    def abort_upload(self, upload: IncompleteUpload) -> None:
        """Abort the upload and free what it stored; one completed or aborted meanwhile is fine (idempotent)."""
