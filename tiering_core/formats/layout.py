"""Partition directories and segment files of a broker's log dirs.

A partition directory is ``<topic>-<partition>``; transient variants (``.<uuid>-delete``,
``-future``, ``-stray``) are skipped. Segment files are named by the 20-digit base offset; the
segment with the greatest base offset is the active one. Files with ``.deleted``, ``.cleaned`` or
``.swap`` suffixes are never segments.
"""

from __future__ import annotations

import mmap
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import crc32c

from tiering_core.errors import FormatError
from tiering_core.formats.batch import LOG_OVERHEAD, BatchHeader, TruncatedBatchError
from tiering_core.formats.indexes import last_time_index_entry
from tiering_core.formats.records import verify_batches

_PARTITION_DIR = re.compile(r"^(?P<topic>.+)-(?P<partition>\d+)$")
_SEGMENT_LOG = re.compile(r"^(?P<base>\d{20})\.log$")
# Bytes of a segment read at a time while validating it for a copy; window edges fall at its multiples.
# Small, as the buffer (window plus a batch cut by its edge) is the copy's only memory per segment.
VALIDATION_WINDOW = 2 << 20


def parse_partition_dir(name: str) -> tuple[str, int] | None:
    """``("orders", 3)`` for ``orders-3``; None for anything that is not a live partition dir."""
    if name.endswith(("-delete", "-future", "-stray")):
        return None
    match = _PARTITION_DIR.match(name)
    if match is None:
        return None
    return match["topic"], int(match["partition"])


def segment_file_name(base_offset: int, suffix: str) -> str:
    """``00000000000000001234.log`` for (1234, ".log")."""
    return f"{base_offset:020d}{suffix}"


@dataclass(frozen=True, slots=True)
class SegmentFiles:
    """The files of one segment in a partition directory (``txnindex`` may not exist)."""

    partition_dir: Path
    base_offset: int

    def path(self, suffix: str) -> Path:
        return self.partition_dir / segment_file_name(self.base_offset, suffix)

    @property
    def log(self) -> Path:
        return self.path(".log")

    @property
    def index(self) -> Path:
        return self.path(".index")

    @property
    def timeindex(self) -> Path:
        return self.path(".timeindex")

    @property
    def txnindex(self) -> Path:
        return self.path(".txnindex")

    def max_timestamp(self) -> int:
        """The largest record timestamp, from the last time-index entry (-1 when there is none)."""
        last = last_time_index_entry(self.timeindex, self.base_offset)
        return -1 if last is None else last.timestamp

    def largest_timestamp(self) -> int:
        """The timestamp retention judges the segment by, as Kafka's ``LogSegment.largestTimestamp``:
        the largest record timestamp from the time index, else the ``.log``'s modification time (ms).

        The index holds no entry for a while around a roll (a small segment's index is empty, or still
        preallocated zeros, which read as a timestamp of 0), so 0 counts as "none" here too (Kafka
        takes >= 0): without the fallback a copy would look 55 years old and expire at once.
        Raises FileNotFoundError if the segment is gone.
        """
        timestamp = self.max_timestamp()
        return timestamp if timestamp > 0 else file_mtime_ms(os.stat(self.log))


def file_mtime_ms(stat: os.stat_result) -> int:
    """A file's modification time in milliseconds (Java's ``File.lastModified``)."""
    return stat.st_mtime_ns // 1_000_000


def list_segments(partition_dir: Path) -> list[SegmentFiles]:
    """The partition's segments sorted by base offset; the last one is the active segment."""
    bases = []
    try:
        names = [p.name for p in partition_dir.iterdir()]
    except FileNotFoundError:
        return []
    for name in names:
        match = _SEGMENT_LOG.match(name)
        if match is not None:
            bases.append(int(match["base"]))
    return [SegmentFiles(partition_dir, b) for b in sorted(bases)]


def find_partition_dirs(log_dirs: list[Path]) -> dict[tuple[str, int], Path]:
    """Every live partition directory under the given log dirs, keyed by (topic, partition)."""
    found: dict[tuple[str, int], Path] = {}
    for log_dir in log_dirs:
        try:
            entries = list(log_dir.iterdir())
        except FileNotFoundError:
            continue
        for entry in entries:
            parsed = parse_partition_dir(entry.name)
            if parsed is not None and entry.is_dir():
                found[parsed] = entry
    return found


