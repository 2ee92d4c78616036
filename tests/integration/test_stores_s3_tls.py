"""The S3 store and the reader's ranged GETs against MinIO serving https with a self-signed certificate.

``ca_bundle`` in the store's settings names the CA file, as an operator with a private CA or a
self-signed S3-compatible server sets it: a multipart upload, small objects and ranged reads then go
over TLS byte for byte; without it the certificate is refused, naming the endpoint, before anything is
written or read. (A CA file that does not exist is a settings error: tests/integration/test_cli_config_errors.py.)
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from deploy import minio
from deploy.errors import StackError
from deploy.procs import free_port, stop_groups, wait_ready
from tests.conftest import unavailable
from tests.store_parts import parts_of
from tests.tls import self_signed
from tiering_core.stores import S3Store, S3StoreConfig, StoreUnavailable
from tiering_core.stores.s3_ranges import PresignedRanges

pytestmark = pytest.mark.integration

PART = 5 << 20


@dataclass(frozen=True)
class TlsMinio:
    endpoint_url: str
    ca_file: Path


@pytest.fixture(scope="module")
def tls_minio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsMinio]:
    """A MinIO of its own, https only, its certificate self-signed for 127.0.0.1, with the stack's bucket."""
    root = tmp_path_factory.mktemp("tls-minio")
    certs = root / "certs"
    certs.mkdir()
    cert, key = self_signed(root)
    shutil.copy(cert, certs / "public.crt")
    shutil.copy(key, certs / "private.key")
    port = free_port()
    pid = None
    try:
        pid = minio.start_minio(root, port, free_port(), certs_dir=certs)
        wait_ready("minio (https)", pid, lambda: minio.minio_live(port, ca_file=cert), root / "minio.log")
    except StackError as exc:
        stop_groups([pid])
        unavailable("MinIO with TLS", exc)
    endpoint = f"https://127.0.0.1:{port}"
    try:
        server = TlsMinio(endpoint, cert)
        S3Store(_config(server, ca_bundle=cert)).client.create_bucket(Bucket=minio.BUCKET)
        yield server
    finally:
        stop_groups([pid])


def _config(server: TlsMinio, **overrides: object) -> S3StoreConfig:
    values = {
        "bucket": minio.BUCKET, "endpoint_url": server.endpoint_url, "region": minio.REGION, "path_style": True,
        "access_key_id": minio.ACCESS_KEY, "secret_access_key": minio.SECRET_KEY, "part_size": PART,
        "max_attempts": 1, **overrides,
    }  # fmt: skip
    return S3StoreConfig(**values)


def test_multipart_upload_and_ranged_reads_over_https(tls_minio: TlsMinio, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.delenv("AWS_CA_BUNDLE", raising=False)
    store = S3Store(_config(tls_minio, ca_bundle=tls_minio.ca_file))
    body = os.urandom(2 * PART + 12345)  # three parts
    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(body)
    key = f"tls/{uuid.uuid4().hex}.log"
    with path.open("rb") as f:
        store.put_parts(key, f.fileno(), len(body), parts_of(body, PART))
    store.put_bytes(f"{key}.manifest", b"manifest bytes")
    assert store.head(key) == len(body)
    assert store.get_bytes(f"{key}.manifest") == b"manifest bytes"
    assert store.get_range(key, PART - 10, PART + 9) == body[PART - 10 : PART + 10]
    ranges = PresignedRanges(store.client, store.bucket, store.endpoint)
    step = 1 << 20
    read = b"".join(
        ranges.get_range(key, start, min(start + step, len(body)) - 1) for start in range(0, len(body), step)
    )
    assert read == body  # every byte, across the part boundaries
    assert store.incomplete_uploads("tls/") == []


def test_an_untrusted_certificate_is_refused_naming_the_endpoint(tls_minio: TlsMinio,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.delenv("AWS_CA_BUNDLE", raising=False)
    store = S3Store(_config(tls_minio))  # the system's CAs do not sign a self-signed certificate
    key = f"tls/{uuid.uuid4().hex}.manifest"
    with pytest.raises(StoreUnavailable) as put:
        store.put_bytes(key, b"never stored")
    with pytest.raises(StoreUnavailable) as get:
        PresignedRanges(store.client, store.bucket, store.endpoint).get_range(key, 0, 9)
    for error, named in ((put.value, tls_minio.endpoint_url), (get.value, key)):
        assert named in str(error) and "CERTIFICATE_VERIFY_FAILED" in str(error)
        assert str(error).endswith("set remote_storage.ca_bundle"), error  # what to do about it
    trusted = S3Store(_config(tls_minio, ca_bundle=tls_minio.ca_file))
    assert trusted.head(key) is None  # nothing was written through the refused connection
