"""The S3 store against the real S3 server (MinIO): multipart, ranges, errors, idempotent delete."""

from __future__ import annotations

import io
import os
import re
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from deploy.stack import Endpoints
from tests.store_parts import parts_of
from tiering_core.errors import FormatError
from tiering_core.stores import (
    IncompleteUpload,
    ObjectNotFound,
    RemoteStoreError,
    S3Store,
    S3StoreConfig,
    StoreUnavailable,
)
from tiering_core.stores.base import Part

pytestmark = pytest.mark.integration


def config(stack: Endpoints, **overrides: object) -> S3StoreConfig:
    values = {
        "bucket": stack.s3.bucket, "prefix": "store-test", "endpoint_url": stack.s3.endpoint_url,
        "region": stack.s3.region, "path_style": True, "access_key_id": stack.s3.access_key,
        "secret_access_key": stack.s3.secret_key, "part_size": 5 << 20, **overrides,
    }  # fmt: skip
    return S3StoreConfig(**values)


def test_multipart_round_trip_ranges_and_delete(stack: Endpoints, tmp_path: Path) -> None:
    store = S3Store(config(stack))
    body = os.urandom(12 << 20)  # three parts
    path = tmp_path / "segment.log"
    path.write_bytes(body)
    key = f"store-test/{uuid.uuid4().hex}.log"
    single = f"store-test/{uuid.uuid4().hex}.log"
    with path.open("rb") as f:
        store.put_parts(key, f.fileno(), len(body), parts_of(body, 5 << 20))
        store.put_parts(single, f.fileno(), 1000, parts_of(body[:1000], 5 << 20))  # one PutObject
    other = f"store-test/{uuid.uuid4().hex}.log"
    store.put_file(other, io.BytesIO(body), len(body))
    for k in (key, other):
        assert store.head(k) == len(body)
        assert store.get_range(k, 5 << 20, (5 << 20) + 99) == body[5 << 20 : (5 << 20) + 100]
    assert store.get_bytes(key) == body and store.get_bytes(single) == body[:1000]
    store.delete([key, other, single, key])
    with pytest.raises(ObjectNotFound, match=re.escape(key)):
        store.get_range(key, 0, 1)
    assert mine(store.incomplete_uploads("store-test/"), key, other, single) == []


@pytest.mark.parametrize("size", [1000, 12 << 20], ids=["single-put", "multipart"])
def test_a_part_whose_bytes_differ_from_its_crc_stores_nothing(stack: Endpoints, tmp_path: Path, size: int) -> None:
    """The file read differently the second time (the CRCs were computed from other bytes): S3 refuses the
    part, the upload is aborted, no object and no incomplete upload is left."""
    store = S3Store(config(stack, max_attempts=1))
    body = os.urandom(size)
    path = tmp_path / "segment.log"
    path.write_bytes(body)
    validated = bytearray(body)
    validated[-1] ^= 1  # the last part's CRC is of other bytes
    key = f"store-test/{uuid.uuid4().hex}.log"
    with path.open("rb") as f, pytest.raises(RemoteStoreError, match=re.escape(key)):
        store.put_parts(key, f.fileno(), size, parts_of(bytes(validated), 5 << 20))
    assert store.head(key) is None
    assert mine(store.incomplete_uploads("store-test/"), key) == []


def test_an_error_from_the_parts_aborts_the_upload(stack: Endpoints, tmp_path: Path) -> None:
    """The caller validates each part as it is taken: a corrupt second part stops the upload, begun with
    the first; its error propagates and nothing is stored."""
    store = S3Store(config(stack))
    body = os.urandom(12 << 20)
    path = tmp_path / "segment.log"
    path.write_bytes(body)
    key = f"store-test/{uuid.uuid4().hex}.log"

    def validated() -> Iterator[Part]:
        first, *_ = parts_of(body, 5 << 20)
        yield first
        raise FormatError(str(path), 5 << 20, "CRC-32C mismatch")

    with path.open("rb") as f, pytest.raises(FormatError, match="CRC-32C mismatch"):
        store.put_parts(key, f.fileno(), len(body), validated())
    assert store.head(key) is None
    assert mine(store.incomplete_uploads("store-test/"), key) == []


