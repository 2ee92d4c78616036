"""Snapshots of the metadata state and the WAL offsets they cover.

File layout (prefix and header length big-endian, columns little-endian as arrays on x86 and ARM)::

    b"TSNP" | version u16 | CRC-32C of body u32 | body length u64 | body
    body = JSON header length u32 | JSON header | per partition, in header order, its columns:
           ids (16n) | base, end, first_ts, max_ts, size, event_time (i64, 8n each) | epoch (i32, 4n)
           | state (n) | order (i64 rows by base offset, 8n)

Written atomically (temp file, fsync, rename, fsync of the directory), kept locally and copied to
the remote store through ``SnapshotStore``. A snapshot whose magic, length or checksum is wrong is
never loaded: ``load_snapshot`` raises SnapshotCorrupt and recovery falls back to an older one.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import sys
import time
from array import array
from pathlib import Path
from typing import BinaryIO, NamedTuple, Protocol

import crc32c

from metadata.partition import COLUMNS_Q, PartitionSegments
from metadata.records import topic_id_bytes, topic_id_str
from metadata.state import ClusterTiering, MetadataState
from segment_fsm import Fence, LogStarts, PartitionDeleteState, TopicTiering
from tiering_core.crash_points import crash_point
from tiering_core.errors import TieringError

MAGIC = b"TSNP"
VERSION = 1
_PREFIX = struct.Struct(">4sHIQ")
_U32 = struct.Struct(">I")
SUFFIX = ".tsnap"
_FILE_COLUMNS = ("ids", *COLUMNS_Q, "epoch", "state", "order")  # a partition's columns in file order


class SnapshotCorrupt(TieringError):
    """A snapshot file is truncated, damaged or of an unknown version: it must not be loaded."""


class SnapshotStore(Protocol):
    """Where snapshot copies go besides the local disk (the remote object store in production)."""

    def put_file(self, key: str, path: Path) -> None: ...

    def get_file(self, key: str, path: Path) -> None:
        """Download ``key`` to ``path``; raise FileNotFoundError if it does not exist."""

    def list_keys(self, prefix: str) -> list[str]: ...

    def delete(self, key: str) -> None:
        """Delete ``key``; a missing key is not an error."""


class LocalDirSnapshotStore:
    """A SnapshotStore over a directory (for tests, and a second local copy)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def put_file(self, key: str, path: Path) -> None:
        target = self.root / key
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".tmp")
        shutil.copyfile(path, tmp)
        tmp.replace(target)

    def get_file(self, key: str, path: Path) -> None:
        shutil.copyfile(self.root / key, path)

    def list_keys(self, prefix: str) -> list[str]:
        base = self.root / prefix
        if not base.is_dir():
            return []
        return sorted(f"{prefix}/{p.name}" for p in base.iterdir() if p.name.endswith(SUFFIX))

    def delete(self, key: str) -> None:
        (self.root / key).unlink(missing_ok=True)


def _little_endian(column: bytearray | array) -> bytearray | array:
    if sys.byteorder == "little" or not isinstance(column, array):
        return column
    swapped = array(column.typecode, column)
    swapped.byteswap()
    return swapped


class Snapshot(NamedTuple):
    """A loaded snapshot: the state, the next WAL offset per WAL partition it covers, and the id of
    the WAL topic it was taken from (None if unknown)."""

    state: MetadataState
    wal_offsets: dict[int, int]
    wal_topic_id: str | None


def encode_snapshot(
    state: MetadataState, wal_offsets: dict[int, int], wal_topic_id: str | None = None
) -> list[bytes | bytearray | array]:
    """The snapshot as buffers (prefix first): the state's own columns, not copies of them.

    The caller writes them out before the state changes (``MetadataManager`` holds its lock).
    """
    order = sorted(state.partitions)
    header = {
        "created_ms": int(time.time() * 1000),
        "wal_offsets": {str(k): v for k, v in sorted(wal_offsets.items())},
        "wal_topic_id": wal_topic_id,
        "cluster": [state.cluster.upload_paused, state.cluster.rolled_back],
        "topics": [
            [
                topic_id_str(tid),
                name,
                t.enabled,
                t.local_retention_ms,
                t.local_retention_bytes,
                t.upload_paused,
                t.download_paused,
                t.rolled_back,
            ]
            for tid, (name, t) in sorted(state.topics.items())
        ],
        "topic_since": {topic_id_str(tid): since for tid, since in sorted(state.topic_since.items())},
        "partitions": [],
    }
    blobs: list[bytes | bytearray | array] = []
    for key in order:
        p = state.partitions[key]
        header["partitions"].append(
            [
                topic_id_str(key[0]),
                key[1],
                p.topic,
                list(p.fence),
                None if p.delete_state is None else int(p.delete_state),
                len(p),
                p.max_span,
                list(p.log_starts),
            ]
        )
        blobs.extend(_little_endian(getattr(p, column)) for column in _FILE_COLUMNS)
    head = json.dumps(header).encode()
    body = [_U32.pack(len(head)), head, *blobs]
    crc = 0
    length = 0
    for chunk in body:
        crc = crc32c.crc32c(chunk, crc)
        length += memoryview(chunk).nbytes
    return [_PREFIX.pack(MAGIC, VERSION, crc, length), *body]


