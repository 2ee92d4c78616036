"""Snapshots of the metadata state and the WAL offsets they cover.

File layout (all big-endian)::

    b"TSNP" | version u16 | CRC-32C of body u32 | body length u64 | body
    body = JSON header length u32 | JSON header | per partition, in header order, its columns:
           ids (16n) | base, end, max_ts, size, event_time (8n each) | epoch (4n) | state (n) | order (8n)

Written atomically (temp file, fsync, rename, fsync of the directory), kept locally and copied to
the remote store through ``SnapshotStore``. A snapshot whose magic, length or checksum is wrong is
never loaded: ``load_snapshot`` raises SnapshotCorrupt and recovery falls back to an older one.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import time
from pathlib import Path
from typing import Protocol

import crc32c

from metadata.partition import COLUMNS_Q, PartitionSegments
from metadata.records import topic_id_bytes, topic_id_str
from metadata.state import ClusterTiering, MetadataState
from segment_fsm import Fence, PartitionDeleteState, TopicTiering
from tiering.errors import TieringError

MAGIC = b"TSNP"
VERSION = 1
_PREFIX = struct.Struct(">4sHIQ")
_U32 = struct.Struct(">I")
SUFFIX = ".tsnap"


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


def encode_snapshot(state: MetadataState, wal_offsets: dict[int, int]) -> list[bytes]:
    """The snapshot's bytes as chunks (prefix first), so large states are not copied into one buffer."""
    order = sorted(state.partitions)
    header = {
        "created_ms": int(time.time() * 1000),
        "wal_offsets": {str(k): v for k, v in sorted(wal_offsets.items())},
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
        "partitions": [],
    }
    blobs: list[bytes] = []
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
            ]
        )
        blobs.append(bytes(p.ids))
        blobs.extend(getattr(p, c).tobytes() for c in COLUMNS_Q)
        blobs.append(p.epoch.tobytes())
        blobs.append(bytes(p.state))
        blobs.append(p.order.tobytes())
    head = json.dumps(header).encode()
    body = [_U32.pack(len(head)), head, *blobs]
    crc = 0
    length = 0
    for chunk in body:
        crc = crc32c.crc32c(chunk, crc)
        length += len(chunk)
    return [_PREFIX.pack(MAGIC, VERSION, crc, length), *body]


def decode_snapshot(data: bytes, name: str = "<snapshot>") -> tuple[MetadataState, dict[int, int]]:
    """Rebuild (state, WAL offsets) from snapshot bytes; SnapshotCorrupt if anything is off."""
    if len(data) < _PREFIX.size:
        raise SnapshotCorrupt(f"{name}: {len(data)} bytes is shorter than the snapshot prefix")
    magic, version, crc, length = _PREFIX.unpack_from(data, 0)
    if magic != MAGIC or version != VERSION:
        raise SnapshotCorrupt(f"{name}: not a version {VERSION} snapshot (magic {magic!r}, version {version})")
    body = memoryview(data)[_PREFIX.size :]
    if len(body) != length:
        raise SnapshotCorrupt(f"{name}: body is {len(body)} bytes, the prefix says {length} (truncated?)")
    if crc32c.crc32c(body) != crc:
        raise SnapshotCorrupt(f"{name}: CRC-32C mismatch")
    try:
        return _decode_body(body)
    except (ValueError, KeyError, IndexError, TypeError, struct.error) as exc:
        raise SnapshotCorrupt(f"{name}: malformed body: {exc}") from exc


def _decode_body(body: memoryview) -> tuple[MetadataState, dict[int, int]]:
    (head_len,) = _U32.unpack_from(body, 0)
    header = json.loads(bytes(body[4 : 4 + head_len]))
    pos = 4 + head_len
    state = MetadataState()
    state.cluster = ClusterTiering(*header["cluster"])
    for tid, name, *flags in header["topics"]:
        state.topics[topic_id_bytes(tid)] = (name, TopicTiering(*flags))

    def take(n: int) -> memoryview:
        nonlocal pos
        chunk = body[pos : pos + n]
        if len(chunk) != n:
            raise ValueError("columns run past the end")
        pos += n
        return chunk

    for tid, num, topic, fence, delete_state, n, max_span in header["partitions"]:
        p = PartitionSegments(topic)
        p.fence = Fence(*fence)
        p.delete_state = None if delete_state is None else PartitionDeleteState(delete_state)
        p.ids = bytearray(take(16 * n))
        for column in COLUMNS_Q:
            getattr(p, column).frombytes(take(8 * n))
        p.epoch.frombytes(take(4 * n))
        p.state = bytearray(take(n))
        p.order.frombytes(take(8 * n))
        p.max_span = max_span
        state.partitions[(topic_id_bytes(tid), num)] = p
    if pos != len(body):
        raise ValueError(f"{len(body) - pos} unexpected bytes after the last partition")
    return state, {int(k): v for k, v in header["wal_offsets"].items()}


def write_snapshot(directory: Path, state: MetadataState, wal_offsets: dict[int, int]) -> Path:
    """Write a snapshot atomically into ``directory``; returns its path."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"snapshot-{time.time_ns():020d}{SUFFIX}"
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as f:
        for chunk in encode_snapshot(state, wal_offsets):
            f.write(chunk)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return path


def load_snapshot(path: Path) -> tuple[MetadataState, dict[int, int]]:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SnapshotCorrupt(f"{path}: cannot read: {exc}") from exc
    return decode_snapshot(data, str(path))


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