def test_incomplete_uploads_are_listed_by_prefix_and_aborted(stack: Endpoints) -> None:
    """MinIO lists in-progress uploads only for an exact key when asked with a Prefix: a shorter prefix must
    still find them (a crashed sidecar's uploads are under <prefix>/<topic>-<id>/<partition>/)."""
    store = S3Store(config(stack))
    run = uuid.uuid4().hex
    keys = [f"store-test/{run}/t-id/0/{n:020d}-{uuid.uuid4().hex}.log" for n in range(2)]
    elsewhere = f"store-test-other/{run}/0.log"
    for key in [*keys, elsewhere]:
        upload = store.client.create_multipart_upload(Bucket=stack.s3.bucket, Key=key)["UploadId"]
        store.client.upload_part(Bucket=stack.s3.bucket, Key=key, UploadId=upload, PartNumber=1, Body=b"p" * 1000)
    found = store.incomplete_uploads(f"store-test/{run}/")
    assert sorted(u.key for u in found) == sorted(keys)
    assert all(abs(u.initiated_ms - time.time() * 1000) < 600_000 for u in found), found  # the store's clock, in ms
    for upload in found:
        store.abort_upload(upload)
        store.abort_upload(upload)  # idempotent
    assert store.incomplete_uploads(f"store-test/{run}/") == []
    (other,) = store.incomplete_uploads(f"store-test-other/{run}/")
    assert other.key == elsewhere
    store.abort_upload(other)


def mine(uploads: list[IncompleteUpload], *keys: str) -> list[IncompleteUpload]:
    """The uploads to ``keys`` (other tests of the session may have uploads of their own under the prefix)."""
    return [u for u in uploads if u.key in keys]


def test_unreachable_endpoint_is_a_clear_error(stack: Endpoints) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = S3Store(config(stack, endpoint_url=f"http://127.0.0.1:{port}", max_attempts=1, connect_timeout=1))
    with pytest.raises(StoreUnavailable, match=re.escape(f"127.0.0.1:{port} is unreachable")):
        store.put_bytes("store-test/x", b"x")


@pytest.mark.parametrize("size", [100, 6 << 20], ids=["single-put", "multipart"])
def test_a_refused_upload_is_a_remote_store_error_naming_key_and_endpoint(
    stack: Endpoints, tmp_path: Path, size: int
) -> None:
    """boto3's managed transfer (put_file) raises S3UploadFailedError, outside botocore's hierarchy, and put_parts
    runs a multipart upload of its own: no error of either may escape the store's."""
    store = S3Store(config(stack))
    path = tmp_path / "segment.log"
    path.write_bytes(os.urandom(size))
    key = f"store-test/{'k' * 300}/{uuid.uuid4().hex}.log"  # MinIO refuses a path component over 255 bytes
    for by_parts in (True, False):
        with pytest.raises(RemoteStoreError) as caught, path.open("rb") as f:
            if by_parts:
                store.put_parts(key, f.fileno(), size, parts_of(path.read_bytes(), 5 << 20))
            else:
                store.put_file(key, f, size)
        assert not isinstance(caught.value, StoreUnavailable)
        assert key in str(caught.value) and stack.s3.endpoint_url in str(caught.value)
        assert "XMinioInvalidObjectName" in str(caught.value)
    assert mine(store.incomplete_uploads("store-test/"), key) == []


def test_a_reader_reads_a_manifest_on_the_fast_path_within_its_limit(stack: Endpoints) -> None:
    """``RangeFetcher.get_object`` (manifests, one per copy a reader enters) is a ranged GET on the presigned path:
    boto3 sends no GetObject, the bytes are the object's; a larger object than the limit is an error naming it,
    a missing one RemoteObjectMissing."""
    from reader.config import ReaderSettings
    from reader.errors import RemoteObjectMissing, RemoteReadError
    from reader.fetcher import RangeFetcher

    store = S3Store(config(stack))
    calls: list[str] = []
    store.client.meta.events.register("before-call.s3.GetObject", lambda **kw: calls.append("GetObject"))
    fetcher = RangeFetcher(store, ReaderSettings(bootstrap_servers=stack.bootstrap))
    small, large = f"store-test/{uuid.uuid4().hex}/manifest", f"store-test/{uuid.uuid4().hex}/manifest"
    body = os.urandom(700)
    store.put_bytes(small, body)
    store.put_bytes(large, os.urandom(4097))
    assert fetcher.get_object(small, 700) == body
    assert fetcher.get_object(small, 4096) == body
    with pytest.raises(RemoteReadError, match=re.escape(large) + ".*larger than the 4096 bytes"):
        fetcher.get_object(large, 4096)
    with pytest.raises(RemoteObjectMissing, match="missing"):
        fetcher.get_object(f"store-test/{uuid.uuid4().hex}/manifest", 4096)
    assert calls == [], "a manifest was read through boto3's GetObject"
    store.delete([small, large])
