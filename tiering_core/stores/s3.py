"""A RemoteStore on S3 and S3-compatible servers, through boto3.

``put_parts`` (segment copies) runs its own multipart upload: parts of ``part_size`` bytes,
``max_concurrency`` in flight on a thread pool, each streamed from the open file as it is sent (no part
buffers) with the CRC-32C its caller computed while validating those bytes, which S3 verifies; one
PutObject when the file fits in a part. When a part or the caller's validation fails the upload is
aborted; a process killed mid-upload leaves it behind: ``incomplete_uploads`` and ``abort_upload`` let
the sweeper find and abort those. ``put_file`` (snapshots) goes through boto3's managed transfer, which
buffers up to ``max_concurrency`` parts. Credentials come from the standard AWS chain unless given
explicitly.
"""

from __future__ import annotations

import base64
import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from functools import cached_property
from typing import Any, BinaryIO, TypeVar

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import ClientError, ConnectionError, HTTPClientError

from tiering_core.logs import get_logger
from tiering_core.stores.base import (
    IncompleteUpload,
    ObjectNotFound,
    Part,
    RemoteStoreError,
    StoreUnavailable,
    consecutive_parts,
)
from tiering_core.stores.config import S3StoreConfig
from tiering_core.stores.s3_ranges import PresignedRanges

T = TypeVar("T")
log = get_logger(__name__)
_MISSING = {"NoSuchKey", "404", "NotFound"}
# The store is there but does not serve (after botocore's own retries): as unreachable as a refused connection.
_UNAVAILABLE = {"SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout", "XMinioServerNotInitialized"}


class S3Store:
    def __init__(self, config: S3StoreConfig) -> None:
        self.bucket = config.bucket
        self.part_size = config.part_size
        self.max_concurrency = config.max_concurrency
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
            verify=str(config.ca_bundle) if config.ca_bundle is not None else None,
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

    def put_parts(self, key: str, fd: int, length: int, parts: Iterable[Part]) -> None:
        parts = consecutive_parts(key, parts, length, self.part_size)
        if length <= self.part_size:
            part = next(parts)
            body = _FileSlice(fd, 0, length)
            self._call("put", key, lambda: self.client.put_object(
                Bucket=self.bucket, Key=key, Body=body, ContentLength=length,
                ChecksumCRC32C=_crc32c_header(part.crc32c), **self.sse,
            ))  # fmt: skip
            next(parts, None)  # the check that the one part covers the file
            return
        created = self._call("upload", key, lambda: self.client.create_multipart_upload(
            Bucket=self.bucket, Key=key, ChecksumAlgorithm="CRC32C", **self.sse,
        ))  # fmt: skip
        upload_id = created["UploadId"]
        try:
            sent = self._send_parts(key, upload_id, fd, parts)
            self._call("upload", key, lambda: self.client.complete_multipart_upload(
                Bucket=self.bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": sent},
            ))  # fmt: skip
        except BaseException as first:
            try:
                self.abort_upload(IncompleteUpload(key, upload_id, 0))
            except Exception as cleanup:  # the sweeper aborts it later; the first error is the one to raise
                log.error("aborting a failed upload failed", key=key, error=str(cleanup), cause=str(first))
            raise

    def _send_parts(self, key: str, upload_id: str, fd: int, parts: Iterable[Part]) -> list[dict[str, Any]]:
        """Send the parts, ``max_concurrency`` at a time; the next part is taken (read and validated by
        the caller) while those are in flight, and only once a slot is free is it sent."""
        slots = threading.BoundedSemaphore(self.max_concurrency)
        futures: list[Future[dict[str, Any]]] = []

        def send(number: int, part: Part) -> dict[str, Any]:
            try:
                checksum = _crc32c_header(part.crc32c)
                response = self._call(f"upload part {number} of", key, lambda: self.client.upload_part(
                    Bucket=self.bucket, Key=key, UploadId=upload_id, PartNumber=number, ContentLength=part.size,
                    Body=_FileSlice(fd, part.offset, part.size), ChecksumCRC32C=checksum,
                ))  # fmt: skip
                return {"PartNumber": number, "ETag": response["ETag"], "ChecksumCRC32C": checksum}
            finally:
                slots.release()

        with ThreadPoolExecutor(self.max_concurrency, thread_name_prefix="s3-part") as pool:
            try:
                for number, part in enumerate(parts, 1):
                    slots.acquire()
                    failed = next((f for f in futures if f.done() and f.exception() is not None), None)
                    if failed is not None:
                        slots.release()
                        failed.result()  # raises the part's error: stop reading the file
                    futures.append(pool.submit(send, number, part))
            except BaseException:
                for future in futures:
                    future.cancel()
                raise
            return [future.result() for future in futures]

    def put_bytes(self, key: str, data: bytes) -> None:
        args: dict[str, Any] = {"Bucket": self.bucket, "Key": key, "Body": data, "ChecksumAlgorithm": "CRC32"}
        self._call("put", key, lambda: self.client.put_object(**args, **self.sse))

    def get_range(self, key: str, start: int, end: int) -> bytes:
        return self._get(key, Range=f"bytes={start}-{end}")

    def read_range(self, key: str, start: int, end: int) -> bytes:
        """One attempt, through a presigned URL on a per-thread keep-alive connection (``s3_ranges``): a tenth of
        boto3's CPU per GET and per byte; the caller retries (StoreUnavailable when the store did not answer)."""
        return self._ranges.get_range(key, start, end)

    def read_url(self, key: str, seconds: int) -> str:
        return self._ranges.sign(key, seconds)

    @cached_property
    def _ranges(self) -> PresignedRanges:
        return PresignedRanges(self.client, self.bucket, self.endpoint)

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


def _crc32c_header(crc: int) -> str:
    """A CRC-32C as S3's ``x-amz-checksum-crc32c`` header states it: base64 of its 4 big-endian bytes."""
    return base64.b64encode(crc.to_bytes(4, "big")).decode()


class _FileSlice:
    """A read-only, seekable file object over bytes ``[start, start + length)`` of an open fd.

    botocore reads a part body twice (the SigV4 payload hash over http, then the send) and seeks back to
    its start to retry a request; pread leaves the fd's own position alone, so parts read concurrently.
    """

    def __init__(self, fd: int, start: int, length: int) -> None:
        self.fd = fd
        self.start = start
        self.length = length
        self.pos = 0

    def read(self, n: int = -1) -> bytes:
        if n < 0 or self.pos + n > self.length:
            n = self.length - self.pos
        if n <= 0:
            return b""
        data = os.pread(self.fd, n, self.start + self.pos)
        if not data:
            raise RemoteStoreError(f"file ended at byte {self.start + self.pos} while sending it")
        self.pos += len(data)
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self.pos, 2: self.length}[whence]
        self.pos = max(0, min(self.length, base + offset))
        return self.pos

    def tell(self) -> int:
        return self.pos

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        """The descriptor belongs to the caller; botocore may call this."""
