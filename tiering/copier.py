"""Moving segment bytes to and from the remote store (Kafka's RemoteStorageManager, in spirit).

``copy`` uploads the ``.log`` part by part as it validates it (every batch's CRC, read once in
part-sized windows so memory stays bounded): the store asks for the next part while earlier ones are
in flight, each part is sent with the CRC-32C of the bytes validated, which the store verifies, and the
upload is completed only once the whole segment passed; then the ``.indexes`` blob, and the manifest
last. It reads through file descriptors opened before anything else, so Kafka renaming the segment to
``.deleted`` meanwhile does not matter, and only up to the size the segment had when the copy
started. On any failure it deletes what it wrote (a cleanup failure is logged and never hides the
first error) and raises. It knows nothing of the metadata WAL: the caller writes
COPY_SEGMENT_STARTED before and COPY_SEGMENT_FINISHED after.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import crc32c

from tiering_core.crash_points import crash_point
from tiering_core.errors import FormatError, TieringError
from tiering_core.formats import (
    VALIDATION_WINDOW,
    SegmentFiles,
    SegmentSummary,
    SegmentValidator,
    file_mtime_ms,
    segment_file_name,
)
from tiering_core.logs import get_logger
from tiering_core.objects import INDEX_PARTS, Manifest, SegmentRef
from tiering_core.ratelimit import RateLimiter
from tiering_core.stores.base import ObjectNotFound, Part, RemoteStore, RemoteStoreError

log = get_logger(__name__)


class SegmentGone(TieringError):
    """The local segment disappeared before its copy started (Kafka's retention deleted it)."""


@dataclass(frozen=True, slots=True)
class LocalSegment:
    """A local segment to copy: its files and the base offset of the segment after it."""

    files: SegmentFiles
    next_base_offset: int

    def producer_snapshot(self) -> Path:
        return self.files.partition_dir / segment_file_name(self.next_base_offset, ".snapshot")

    def leader_epoch_checkpoint(self) -> Path:
        return self.files.partition_dir / "leader-epoch-checkpoint"


class SegmentCopier:
    def __init__(self, store: RemoteStore, *, limiter: RateLimiter | None = None, max_concurrent: int = 2) -> None:
        self.store = store
        self.limiter = limiter
        self.slots = threading.BoundedSemaphore(max_concurrent)

    def copy(self, ref: SegmentRef, segment: LocalSegment, size: int | None = None, leader_epoch: int = -1
             ) -> Manifest:  # fmt: skip
        """Copy the rolled segment's bytes ``[0, size)`` (default: its current size) under ``ref``'s keys,
        made by the leader of ``leader_epoch`` (the manifest says so: ``Manifest.preference``).

        The copy is whole or nothing: its batches must cover exactly ``size`` bytes and every offset up
        to the next segment's base offset - 1, which the manifest then states. Raises SegmentGone if the
        ``.log`` is gone, FormatError if it is corrupt or does not cover the segment (the upload, begun
        with the first parts, is aborted: nothing is stored), RemoteStoreError if the store fails
        (whatever was uploaded is deleted again).
        """
        with ExitStack() as files:
            try:
                log_fd = os.open(segment.files.log, os.O_RDONLY)
            except FileNotFoundError as exc:
                raise SegmentGone(f"{segment.files.log} no longer exists") from exc
            files.callback(os.close, log_fd)
            extras = {name: _read_optional(path) for name, path in self._index_files(segment).items()}
            length = os.fstat(log_fd).st_size if size is None else size
            validator = SegmentValidator(str(segment.files.log), length)
            parts: dict[str, tuple[int, int]] = {}
            position = 0
            for name in INDEX_PARTS:
                parts[name] = (position, len(extras[name]))
                position += len(extras[name])
            indexes = b"".join(extras[name] for name in INDEX_PARTS)
            log_key, index_key, manifest_key = ref.object_keys()
            with self.slots:
                try:
                    self.store.put_parts(log_key, log_fd, length, self._validated_parts(validator, log_fd, segment))
                    summary, log_crc = validator.result()
                    manifest = Manifest(
                        topic=ref.topic,
                        topic_id=ref.topic_id,
                        partition=ref.partition,
                        segment_id=ref.segment_id,
                        base_offset=ref.base_offset,
                        end_offset=summary.last_offset,
                        max_timestamp=summary.max_timestamp if summary.max_timestamp >= 0
                        else file_mtime_ms(os.fstat(log_fd)),
                        leader_epochs=[(e, ref.base_offset) for e in summary.leader_epochs],
                        log_size=length,
                        log_crc32c=log_crc,
                        indexes_size=len(indexes),
                        indexes_crc32c=crc32c.crc32c(indexes),
                        index_parts=parts,
                        created_ms=int(time.time() * 1000),
                        leader_epoch=leader_epoch,
                    )  # fmt: skip
                    stored = self.store.head(log_key)
                    if stored != length:
                        raise RemoteStoreError(f"{log_key} holds {stored} bytes after the upload, expected {length}")
                    crash_point("copy.log_uploaded")
                    self.store.put_bytes(index_key, indexes)
                    crash_point("copy.indexes_uploaded")
                    self.store.put_bytes(manifest_key, manifest.encode())
                except BaseException as first:
                    try:
                        self.store.delete([manifest_key, index_key, log_key])
                    except Exception as cleanup:
                        log.error("cleaning up a failed copy failed", segment=str(ref), error=str(cleanup),
                                  cause=str(first))  # fmt: skip
                    raise
            return manifest

    def _validated_parts(self, validator: SegmentValidator, log_fd: int, segment: LocalSegment) -> Iterator[Part]:
        """The ``.log``'s parts for ``put_parts``, each read once (rate limited), validated in windows of
        VALIDATION_WINDOW bytes and given with the CRC-32C of the bytes validated. The last part is given
        only once the whole segment passed (``_check_covers``), so a segment that fails is never
        completed in the store."""
        length = validator.length
        for offset in range(0, length, self.store.part_size):
            size = min(self.store.part_size, length - offset)
            if self.limiter is not None:
                self.limiter.acquire(size)
            crash_point("copy.part")
            crc = 0
            for start in range(offset, offset + size, VALIDATION_WINDOW):  # a small buffer, whatever the part size
                crc = crc32c.crc32c(validator.read(log_fd, min(VALIDATION_WINDOW, offset + size - start)), crc)
            part = Part(offset, size, crc)
            if validator.read_to == length:
                _check_covers(validator.result()[0], segment)
            yield part
        if length == 0:
            validator.result()  # raises: a segment holds at least one batch

    def _index_files(self, segment: LocalSegment) -> dict[str, Path]:
        f = segment.files
        return {
            "offset": f.index,
            "time": f.timeindex,
            "txn": f.txnindex,
            "producer_snapshot": segment.producer_snapshot(),
            "leader_epoch": segment.leader_epoch_checkpoint(),
        }

    def delete(self, ref: SegmentRef) -> None:
        """Delete every object of the copy, manifest first, also under the legacy layout (idempotent)."""
        kinds = ("manifest", "indexes", "log")
        legacy = [key for kind in kinds if (key := ref.legacy_key(kind)) is not None]
        self.store.delete([ref.key(kind) for kind in kinds] + legacy)

    def manifest(self, ref: SegmentRef) -> Manifest:
        """The copy's manifest (under the legacy layout for copies written before it changed);
        ObjectNotFound if the copy is not (or no longer) complete."""
        key = ref.key("manifest")
        try:
            return Manifest.decode(self.store.get_bytes(key), key)
        except ObjectNotFound:
            legacy = ref.legacy_key("manifest")
            if legacy is None:
                raise
            return Manifest.decode(self.store.get_bytes(legacy), legacy)


def _read_optional(path: Path) -> bytes:
    """A small index file's bytes; b'' when Kafka has not created it. Preallocated zero tails are
    kept as they are: readers stop at them exactly as Kafka does."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return b""


def _check_covers(summary: SegmentSummary, segment: LocalSegment) -> None:
    """FormatError unless the batches end right before the next segment's base offset."""
    if summary.last_offset != segment.next_base_offset - 1:
        raise FormatError(
            summary.path, summary.size,
            f"batches end at offset {summary.last_offset}, but the next segment starts at "
            f"{segment.next_base_offset}: the segment would not be copied whole",
        )  # fmt: skip