@contextmanager
def mapped(path: Path) -> Iterator[memoryview]:
    """The file's bytes as a read-only memoryview over an mmap (empty for an empty file).

    Pages are loaded on demand by the kernel, so memory stays bounded by what is touched.
    """
    with path.open("rb") as f, mapped_fd(f.fileno()) as view:
        yield view


@contextmanager
def mapped_fd(fd: int) -> Iterator[memoryview]:
    """``mapped`` for a file descriptor that is already open (the file may be renamed meanwhile)."""
    if os.fstat(fd).st_size == 0:
        yield memoryview(b"")
        return
    mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    view = memoryview(mm)
    try:
        yield view
    finally:
        view.release()
        mm.close()


@dataclass(frozen=True, slots=True)
class SegmentSummary:
    """What a full CRC validation of a ``.log`` found (offsets inclusive)."""

    path: str
    base_offset: int
    last_offset: int
    max_timestamp: int
    size: int
    batch_count: int
    leader_epochs: tuple[int, ...]


def summarize_segment(path: Path, size: int | None = None) -> SegmentSummary:
    """Validate every batch's header and CRC in ``path`` (up to ``size`` bytes) and summarize it.

    Raises FormatError naming the file and byte position of the first problem (TruncatedBatchError
    for a partial tail), or when the file holds no batch at all.
    """
    with mapped(path) as buf:
        return summarize_buffer(str(path), buf, len(buf) if size is None else min(size, len(buf)))


