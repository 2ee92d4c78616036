"""The filesystem store: the same contract as S3 (ranges inclusive, idempotent delete, no partial objects)."""

from __future__ import annotations

import io
import time
from pathlib import Path

import pytest

from tiering_core.ratelimit import RateLimiter
from tiering_core.stores import FileSystemStore, IncompleteUpload, ObjectNotFound, RemoteStoreError


def test_put_get_range_list_delete(tmp_path: Path) -> None:
    store = FileSystemStore(tmp_path / "root")
    body = bytes(range(256)) * 5000
    store.put_file("p/a/one.log", io.BytesIO(body), len(body))
    store.put_bytes("p/a/one.manifest", b"{}")
    assert store.get_range("p/a/one.log", 10, 19) == body[10:20]
    assert store.get_bytes("p/a/one.log") == body
    assert store.head("p/a/one.log") == len(body) and store.head("p/a/none") is None
    assert store.list_keys("p/a/") == ["p/a/one.log", "p/a/one.manifest"]
    store.delete(["p/a/one.log", "p/a/one.log", "p/a/missing"])
    with pytest.raises(ObjectNotFound, match=r"p/a/one\.log"):
        store.get_bytes("p/a/one.log")


def test_short_source_leaves_no_object(tmp_path: Path) -> None:
    store = FileSystemStore(tmp_path)
    with pytest.raises(RemoteStoreError, match="ended 10 bytes early"):
        store.put_file("k", io.BytesIO(b"x" * 90), 100)
    assert store.list_keys("") == []


def test_a_put_is_an_incomplete_upload_until_its_temp_file_is_renamed(tmp_path: Path) -> None:
    store = FileSystemStore(tmp_path)
    seen: list[IncompleteUpload] = []

    class Source(io.BytesIO):
        def read(self, n: int | None = -1) -> bytes:
            seen.extend(store.incomplete_uploads("p/"))
            assert store.incomplete_uploads("p/b") == [] and store.list_keys("") == []
            return super().read(n)

    store.put_file("p/a/one.log", Source(b"x" * 10), 10)
    (upload,) = seen
    assert upload.key == "p/a/one.log" and abs(upload.initiated_ms - time.time() * 1000) < 60_000
    assert store.incomplete_uploads("") == [] and store.list_keys("") == ["p/a/one.log"]
    (tmp_path / "p" / "a" / upload.upload_id).write_bytes(b"xx")  # what a crash in the middle leaves
    assert [(u.key, u.upload_id) for u in store.incomplete_uploads("p/a/")] == [("p/a/one.log", upload.upload_id)]
    store.abort_upload(upload)
    store.abort_upload(upload)  # idempotent
    assert store.incomplete_uploads("") == [] and store.get_bytes("p/a/one.log") == b"x" * 10


def test_keys_cannot_escape_the_root(tmp_path: Path) -> None:
    with pytest.raises(RemoteStoreError, match="escapes"):
        FileSystemStore(tmp_path / "root").put_bytes("../outside", b"x")


def test_rate_limiter_waits_for_tokens() -> None:
    now = [0.0]
    slept: list[float] = []
    limiter = RateLimiter(100.0, burst=100.0, clock=lambda: now[0], sleep=slept.append)
    limiter.acquire(100)
    assert slept == []
    limiter.acquire(50)
    assert slept == [0.5]
    now[0] = 10.0
    limiter.acquire(100)
    assert slept == [0.5]
