"""The data source's input: byte ranges of remote copies (slices), read on the read core every remote reader shares.

A slice is planned on the driver (``planning.py``) and read on an executor through ``reader/readahead.py``: a
``RemoteReader`` over a ``ListingCatalog`` of the copies the plan chose (``slice_reader``), and the batch-aligned
windows of ``windowBytes`` that every reader plans, for all the slices of the task at once, the next windows
downloading while one is decoded, in a memory pool of three windows per task (so memory stays bounded whatever
the segment size). The core's fetcher retries and rate-limits the GETs and checks each object's size against
its manifest; the decoder checks every batch's CRC-32C and offsets, and a slice that covers its whole object
also checks the object's CRC-32C against the manifest. Control batches and the batches of aborted transactions
are dropped (committed data only).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import crc32c
import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from reader.config import MIB, ReaderSettings
from reader.errors import RemoteDataCorrupt
from reader.listing import Copy, ListingCatalog, RemotePartition
from reader.readahead import ReadAhead
from reader.remote import RemoteReader
from reader.segments import SegmentCopy
from reader.spark.columns import ColumnBuilder, native_batch, records_section
from reader.txn import AbortedRanges
from tiering_core.errors import FormatError
from tiering_core.formats.batch import LOG_OVERHEAD, check_header
from tiering_core.formats.compression import decompress
from tiering_core.formats.native import NATIVE
from tiering_core.stores.base import RemoteStore

_native = NATIVE  # the compiled decoder, or None (tests set it to None to run the reference)


@dataclass(frozen=True)
class SegmentSlice:
    """Bytes ``[start, end)`` (batch boundaries) of ``copy``'s ``.log``; rows with offsets in ``[first_offset,
    last_offset]``.

    ``aborted`` holds (producer id, first offset, last offset) of every aborted transaction whose range meets
    the slice. A batch outside the offsets the copy's manifest says it holds, or one not after the batch before
    it, is corrupt (a batch's CRC does not cover its base offset).
    """

    topic: str
    partition: int
    copy: Copy
    start: int
    end: int
    first_offset: int
    last_offset: int
    aborted: tuple[tuple[int, int, int], ...] = ()

    @property
    def key(self) -> str:
        return self.copy.log_key

    @property
    def whole(self) -> bool:
        """The slice is the whole object: its CRC-32C is checked against the manifest's."""
        return self.start == 0 and self.end == self.copy.manifest.log_size


@dataclass(frozen=True)
class SlicePack(InputPartition):
    """One input partition: consecutive slices of one topic partition, read one after the other.

    A segment is a slice of its own (a large one is split); consecutive small segments are packed up
    to the slice size, as Spark's file sources pack small files: a task per 4 MiB segment costs more
    in scheduling and output files than its read.
    """

    slices: tuple[SegmentSlice, ...]

    def remote_partition(self) -> RemotePartition:
        """The copies the pack reads, as the catalog of its task's reader."""
        first = self.slices[0]
        copies = tuple({s.copy.log_key: s.copy for s in self.slices}.values())
        return RemotePartition(first.topic, first.copy.manifest.topic_id, first.partition, copies)


def slice_reader(
    store: RemoteStore, partitions: Iterable[RemotePartition], window_bytes: int, *, gets: int = 2
) -> RemoteReader[ListingCatalog]:
    """The read core for slices of these partitions' copies: windows of ``window_bytes``, up to four read ahead in
    a pool of three windows (at least 4 MiB: a copy smaller than a window is a window of its own), ``gets`` GETs
    at a time (two on an executor; the driver's planning, which reads only indexes, asks for more), no disk cache.
    The settings name no cluster: the listing is the catalog. ``close()`` it (a context manager)."""
    settings = ReaderSettings(
        bootstrap_servers="", fetch_window_bytes=window_bytes, prefetch_windows=4,
        prefetch_pool_bytes=max(3 * window_bytes, 4 * MIB), download_max_concurrency=gets, index_cache_segments=16,
        disk_cache_dir=None, hot_data_interval_seconds=None,
    )  # fmt: skip
    return RemoteReader(settings, ListingCatalog(partitions), store)


def read_slices(
    reader: RemoteReader, slices: Sequence[SegmentSlice], *, max_rows: int = 65536
) -> Iterator[pa.RecordBatch]:
    """Yield the slices' committed records, in order, as RecordBatches of at most about ``max_rows`` rows, read
    through ``reader`` (``slice_reader``): the copies' indexes loaded (their manifests came with the plan), then
    the windows of every slice planned at once, so read-ahead runs on from each slice into the next.

    Raises RemoteObjectMissing (naming the key) if an object is gone, RemoteDataCorrupt if it is not what its
    manifest says or a batch is corrupt; nothing of a damaged window is yielded.
    """
    copies = list(reader.executor.map(lambda m: reader.indexes.get(m.ref, m), [p.copy.manifest for p in slices]))
    windows = ReadAhead(reader, _unprepared)
    try:
        windows.plan((copy, part.start, part.end) for copy, part in zip(copies, slices, strict=True))
        for copy, part in zip(copies, slices, strict=True):
            yield from decode_slice(part, _taken(windows, copy, part.end), max_rows=max_rows,
                                    max_bytes=reader.settings.fetch_window_bytes)  # fmt: skip
    except RemoteDataCorrupt as exc:
        reader.damaged(exc.key)
        raise
    finally:
        windows.close()


def _unprepared(copy: SegmentCopy, data: bytes, start: int) -> tuple[None, int]:
    """Nothing to do on the downloading thread: the decoder checks every batch as it decodes (in C, the GIL
    released)."""
    return None, 0


def _taken(windows: ReadAhead, copy: SegmentCopy, end: int) -> Iterator[tuple[bytes, int]]:
    """The planned windows of ``copy`` before byte ``end`` (one slice's), in order, each (bytes, where they start)
    while the decoder holds it."""
    while (head := windows.head()) is not None and head.copy is copy and head.start < end:
        w = windows.take()
        assert w.data is not None
        yield w.data, w.start
        windows.pop()
        windows.fill()


def decode_slice(
    part: SegmentSlice, windows: Iterable[tuple[bytes | memoryview, int]], *, max_rows: int = 65536,
    max_bytes: int = 16 * MIB,
) -> Iterator[pa.RecordBatch]:  # fmt: skip
    """The slice's committed records from its bytes, given as consecutive windows of whole batches from
    ``part.start`` to ``part.end``; a RecordBatch whenever ``max_rows`` rows or ``max_bytes`` bytes of fields are
    held. The compiled decoder does it when installed (``tiering_core.formats.native``), else the reference
    loop, with the same checks in the same order and the same errors (RemoteDataCorrupt naming the key and the
    batch's position in the object)."""
    decoder = _NativeDecoder(part) if _native is not None else _PythonDecoder(part)
    crc, pos = 0, part.start
    for data, start in windows:
        if start != pos:
            raise AssertionError(f"{part.key}: a window at {start} where the slice is at {pos}")
        local = 0
        while local < len(data):
            local = decoder.decode(data, start, local, max_rows, max_bytes)
            if decoder.columns.rows >= max_rows or decoder.columns.data_bytes >= max_bytes:
                batch = decoder.flush()
                if batch is not None and batch.num_rows:
                    yield batch
        if part.whole:
            crc = crc32c.crc32c(data, crc)
        pos = start + len(data)
    if pos != part.end:
        raise RemoteDataCorrupt(part.key, pos, f"the slice's batches end here, not at its planned end {part.end}")
    if part.whole and crc != part.copy.manifest.log_crc32c:
        raise RemoteDataCorrupt(part.key, 0, f"object CRC-32C {crc} differs from the manifest's "
                                f"{part.copy.manifest.log_crc32c}")  # fmt: skip
    batch = decoder.flush()
    if batch is not None and batch.num_rows:
        yield batch


class _NativeDecoder:
    """``tiering_native.ColumnDecoder``: whole windows at a time with the GIL released. Both decoders hold their rows
    in ``columns``, which counts them (``rows``, ``data_bytes``)."""

    def __init__(self, part: SegmentSlice) -> None:
        assert _native is not None
        m = part.copy.manifest
        self.part = part
        self.columns = _native.ColumnDecoder(part.first_offset, part.last_offset, list(part.aborted), m.base_offset,
                                             m.end_offset)  # fmt: skip

    def decode(self, data: bytes | memoryview, start: int, local: int, max_rows: int, max_bytes: int) -> int:
        """Decode from ``local`` on (at least a batch); returns where it stopped."""
        assert _native is not None
        try:
            return self.columns.decode(data, local, max_rows, max_bytes)
        except _native.DecodeError as exc:
            raise RemoteDataCorrupt(self.part.key, start + exc.args[1], exc.args[2]) from exc

    def flush(self) -> pa.RecordBatch | None:
        return native_batch(self.part.topic, self.part.partition, self.columns)


class _PythonDecoder:
    """The reference: a batch at a time, records appended to Arrow columns in Python."""

    def __init__(self, part: SegmentSlice) -> None:
        m = part.copy.manifest
        self.part = part
        self.columns = ColumnBuilder(part.topic, part.partition)
        self.low, self.high = m.base_offset, m.end_offset
        self.previous = m.base_offset - 1
        self.aborted = AbortedRanges(part.aborted)

    def decode(self, data: bytes | memoryview, start: int, local: int, max_rows: int, max_bytes: int) -> int:
        """Decode the batch at ``local``; returns where the next one starts."""
        part, key, pos = self.part, self.part.key, start + local
        try:
            header = check_header(key, data, local, len(data))
        except FormatError as exc:
            raise RemoteDataCorrupt(key, pos, exc.reason) from exc
        if header is None:
            raise RemoteDataCorrupt(key, pos, "no record batch where one was expected")
        size = header.length + LOG_OVERHEAD
        actual = crc32c.crc32c(memoryview(data)[local + 21 : local + size])
        if actual != header.crc:
            raise RemoteDataCorrupt(key, pos, f"CRC-32C mismatch: stored {header.crc}, computed {actual}")
        last = header.base_offset + header.last_offset_delta
        if header.base_offset <= self.previous or last > self.high:
            raise RemoteDataCorrupt(
                key, pos, f"batch offsets {header.base_offset}-{last} are not after {self.previous} and within "
                f"the copy's {self.low}-{self.high}",
            )  # fmt: skip
        self.previous = last
        wanted = (
            last >= part.first_offset
            and header.base_offset <= part.last_offset
            and not header.attributes & 0x20  # control batch: transaction markers
            and not (header.attributes & 0x10 and self.aborted.aborts(header.producer_id, header.base_offset))
        )
        if wanted:
            section = records_section(data, header, local)
            codec = header.attributes & 7
            try:
                self.columns.add_batch(header, decompress(codec, bytes(section), key, pos) if codec else section)
            except FormatError as exc:  # decompression
                raise RemoteDataCorrupt(key, pos, exc.reason) from exc
            except (IndexError, ValueError, UnicodeDecodeError, OverflowError) as exc:  # Overflow: beyond int64
                raise RemoteDataCorrupt(key, pos, f"malformed records: {exc}") from exc
        return local + size

    def flush(self) -> pa.RecordBatch | None:
        return self.columns.flush(self.part.first_offset, self.part.last_offset)


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