def _read_body(f: BinaryIO) -> Snapshot:
    def exact(n: int) -> bytes:
        data = f.read(n)
        if len(data) != n:
            raise ValueError("the body ends early")
        return data

    (head_len,) = _U32.unpack(exact(4))
    header = json.loads(exact(head_len))
    state = MetadataState()
    state.cluster = ClusterTiering(*header["cluster"])
    for tid, name, *flags in header["topics"]:
        state.topics[topic_id_bytes(tid)] = (name, TopicTiering(*flags))
    for tid, since in header.get("topic_since", {}).items():  # absent in snapshots of older sidecars
        state.topic_since[topic_id_bytes(tid)] = since
    for tid, num, topic, fence, delete_state, n, max_span, *log_starts in header["partitions"]:
        p = PartitionSegments(topic)
        p.fence = Fence(*fence)
        p.log_starts = LogStarts(*log_starts[0]) if log_starts else LogStarts()  # absent before LogStartRecord
        p.delete_state = None if delete_state is None else PartitionDeleteState(delete_state)
        for column in _FILE_COLUMNS:
            current = getattr(p, column)
            if isinstance(current, array):
                current.fromfile(f, n)  # EOFError when short
                if sys.byteorder == "big":
                    current.byteswap()
            else:
                setattr(p, column, bytearray(exact(n * (16 if column == "ids" else 1))))
        p.max_span = max_span
        state.partitions[(topic_id_bytes(tid), num)] = p
    if f.read(1):
        raise ValueError("unexpected bytes after the last partition")
    return Snapshot(state, {int(k): v for k, v in header["wal_offsets"].items()}, header["wal_topic_id"])


def write_snapshot(
    directory: Path, state: MetadataState, wal_offsets: dict[int, int], wal_topic_id: str | None = None
) -> Path:
    """Write a snapshot atomically into ``directory``; returns its path."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"snapshot-{time.time_ns():020d}{SUFFIX}"
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as f:
        for chunk in encode_snapshot(state, wal_offsets, wal_topic_id):
            f.write(chunk)
        f.flush()
        os.fsync(f.fileno())
    crash_point("snapshot.written")
    tmp.replace(path)
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return path


def load_snapshot(path: Path) -> Snapshot:
    """Rebuild a snapshot from its file; SnapshotCorrupt if anything is off.

    Two passes, both streamed: the checksum over the whole body first (nothing of a damaged file is
    parsed), then the columns straight into their arrays.
    """
    try:
        with path.open("rb") as f:
            prefix = f.read(_PREFIX.size)
            if len(prefix) != _PREFIX.size:
                raise SnapshotCorrupt(f"{path}: {len(prefix)} bytes is shorter than the snapshot prefix")
            magic, version, crc, length = _PREFIX.unpack(prefix)
            if magic != MAGIC or version != VERSION:
                raise SnapshotCorrupt(f"{path}: not a version {VERSION} snapshot (magic {magic!r}, version {version})")
            size = os.fstat(f.fileno()).st_size - _PREFIX.size
            if size != length:
                raise SnapshotCorrupt(f"{path}: body is {size} bytes, the prefix says {length} (truncated?)")
            actual = 0
            while chunk := f.read(1 << 20):
                actual = crc32c.crc32c(chunk, actual)
            if actual != crc:
                raise SnapshotCorrupt(f"{path}: CRC-32C mismatch")
            f.seek(_PREFIX.size)
            try:
                return _read_body(f)
            except (ValueError, KeyError, IndexError, TypeError, EOFError, struct.error) as exc:
                raise SnapshotCorrupt(f"{path}: malformed body: {exc}") from exc
    except OSError as exc:
        raise SnapshotCorrupt(f"{path}: cannot read: {exc}") from exc


def local_snapshots(directory: Path) -> list[Path]:
    """Snapshot files in ``directory``, newest first."""
    if not directory.is_dir():
        return []
    return sorted((p for p in directory.iterdir() if p.name.endswith(SUFFIX)), reverse=True)


def prune(directory: Path, keep: int) -> None:
    """Delete all but the ``keep`` newest snapshots (and stale temp files)."""
    for old in local_snapshots(directory)[keep:]:
        old.unlink(missing_ok=True)
    for tmp in directory.glob(f"*{SUFFIX}.tmp"):
        tmp.unlink(missing_ok=True)