class _Summarizer:
    """Accumulates batch headers (absolute positions) into a SegmentSummary."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.first: BatchHeader | None = None
        self.last: BatchHeader | None = None
        self.last_end = 0
        self.count = 0
        self.max_ts = -1
        self.epochs: list[int] = []

    def add(self, header: BatchHeader, position: int) -> None:
        if self.last is not None and header.base_offset <= self.last.last_offset:
            raise FormatError(
                self.name, position, f"offsets go backwards: {header.base_offset} follows {self.last.last_offset}"
            )
        if self.first is None:
            self.first = header
        self.last = header
        self.last_end = position + header.size
        self.count += 1
        self.max_ts = max(self.max_ts, header.max_timestamp)
        if not self.epochs or self.epochs[-1] != header.partition_leader_epoch:
            self.epochs.append(header.partition_leader_epoch)

    def result(self) -> SegmentSummary:
        if self.first is None or self.last is None:
            raise FormatError(self.name, 0, "segment holds no record batch")
        return SegmentSummary(
            self.name, self.first.base_offset, self.last.last_offset, self.max_ts, self.last_end, self.count,
            tuple(self.epochs),
        )  # fmt: skip


def summarize_buffer(name: str, buf: bytes | memoryview, end: int) -> SegmentSummary:
    """``summarize_segment`` over bytes already in hand."""
    acc = _Summarizer(name)
    for header in verify_batches(name, buf, 0, end):
        acc.add(header, header.position)
    return acc.result()


def summarize_fd(name: str, fd: int, length: int, window: int = VALIDATION_WINDOW) -> tuple[SegmentSummary, int]:
    """Validate a rolled segment: exactly the bytes ``[0, length)`` of an open file, ``window`` at a time.

    Returns the summary and the CRC-32C of the bytes ``[0, length)``; see SegmentValidator.
    """
    if window < 1:
        raise ValueError(f"window must be at least 1 byte, not {window}")
    validator = SegmentValidator(name, length)
    while validator.read_to < length:
        validator.read(fd, min(window, length - validator.read_to))
    return validator.result()


class SegmentValidator:
    """Validates a rolled segment as its bytes ``[0, length)`` are read in order, window by window.

    A rolled segment is immutable and Kafka trims it to its data, so its batches must cover the
    ``length`` bytes exactly (``summary.size == length``). A zero length field, a zero-filled or
    partial tail, or a file shorter than ``length`` raises FormatError: a scan that ends early must
    never pass for the end of the segment, or a copy would hold only part of it. A window edge may
    fall anywhere, also inside a batch header whose first bytes are zero (the high bytes of a small
    base offset); the bytes after a window's last whole batch are scanned again with the next window.

    Each window is read into one reused buffer, right after the carried bytes of a batch the previous
    window cut, and checked in place (no copy of the window, no allocation per window): a copy
    (``SegmentCopier``) reads every byte it uploads once, here, and hands each window's CRC-32C to
    the store. Memory stays bounded by the window plus the largest batch, whatever the segment size.
    Errors name absolute byte positions in ``name`` (TruncatedBatchError for a batch cut by the end
    of ``length``).
    """

    def __init__(self, name: str, length: int) -> None:
        self.name = name
        self.length = length
        self.read_to = 0  # file position of the next byte to read
        self.acc = _Summarizer(name)
        self.crc = 0
        self.buf = bytearray()
        self.start = 0  # buf[start:filled] are bytes read and not yet consumed by a whole batch
        self.filled = 0

    def read(self, fd: int, size: int) -> memoryview:
        """Read the next ``size`` bytes of the segment from ``fd`` and check every batch they complete.

        Returns those bytes, valid until the next call (the buffer is reused).
        """
        carried = self.filled - self.start
        if carried + size > len(self.buf):  # room for a batch of up to ``size`` bytes cut by the edge, too
            grown = bytearray(max(carried + size, 2 * size))
            grown[:carried] = self.buf[self.start : self.filled]
            self.buf = grown
        elif self.start:
            self.buf[:carried] = self.buf[self.start : self.filled]
        base = self.read_to - carried  # file position of buf[0]
        window = memoryview(self.buf)
        fresh = window[carried : carried + size]
        got = 0
        while got < size:
            n = os.preadv(fd, [fresh[got:]], self.read_to + got)
            if n == 0:
                raise FormatError(self.name, self.read_to + got, f"file ended at byte {self.read_to + got}, "
                                  f"expected {self.length} bytes")  # fmt: skip
            got += n
        self.read_to += size
        self.start, self.filled = 0, carried + size
        self._scan(window[: self.filled], base)
        return fresh

    def _scan(self, buf: memoryview, base: int) -> None:
        final = self.read_to >= self.length
        consumed = 0
        try:
            for header in verify_batches(self.name, buf, 0, len(buf)):
                self.acc.add(header, base + header.position)
                consumed = header.position + header.size
                self.crc = crc32c.crc32c(buf[header.position : consumed], self.crc)
        except TruncatedBatchError as exc:  # cut by the window's end: more bytes are needed
            if final or _past_end(buf, exc.position, base, self.length):
                raise TruncatedBatchError(self.name, base + exc.position, exc.reason) from exc
        except FormatError as exc:
            raise type(exc)(self.name, base + exc.position, exc.reason) from exc
        else:
            # the scan stopped on zero bytes: under 12 of them at a window's end may be a header cut by
            # the edge; anywhere else (a zero length field, a zero-filled tail) it is not a batch
            left = len(buf) - consumed
            if left and (final or left >= LOG_OVERHEAD):
                raise FormatError(
                    self.name, base + consumed,
                    f"no record batch at byte {base + consumed} (zero length field or zero-filled bytes) in a "
                    f"rolled segment of {self.length} bytes: its batches must cover it exactly",
                )  # fmt: skip
        self.start = consumed

    def result(self) -> tuple[SegmentSummary, int]:
        """The summary and the CRC-32C of the bytes ``[0, length)``, once they have all been read."""
        if self.read_to < self.length:
            raise ValueError(f"{self.name}: validated {self.read_to} of {self.length} bytes")
        return self.acc.result(), self.crc


def _past_end(buf: bytes | memoryview, position: int, base: int, length: int) -> bool:
    """Whether the batch at ``buf[position:]`` claims to extend past byte ``length`` of the file
    (reading further windows could not complete it: fail now, not after buffering the rest)."""
    if len(buf) - position < LOG_OVERHEAD:
        return False
    size = int.from_bytes(buf[position + 8 : position + 12], "big", signed=True) + LOG_OVERHEAD
    return base + position + size > length
