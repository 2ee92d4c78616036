"""The RecordBatch v2 header (magic 2) and the header-only scan of a ``.log``.

Layout (61 bytes, big-endian): baseOffset int64, length int32 (bytes after this field),
partitionLeaderEpoch int32, magic int8, crc uint32 (CRC-32C over attributes..end), attributes int16,
lastOffsetDelta int32, baseTimestamp int64, maxTimestamp int64, producerId int64, producerEpoch
int16, baseSequence int32, recordsCount int32. See docs/kafka-formats.md.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import NamedTuple

from tiering_core.errors import FormatError, UnsupportedFormatError

HEADER = struct.Struct(">qiiBIhiqqqhii")
HEADER_SIZE = HEADER.size  # 61
LOG_OVERHEAD = 12  # baseOffset + length: the batch occupies length + 12 bytes
MIN_LENGTH = HEADER_SIZE - LOG_OVERHEAD  # 49: a v2 batch with no records
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")


class BatchHeader(NamedTuple):
    """One batch's header fields, plus ``position``: where the batch starts in its file."""

    base_offset: int
    length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int
    position: int

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def size(self) -> int:
        """Bytes the batch occupies in the file (``length + 12``)."""
        return self.length + LOG_OVERHEAD

    @property
    def compression(self) -> str:
        return CODECS[self.attributes & 7]

    @property
    def timestamp_type(self) -> str:
        return "LogAppendTime" if self.attributes & 0x08 else "CreateTime"

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & 0x10)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & 0x20)

    @property
    def has_delete_horizon(self) -> bool:
        return bool(self.attributes & 0x40)


class TruncatedBatchError(FormatError):
    """The last batch extends past the end of the data (a partial tail).

    Kafka's own iteration stops silently there (the broker may still be writing it, or crashed
    mid-write); for a rolled segment it means the file is damaged. The caller decides.
    """


def check_header(path: str, buf: bytes | memoryview, pos: int, end: int) -> BatchHeader | None:
    """Validate and unpack the header at ``pos``; None at the end of data.

    End of data is ``pos == end``, fewer than 17 bytes left with nothing but zeros, or a zero length
    field (a preallocated, zero-filled tail). Raises FormatError for a bad length, a legacy magic, an
    unknown magic or codec, and TruncatedBatchError when the batch extends past ``end``.
    """
    remaining = end - pos
    if remaining <= 0:
        return None
    if remaining < 17:
        if not any(buf[pos:end]):
            return None
        raise TruncatedBatchError(path, pos, f"{remaining} trailing bytes, too few for a batch header")
    length = int.from_bytes(buf[pos + 8 : pos + 12], "big", signed=True)
    if length == 0:
        return None
    magic = buf[pos + 16]
    if magic in (0, 1):
        raise UnsupportedFormatError(
            path, pos, f"legacy message format v{magic} (magic {magic}); only record batches v2 are supported"
        )
    if magic != 2:
        raise FormatError(path, pos, f"unknown magic byte {magic}")
    if length < MIN_LENGTH:
        raise FormatError(path, pos, f"batch length {length} is below the minimum {MIN_LENGTH}")
    if pos + LOG_OVERHEAD + length > end:
        raise TruncatedBatchError(
            path, pos, f"batch of {length + LOG_OVERHEAD} bytes extends past the end of data at byte {end}"
        )
    header = BatchHeader._make((*HEADER.unpack_from(buf, pos), pos))
    if header.attributes & 7 > 4:
        raise FormatError(path, pos, f"unknown compression codec id {header.attributes & 7}")
    if header.records_count < 0 or header.last_offset_delta < 0:
        raise FormatError(
            path,
            pos,
            f"negative recordsCount {header.records_count} or lastOffsetDelta {header.last_offset_delta}",
        )
    return header


def scan_headers(path: str, buf: bytes | memoryview, start: int = 0, end: int | None = None) -> Iterator[BatchHeader]:
    """Yield every batch header in ``buf[start:end]`` without decoding records or checking CRCs.

    The fast path for planning (offsets, positions, sizes, timestamps); ``iter_batches`` validates.
    Raises FormatError (TruncatedBatchError for a partial tail) as ``check_header``.
    """
    end = len(buf) if end is None else end
    pos = start
    unpack = HEADER.unpack_from
    make = BatchHeader._make
    while end - pos >= HEADER_SIZE:
        fields = unpack(buf, pos)
        length = fields[1]
        if fields[3] == 2 and length >= MIN_LENGTH and pos + LOG_OVERHEAD + length <= end and fields[5] & 7 <= 4:
            yield make((*fields, pos))
            pos += length + LOG_OVERHEAD
            continue
        header = check_header(path, buf, pos, end)  # the slow path raises the precise error
        if header is None:
            return
        yield header
        pos += header.size
    check_header(path, buf, pos, end)  # under 61 bytes left: end of data, or raises for a cut header
