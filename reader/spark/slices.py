"""The data source's input: byte ranges of remote ``.log`` objects (slices), read in windows.

A slice is planned on the driver (``planning.py``) and read on an executor, which fetches its bytes
itself with ranged GETs of at most ``window_bytes`` (plus one batch that crosses a window's end), so
memory stays bounded whatever the segment size. Every batch's CRC-32C is checked; a slice that
covers its whole object also checks the object's size and CRC-32C against the manifest. Control
batches and the batches of aborted transactions are dropped (committed data only).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import crc32c
import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from reader.spark.columns import ColumnBuilder, native_batch, records_section
from reader.txn import AbortedRanges
from tiering_core.errors import FormatError
from tiering_core.formats.batch import HEADER_SIZE, LOG_OVERHEAD, check_header
from tiering_core.formats.compression import decompress
from tiering_core.formats.native import NATIVE
from tiering_core.stores.base import RemoteStore

_native = NATIVE  # the compiled decoder, or None (tests set it to None to run the reference)


class SegmentReadError(FormatError):
    """A remote segment object is corrupt or not what its manifest says. The export fails; nothing is written."""


@dataclass(frozen=True)
class SegmentSlice:
    """Bytes ``[start, end)`` of the object ``key``; rows with offsets in ``[first_offset, last_offset]``.

    ``aborted`` holds (producer id, first offset, last offset) of every aborted transaction whose
    range meets the slice. ``object_size``/``object_crc32c`` are set when the slice is the whole object.
    ``copy_offsets`` are the offsets the copy's manifest says it holds: a batch outside them, or one not
    after the batch before it, is corrupt (a batch's CRC does not cover its base offset).
    """

    topic: str
    partition: int
    key: str
    start: int
    end: int
    first_offset: int
    last_offset: int
    aborted: tuple[tuple[int, int, int], ...] = ()
    object_size: int | None = None
    object_crc32c: int | None = None
    copy_offsets: tuple[int, int] | None = None


@dataclass(frozen=True)
class SlicePack(InputPartition):
    """One input partition: consecutive slices of one topic partition, read one after the other.

    A segment is a slice of its own (a large one is split); consecutive small segments are packed up
    to the slice size, as Spark's file sources pack small files: a task per 4 MiB segment costs more
    in scheduling and output files than its read.
    """

    slices: tuple[SegmentSlice, ...]


def pack_slices(slices: list[SegmentSlice], max_bytes: int) -> list[SlicePack]:
    """Group consecutive slices of the same partition into packs of at most ``max_bytes`` (a slice larger
    than that is a pack of its own)."""
    packs: list[list[SegmentSlice]] = []
    size = 0
    for part in slices:
        length = part.end - part.start
        last = packs[-1][-1] if packs else None
        if last is None or (last.topic, last.partition) != (part.topic, part.partition) or size + length > max_bytes:
            packs.append([part])
            size = length
        else:
            packs[-1].append(part)
            size += length
    return [SlicePack(tuple(p)) for p in packs]


def read_slice(
    store: RemoteStore, part: SegmentSlice, *, window_bytes: int = 16 << 20, max_rows: int = 65536
) -> Iterator[pa.RecordBatch]:
    """Yield the slice's committed records as RecordBatches of at most about ``max_rows`` rows.

    Raises ObjectNotFound (naming the key) if the object is gone, SegmentReadError if it is shorter
    than planned, corrupt, or differs from its manifest. The compiled decoder does it when installed
    (``tiering_core.formats.native``), else this loop.
    """
    if _native is not None:
        yield from _read_slice_native(store, part, window_bytes=window_bytes, max_rows=max_rows)
        return
    builder = ColumnBuilder(part.topic, part.partition)
    crc = 0
    pos = part.start
    buf = b""
    buf_start = pos
    low, high = part.copy_offsets or (0, 2**63 - 1)
    previous = low - 1
    aborted = AbortedRanges(part.aborted)
    while pos < part.end:
        buf, buf_start, local, size = _window(store, part, pos, buf, buf_start, window_bytes)
        try:
            header = check_header(part.key, buf, local, len(buf))
        except FormatError as exc:
            raise SegmentReadError(part.key, pos, exc.reason) from exc
        if header is None:
            raise SegmentReadError(part.key, pos, "no record batch where one was expected")
        body = memoryview(buf)[local + 21 : local + size]
        actual = crc32c.crc32c(body)
        if actual != header.crc:
            raise SegmentReadError(part.key, pos, f"CRC-32C mismatch: stored {header.crc}, computed {actual}")
        if part.object_size is not None:
            crc = crc32c.crc32c(memoryview(buf)[local : local + size], crc)
        last = header.base_offset + header.last_offset_delta
        if header.base_offset <= previous or last > high:
            raise SegmentReadError(
                part.key, pos, f"batch offsets {header.base_offset}-{last} are not after {previous} and within "
                f"the copy's {low}-{high}",
            )  # fmt: skip
        previous = last
        wanted = (
            last >= part.first_offset
            and header.base_offset <= part.last_offset
            and not header.attributes & 0x20  # control batch: transaction markers
            and not (header.attributes & 0x10 and aborted.aborts(header.producer_id, header.base_offset))
        )
        if wanted:
            section = records_section(buf, header, local)
            codec = header.attributes & 7
            try:
                builder.add_batch(header, decompress(codec, bytes(section), part.key, pos) if codec else section)
            except FormatError as exc:  # decompression
                raise SegmentReadError(part.key, pos, exc.reason) from exc
            except (IndexError, ValueError, UnicodeDecodeError, OverflowError) as exc:  # Overflow: beyond int64
                raise SegmentReadError(part.key, pos, f"malformed records: {exc}") from exc
        pos += size
        if builder.rows >= max_rows or builder.data_bytes >= window_bytes:
            batch = builder.flush(part.first_offset, part.last_offset)
            if batch is not None and batch.num_rows:
                yield batch
    _check_end(part, pos, crc)
    batch = builder.flush(part.first_offset, part.last_offset)
    if batch is not None and batch.num_rows:
        yield batch


def _read_slice_native(
    store: RemoteStore, part: SegmentSlice, *, window_bytes: int, max_rows: int
) -> Iterator[pa.RecordBatch]:
    """``read_slice`` through the compiled decoder: the same checks, in the same order, and the same
    errors, on whole windows at a time with the GIL released (``tiering_native.ColumnDecoder``)."""
    assert NATIVE is not None
    low, high = part.copy_offsets or (0, 2**63 - 1)
    decoder = NATIVE.ColumnDecoder(part.first_offset, part.last_offset, list(part.aborted), low, high)
    crc = 0
    pos = part.start
    buf = b""
    buf_start = pos
    while pos < part.end:
        buf, buf_start, local, _ = _window(store, part, pos, buf, buf_start, window_bytes)
        try:  # decodes the batch at ``local`` (which _window made whole) and those after it that fit
            after = decoder.decode(buf, local, max_rows, window_bytes)
        except NATIVE.DecodeError as exc:
            raise SegmentReadError(part.key, buf_start + exc.args[1], exc.args[2]) from exc
        if part.object_size is not None:
            crc = crc32c.crc32c(memoryview(buf)[local:after], crc)
        pos = buf_start + after
        if decoder.rows >= max_rows or decoder.data_bytes >= window_bytes:
            batch = native_batch(part.topic, part.partition, decoder)
            if batch is not None:
                yield batch
    _check_end(part, pos, crc)
    batch = native_batch(part.topic, part.partition, decoder)
    if batch is not None:
        yield batch


def _window(store: RemoteStore, part: SegmentSlice, pos: int, buf: bytes, buf_start: int,
            window_bytes: int) -> tuple[bytes, int, int, int]:  # fmt: skip
    """The window holding the batch at ``pos`` whole (``buf`` if it does, else fetched): (window, where it
    starts, where the batch is in it, the batch's size by its length field)."""
    local = pos - buf_start
    if len(buf) - local < HEADER_SIZE:
        buf, buf_start, local = _fetch(store, part, pos, window_bytes), pos, 0
    size = int.from_bytes(buf[local + 8 : local + 12], "big", signed=True) + LOG_OVERHEAD
    if local + size > len(buf):  # the batch crosses the window's end: fetch it whole
        buf, buf_start, local = _fetch(store, part, pos, max(window_bytes, size)), pos, 0
    return buf, buf_start, local, size


def _check_end(part: SegmentSlice, pos: int, crc: int) -> None:
    """After the last batch: it ended at the slice's end, and a whole object's CRC-32C is the manifest's."""
    if pos != part.end:
        raise SegmentReadError(part.key, pos, f"the last batch ends past the planned end {part.end}")
    if part.object_size is not None and crc != part.object_crc32c:
        raise SegmentReadError(part.key, 0, f"object CRC-32C {crc} differs from the manifest's {part.object_crc32c}")


def _fetch(store: RemoteStore, part: SegmentSlice, pos: int, length: int) -> bytes:
    """Bytes ``[pos, pos + length)`` of the slice; the last GET of a whole object asks one byte more, so an
    object longer than its manifest says shows."""
    end = min(part.end, pos + max(length, HEADER_SIZE))
    probe = part.object_size is not None and end == part.end
    data = store.get_range(part.key, pos, end if probe else end - 1)
    if probe and len(data) > end - pos:
        raise SegmentReadError(part.key, end, f"the object is longer than the {part.object_size} bytes of its manifest")
    if len(data) != end - pos:
        raise SegmentReadError(
            part.key, pos, f"object ends early: asked for bytes {pos}-{end - 1}, got {len(data)} bytes"
        )
    return data
