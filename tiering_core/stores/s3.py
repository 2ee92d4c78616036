"""A RemoteStore on S3 and S3-compatible servers, through boto3.

Uploads go through boto3's managed transfer: multipart above ``multipart_threshold``, parts of
``part_size`` bytes, ``max_concurrency`` parts in flight, each part's checksum (CRC32) computed by
botocore and verified by the server; s3transfer aborts the multipart upload when anything fails, but a
process killed mid-upload leaves it behind: ``incomplete_uploads`` and ``abort_upload`` let the sweeper
find and abort those.
Memory is bounded by about ``max_concurrency x part_size`` (parts are read from the file as they are
sent). Credentials come from the standard AWS chain unless given explicitly.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any, BinaryIO, TypeVar

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import ClientError, ConnectionError, HTTPClientError

from tiering_core.stores.base import IncompleteUpload, ObjectNotFound, RemoteStoreError, StoreUnavailable
from tiering_core.stores.config import S3StoreConfig

T = TypeVar("T")
_MISSING = {"NoSuchKey", "404", "NotFound"}
# The store is there but does not serve (after botocore's own retries): as unreachable as a refused connection.
_UNAVAILABLE = {"SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout", "XMinioServerNotInitialized"}


class S3Store:
    def __init__(self, config: S3StoreConfig) -> None:
        self.bucket = config.bucket
        self.max_attempts = config.max_attempts
        self.endpoint = config.endpoint_url or f"s3://{config.bucket}"
        boto_config = Config(
            region_name=config.region,
            # Said explicitly: botocore presigns S3 URLs (s3_ranges) with SigV2 unless SigV4 is configured, and AWS
            # S3 refuses SigV2 for buckets created since June 2020 and in every region opened since 2014.
            signature_version="s3v4",
            s3={"addressing_style": "path" if config.path_style else "auto"},
            retries={"total_max_attempts": config.max_attempts, "mode": "standard"},  # botocore's max_attempts: retries
            connect_timeout=config.connect_timeout,
            read_timeout=config.read_timeout,
            max_pool_connections=max(10, config.max_concurrency * 2),
        )
        self.client = boto3.session.Session().client(
            "s3",
            endpoint_url=config.endpoint_url,
            aws_access_key_id=config.access_key_id,
            aws_secret_access_key=config.secret_key(),
            config=boto_config,
        )
        self.transfer = TransferConfig(
            multipart_threshold=config.part_size,
            multipart_chunksize=config.part_size,
            max_concurrency=config.max_concurrency,
            use_threads=config.max_concurrency > 1,
        )
        # The memory bound: parts read ahead of the upload, times the part size (boto3 does not take it
        # as an argument; s3transfer reads the attribute).
        self.transfer.max_in_memory_upload_chunks = config.max_concurrency
        self.sse: dict[str, str] = {}
        if config.sse:
            self.sse["ServerSideEncryption"] = config.sse
            if config.kms_key_id:
                self.sse["SSEKMSKeyId"] = config.kms_key_id

    def _call(self, what: str, key: str, fn: Callable[[], T]) -> T:
        """Run one request; every failure leaves as the store's error hierarchy, naming key and endpoint.

        boto3's managed transfer wraps a ClientError into S3UploadFailedError (the ClientError is its
        context) and s3transfer has exceptions of its own: none of them may escape the contract.
        """
        try:
            return fn()
        except RemoteStoreError:
            raise
        except Exception as exc:
            raise self._error(what, key, exc) from exc

    def _error(self, what: str, key: str, exc: Exception) -> RemoteStoreError:
        client_error = exc if isinstance(exc, ClientError) else exc.__context__
        if isinstance(client_error, ClientError):
            error = client_error.response.get("Error", {})
            status = int(client_error.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
            return self._refused(what, key, str(error.get("Code", "")), error.get("Message") or str(exc), status)
        if isinstance(exc, ConnectionError | HTTPClientError):  # refused, reset, closed early, timed out
            return StoreUnavailable(self.endpoint, exc, f"{what} s3://{self.bucket}/{key}")
        return RemoteStoreError(f"{what} s3://{self.bucket}/{key} at {self.endpoint}: {type(exc).__name__}: {exc}")

    def _refused(self, what: str, key: str, code: str, message: str, status: int = 0) -> RemoteStoreError:
        """The error for an answer of the store with an error ``code`` (a whole request's or one key's)."""
        where = f"{what} s3://{self.bucket}/{key}"
        if code in _MISSING:
            return ObjectNotFound(key)
        if code in _UNAVAILABLE or status >= 500:
            return StoreUnavailable(self.endpoint, f"{code} {message}".strip(), where)
        return RemoteStoreError(f"{where} at {self.endpoint}: {code}: {message}")

    def put_file(self, key: str, fileobj: BinaryIO, length: int) -> None:
        extra = {"ChecksumAlgorithm": "CRC32", **self.sse}
        self._call(
            "upload",
            key,
            lambda: self.client.upload_fileobj(fileobj, self.bucket, key, ExtraArgs=extra, Config=self.transfer),
        )

    def put_path(self, key: str, path: str, length: int) -> None:
        """Like boto3's ``upload_file``: each part is read from the file when it is sent, so memory holds
        no part buffers (the fastest and leanest path)."""
        size = os.stat(path).st_size
        if size != length:
            raise RemoteStoreError(f"upload of {path} to {key}: the file has {size} bytes, expected {length}")
        extra = {"ChecksumAlgorithm": "CRC32", **self.sse}
        self._call(
            "upload",
            key,
            lambda: self.client.upload_file(path, self.bucket, key, ExtraArgs=extra, Config=self.transfer),
        )

    def put_bytes(self, key: str, data: bytes) -> None:
        args: dict[str, Any] = {"Bucket": self.bucket, "Key": key, "Body": data, "ChecksumAlgorithm": "CRC32"}
        self._call("put", key, lambda: self.client.put_object(**args, **self.sse))

    def get_range(self, key: str, start: int, end: int) -> bytes:
        return self._get(key, Range=f"bytes={start}-{end}")

    def get_bytes(self, key: str) -> bytes:
        return self._get(key)

    def _get(self, key: str, **args: str) -> bytes:
        """GET, and read the body; botocore retries the request but not a body cut off (a connection reset
        half way), so that GET is made again, up to ``max_attempts`` times."""
        for attempt in range(1, self.max_attempts + 1):
            response = self._call("get", key, lambda: self.client.get_object(Bucket=self.bucket, Key=key, **args))
            try:
                return bytes(self._call("read", key, response["Body"].read))
            except StoreUnavailable:
                if attempt == self.max_attempts:
                    raise
        raise AssertionError("unreachable")

    def head(self, key: str) -> int | None:
        try:
            response = self._call("head", key, lambda: self.client.head_object(Bucket=self.bucket, Key=key))
        except ObjectNotFound:
            return None
        return int(response["ContentLength"])

    def list_keys(self, prefix: str) -> list[str]:
        def run() -> list[str]:
            keys: list[str] = []
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
                keys.extend(obj["Key"] for obj in page.get("Contents", []))
            return keys

        return self._call("list", prefix, run)

    def delete(self, keys: Iterable[str]) -> None:
        batch = list(keys)
        for i in range(0, len(batch), 1000):
            chunk = batch[i : i + 1000]
            response = self._call(
                "delete", chunk[0],
                lambda chunk=chunk: self.client.delete_objects(
                    Bucket=self.bucket, Delete={"Objects": [{"Key": k} for k in chunk], "Quiet": True}
                ),
            )  # fmt: skip
            errors = [e for e in response.get("Errors", []) if e.get("Code") not in _MISSING]
            if errors:
                more = f" (and {len(errors) - 1} more keys)" if len(errors) > 1 else ""
                first = errors[0]
                raise self._refused(f"delete{more}", str(first.get("Key")), str(first.get("Code")),
                                    str(first.get("Message", "")))  # fmt: skip

    def incomplete_uploads(self, prefix: str) -> list[IncompleteUpload]:
        """The multipart uploads under ``prefix`` neither completed nor aborted. The bucket's uploads are
        listed and filtered by key here: MinIO lists in-progress uploads only for an exact key (a shorter
        ``Prefix`` returns none), and listing them all is right on AWS S3 too."""

        def run() -> list[IncompleteUpload]:
            found: list[IncompleteUpload] = []
            for page in self.client.get_paginator("list_multipart_uploads").paginate(Bucket=self.bucket):
                found.extend(
                    IncompleteUpload(u["Key"], u["UploadId"], int(u["Initiated"].timestamp() * 1000))
                    for u in page.get("Uploads", [])
                    if u["Key"].startswith(prefix)
                )
            return found

        return self._call("list uploads", prefix, run)

    def abort_upload(self, upload: IncompleteUpload) -> None:
        def run() -> None:
            try:
                self.client.abort_multipart_upload(Bucket=self.bucket, Key=upload.key, UploadId=upload.upload_id)
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") != "NoSuchUpload":  # AWS: completed or aborted already
                    raise

        self._call("abort upload", upload.key, run)
