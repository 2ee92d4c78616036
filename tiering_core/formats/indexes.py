"""Kafka's per-segment index files and per-partition metadata files.

- ``.index``: 8-byte entries (relative offset int32, position int32), sparse.
- ``.timeindex``: 12-byte entries (timestamp int64, relative offset int32).
  Both may be preallocated with a zero tail (an active or crashed segment): reading stops at the
  first entry after slot 0 whose relative offset is 0, as DumpLogSegments does.
- ``.txnindex``: 34-byte AbortedTxn entries (version int16, producerId, firstOffset, lastOffset,
  lastStableOffset int64); a partial trailing entry is ignored.
- ``<offset>.snapshot``: producer state, version 1 with a CRC-32C over bytes [6, EOF).
- ``leader-epoch-checkpoint``: text, version 0, count, "epoch startOffset" lines.
- ``partition.metadata``: text, ``version: 0`` and ``topic_id: <base64 uuid>``.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import NamedTuple

import crc32c

from tiering_core.errors import FormatError

_OFFSET_ENTRY = struct.Struct(">ii")
_TIME_ENTRY = struct.Struct(">qi")
_TXN_ENTRY = struct.Struct(">hqqqq")
_SNAPSHOT_HEADER = struct.Struct(">hIi")
_SNAPSHOT_ENTRY = struct.Struct(">qhiqiqiq")


class OffsetIndexEntry(NamedTuple):
    offset: int
    position: int


class TimeIndexEntry(NamedTuple):
    timestamp: int
    offset: int


class AbortedTxn(NamedTuple):
    version: int
    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int


class ProducerEntry(NamedTuple):
    producer_id: int
    epoch: int
    last_sequence: int
    last_offset: int
    offset_delta: int
    timestamp: int
    coordinator_epoch: int
    current_txn_first_offset: int


class EpochEntry(NamedTuple):
    epoch: int
    start_offset: int


def parse_offset_index(data: bytes, base_offset: int) -> list[OffsetIndexEntry]:
    """Entries of an ``.index`` file's bytes, absolute offsets; stops at a zero-filled tail."""
    entries = []
    for slot, (rel, position) in enumerate(_OFFSET_ENTRY.iter_unpack(data[: len(data) // 8 * 8])):
        if slot > 0 and rel == 0:
            break
        entries.append(OffsetIndexEntry(base_offset + rel, position))
    return entries


def parse_time_index(data: bytes, base_offset: int) -> list[TimeIndexEntry]:
    """Entries of a ``.timeindex`` file's bytes, absolute offsets; stops at a zero-filled tail."""
    entries = []
    for slot, (ts, rel) in enumerate(_TIME_ENTRY.iter_unpack(data[: len(data) // 12 * 12])):
        if slot > 0 and rel == 0:
            break
        entries.append(TimeIndexEntry(ts, base_offset + rel))
    return entries


def last_time_index_entry(path: Path, base_offset: int) -> TimeIndexEntry | None:
    """The last entry of a ``.timeindex`` file, as ``parse_time_index(read_file(path), ...)[-1]`` gives it
    (None for an empty or absent file), reading O(log n) entries instead of the whole file.

    Kafka preallocates the active segment's index (``segment.index.bytes``, 10 MiB by default) and fills it
    from the start; reading it whole for its last entry cost milliseconds per partition per tick. Entries
    after slot 0 have strictly increasing relative offsets (``TimeIndex`` appends only a larger timestamp, and
    never for an offset before the last), so "a relative offset of 0 after slot 0" (the zero-filled tail)
    holds for a suffix of the slots: a binary search finds where it begins.
    """
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        slots = os.fstat(fd).st_size // _TIME_ENTRY.size

        def entry(slot: int) -> tuple[int, int] | None:  # None past the end (Kafka trims the file at a roll)
            data = os.pread(fd, _TIME_ENTRY.size, slot * _TIME_ENTRY.size)
            return _TIME_ENTRY.unpack(data) if len(data) == _TIME_ENTRY.size else None

        low, high = 1, slots  # the zero tail begins in [low, high] (high: there is none)
        while low < high:
            mid = (low + high) // 2
            found = entry(mid)
            if found is None or found[1] == 0:
                high = mid
            else:
                low = mid + 1
        last = entry(low - 1) if slots else None
        return None if last is None else TimeIndexEntry(last[0], base_offset + last[1])
    finally:
        os.close(fd)


def parse_txn_index(data: bytes, path: str = "<txnindex>") -> list[AbortedTxn]:
    """Aborted transactions of a ``.txnindex`` file's bytes (an absent file is empty)."""
    entries = []
    for i, fields in enumerate(_TXN_ENTRY.iter_unpack(data[: len(data) // 34 * 34])):
        if fields[0] != 0:
            raise FormatError(path, i * 34, f"unknown aborted-transaction entry version {fields[0]}")
        entries.append(AbortedTxn(*fields))
    return entries


def parse_producer_snapshot(data: bytes, path: str = "<snapshot>") -> list[ProducerEntry]:
    """Producer entries of a ``.snapshot`` file, after checking its version and CRC-32C."""
    if len(data) < _SNAPSHOT_HEADER.size:
        raise FormatError(path, 0, f"producer snapshot of {len(data)} bytes is shorter than its header")
    version, crc, count = _SNAPSHOT_HEADER.unpack_from(data, 0)
    if version != 1:
        raise FormatError(path, 0, f"unsupported producer snapshot version {version}")
    actual = crc32c.crc32c(data[6:])
    if actual != crc:
        raise FormatError(path, 2, f"producer snapshot CRC-32C mismatch: stored {crc}, computed {actual}")
    if count < 0 or len(data) != 10 + count * _SNAPSHOT_ENTRY.size:
        raise FormatError(path, 6, f"producer snapshot claims {count} entries in {len(data)} bytes")
    return [ProducerEntry(*f) for f in _SNAPSHOT_ENTRY.iter_unpack(data[10:])]


def parse_leader_epoch_checkpoint(text: str, path: str = "leader-epoch-checkpoint") -> list[EpochEntry]:
    """Entries of a ``leader-epoch-checkpoint`` file (empty file: no entries)."""
    lines = text.splitlines()
    if not lines:
        return []
    try:
        version = int(lines[0])
        count = int(lines[1])
        entries = []
        for line in lines[2:]:
            fields = line.split()
            if len(fields) != 2:
                raise ValueError(f"line {line!r} does not have 2 fields")
            entries.append(EpochEntry(int(fields[0]), int(fields[1])))
    except (ValueError, IndexError) as exc:
        raise FormatError(path, 0, f"malformed leader epoch checkpoint: {exc}") from exc
    if version != 0:
        raise FormatError(path, 0, f"unsupported leader epoch checkpoint version {version}")
    if count != len(entries):
        raise FormatError(path, 0, f"leader epoch checkpoint declares {count} entries but has {len(entries)}")
    return entries


def read_topic_id(partition_dir: Path) -> str | None:
    """The topic id from ``partition.metadata`` (base64 Kafka Uuid), or None if the file is absent."""
    path = partition_dir / "partition.metadata"
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    topic_id = fields.get("topic_id", "").strip()
    if not topic_id or fields.get("version", "").strip() not in {"0"}:
        raise FormatError(str(path), 0, f"malformed partition.metadata: {text!r}")
    return topic_id


def read_file(path: Path) -> bytes:
    """Bytes of a small index file, b'' if it does not exist (Kafka creates some lazily)."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return b""
