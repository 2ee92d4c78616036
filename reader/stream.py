"""Sequential reads of one partition's remote data, with read-ahead into the memory pool.

The windows, their read-ahead into the memory pool and the location of the next copy are the read core every
sequential remote reader shares (``reader/readahead.py``); this module decodes what it downloads.

The download thread also prepares its window: batch CRCs checked and records sections decompressed
(in C, the GIL released), the decompressed bytes charged to the pool too. The caller's thread only
decodes records, checks offsets and the object's CRC-32C (in order, without releasing the GIL). This
is about the GIL: a thread that releases it in a C call while another thread runs Python waits up to
the interpreter's switch interval (5 ms) to get it back, so the C work runs well ahead of the decoder,
on several threads, instead of just in time on the decoding thread or on one helper (measured: the
decoder waited for its helper about as long as it decoded).

``record_class`` chooses the tuple type the decoder builds per batch (the consumer's message type,
so a record is decoded straight into the object it delivers). ``read(timeout)`` returns the next
decoded batches (records at or after ``position``; control batches never, aborted transactions not
under read_committed), or ``[]`` when the next window is not there yet, when ``tiering topic
pause-download`` is in force, or when a read_committed reader reached a transaction whose outcome is
beyond the remote data (``blocked_at``). It raises NotInRemote at the remote end (the caller
continues from the broker at ``position``), OffsetOutOfRange below the remote start (or where
retention deleted the copy being read), and the read errors of ``RemoteReader``; after an error,
calling again retries from ``position``: nothing is skipped or delivered twice.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import crc32c

from reader.batches import check_offsets, complete_prefix, scanned_headers
from reader.errors import RemoteDataCorrupt
from reader.readahead import ReadAhead, Window
from reader.remote import RemoteReader
from reader.segments import SegmentCopy
from reader.txn import AbortFilter
from tiering_core.errors import FormatError
from tiering_core.formats import BatchHeader, Record, RecordBatch, batch_payload, decode_payload_part

RecordClass = Callable[[BatchHeader], type[tuple]]  # the tuple type of a batch's records (Record's fields)


# Records decoded per read(): the first ones are delivered before a window is done, and records live so
# briefly that the garbage collector rarely runs (measured: 2000 per read cost 0.3 s of GC in 2.1 s
# reading 1 KB records, 2.7 s in 8.6 s reading 100 B records; 250 cost about 0.05 s)
RECORDS_PER_READ = 250


class _Prepared(NamedTuple):
    """A window's whole batches: headers, and records sections checked (CRC-32C) and decompressed ahead
    (None: not prepared, the decoder does it; a FormatError: what the check found)."""

    whole: int
    headers: list[BatchHeader]
    payloads: list[bytes | FormatError | None]


class _Decoding:
    """A taken window being decoded: its bytes (carry included), whole batches, their prepared records
    sections and the next batch to decode."""

    __slots__ = ("base", "data", "head", "headers", "next", "payloads", "slicing", "view", "whole")

    def __init__(self, head: Window, data: bytes, whole: int, base: int, headers: list[BatchHeader],
                 payloads: list[bytes | FormatError | None]) -> None:  # fmt: skip
        self.head, self.data, self.whole, self.base = head, data, whole, base
        self.view = memoryview(data)[:whole]
        self.headers, self.payloads = headers, payloads
        self.next = 0
        self.slicing: _Slicing | None = None


class _Slicing:
    """A batch being decoded in slices: its records section and the next record's position in it."""

    __slots__ = ("cls", "done", "header", "payload", "pos")

    def __init__(self, header: BatchHeader, payload: bytes, cls: type[tuple]) -> None:
        self.header, self.payload, self.cls = header, payload, cls
        self.pos = 0
        self.done = 0  # records decoded


class _ObjectCrc:
    """The running CRC-32C of a copy's ``.log`` read from byte 0, updated window by window in order."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0


class PartitionStream:
    """One partition from ``offset`` on. ``read`` from one thread at a time; ``close()`` frees its memory."""

    def __init__(self, reader: RemoteReader, topic: str, partition: int, offset: int, *,
                 read_committed: bool = False, record_class: RecordClass | None = None) -> None:  # fmt: skip
        self.reader = reader
        self.topic = topic
        self.partition = partition
        self.position = offset
        self.read_committed = read_committed
        self.record_class = record_class
        self.blocked_at: int | None = None
        self.download_paused = False
        self.pool = reader.pool
        self.windows = ReadAhead(reader, self._prepare)
        self.copy: SegmentCopy | None = None
        self.filter: AbortFilter | None = None
        self.carry = b""
        self.last_seen = -1
        self.crc: _ObjectCrc | None = None
        self.current: _Decoding | None = None  # the window being decoded
        self.closed = False

    # -- the caller's side ----------------------------------------------------------------------
    def read(self, timeout: float = 0.0) -> list[RecordBatch]:
        if self.closed:
            raise ValueError(f"stream of {self.topic}-{self.partition} is closed")
        self.download_paused = self.reader.catalog.download_paused(self.topic)
        if self.download_paused:
            self._drop_windows()
            return []
        if self.current is None:
            try:
                self._head()
                if not self.windows.ready(timeout):
                    return []
                self.current = self._open(self.windows.take())
            except BaseException as exc:
                self._failed(exc)  # the next read starts afresh at ``position``
                raise
        try:
            return self._decode_some(self.current)
        except BaseException as exc:
            self._failed(exc)
            raise

    def _head(self) -> Window:
        """The window to decode next (planned from the copy holding ``position`` when none is), its copy entered."""
        head = self.windows.head()
        if head is None:
            copy = self.reader.locate(self.topic, self.partition, self.position)
            self.windows.begin(copy, copy.position_for(self.position))
            head = self.windows.head()
            assert head is not None
        if head.copy is not self.copy:
            self._enter(head.copy, head.start)
        self.windows.fill()
        return head

    def _failed(self, exc: BaseException) -> None:
        if isinstance(exc, RemoteDataCorrupt):
            self.reader.damaged(exc.key)
        self._drop_windows()

    def close(self) -> None:
        self.closed = True
        self.current = None
        self.windows.close()

    def _enter(self, copy: SegmentCopy, start: int) -> None:
        """The head window now belongs to ``copy``: reset per-copy state."""
        self.copy = copy
        self.carry = b""
        self.last_seen = copy.base_offset - 1
        self.crc = _ObjectCrc() if start == 0 else None
        self.blocked_at = None
        self.position = max(self.position, copy.base_offset)
        self.filter = AbortFilter(self.reader.transactions(copy), self.position) if self.read_committed else None

    def _prepare(self, copy: SegmentCopy, data: bytes, start: int) -> tuple[_Prepared | None, int]:
        """On the download thread, ahead of the decoder: the window's batch headers, each batch's CRC-32C
        checked and its records section decompressed, as long as the pool has room for them (with the
        bytes they take in the pool). Assumes the window starts at a batch boundary; when it does not (a
        batch carried over from the window before), the decoder ignores all this. Errors are left for the
        decoder to find again (or take from the payloads), at its turn, in order."""
        key = copy.log_key
        try:
            whole = complete_prefix(key, data, start)
            view = memoryview(data)[:whole]
            headers = scanned_headers(key, view, start)
        except RemoteDataCorrupt:
            return None, 0
        payloads: list[bytes | FormatError | None] = [None] * len(headers)
        extra = 0
        for i, h in enumerate(headers):
            if h.is_control:
                continue
            if self.closed:
                break
            try:
                payload = batch_payload(key, view, h)
            except FormatError as exc:
                # kept without its traceback, whose frame (this one) holds the payloads and the window: a cycle
                payloads[i] = exc.with_traceback(None)
                continue
            if not self.pool.try_reserve(len(payload)):
                break
            extra += len(payload)
            payloads[i] = payload
        return _Prepared(whole, headers, payloads), extra

    def _drop_windows(self) -> None:
        """Forget every window, the one being decoded too (planned afresh from ``position`` next time)."""
        self.current = None
        self.windows.clear()
        self.copy = None

    # -- decoding -------------------------------------------------------------------------------
    def _open(self, head: Window) -> _Decoding:
        """Check the window (with the carried partial batch before it) and list its whole batches."""
        copy = head.copy
        key = copy.log_key
        data = head.data
        assert data is not None
        if self.crc is not None:  # in order, on this thread, without releasing the GIL (no wait to get it back)
            self.crc.value = crc32c.crc32c(data, self.crc.value, gil_release_mode=0)
            if head.last and self.crc.value != copy.manifest.log_crc32c:
                raise RemoteDataCorrupt(key, 0, "CRC-32C of the object does not match the manifest")
        prepared = head.prepared
        if self.carry or prepared is None:
            if self.carry:
                data = self.carry + data
            base = head.start - len(self.carry)
            whole = complete_prefix(key, data, base)
            headers = scanned_headers(key, memoryview(data)[:whole], base)
            payloads: list[bytes | FormatError | None] = [None] * len(headers)
        else:
            base, (whole, headers, payloads) = head.start, prepared
        if head.last and whole != len(data):
            raise RemoteDataCorrupt(key, base + whole, "the object ends inside a batch")
        check_offsets(key, headers, base, copy.base_offset, copy.end_offset, self.last_seen)
        return _Decoding(head, data, whole, base, headers, payloads)

    def _decode_some(self, cur: _Decoding) -> list[RecordBatch]:
        """Decode the current window's next RECORDS_PER_READ records (a large batch in slices, so the
        first records are delivered before a whole window, or batch, is decoded, and records live
        shorter); the window is finished when its batches are."""
        key = cur.head.copy.log_key
        headers = cur.headers
        out: list[RecordBatch] = []
        position = self.position
        keep = self.filter
        decoded = 0
        i = cur.next
        while decoded < RECORDS_PER_READ:
            part = cur.slicing
            if part is None:
                if i >= len(headers):
                    break
                h = headers[i]
                i += 1
                if h.last_offset < position:
                    continue
                if keep is not None:
                    if keep.unresolved_at(h):
                        self.blocked_at = max(position, h.base_offset)
                        self.position = position
                        self._drop_windows()  # located again (with the newer metadata) on the next read
                        return out
                    if not keep.keep(h):
                        position = h.last_offset + 1
                        continue
                if h.is_control:
                    position = h.last_offset + 1
                    continue
                part = cur.slicing = self._slicing(cur, i - 1, h)
            h = part.header
            count = min(h.records_count - part.done, RECORDS_PER_READ - decoded)
            try:
                records, part.pos = decode_payload_part(key, h, part.payload, part.pos, part.done, count, part.cls)
            except FormatError as exc:
                raise RemoteDataCorrupt(key, cur.base + exc.position, exc.reason) from exc
            part.done += count
            decoded += count
            if part.done >= h.records_count:
                cur.slicing = None
                position = h.last_offset + 1
            elif records:
                position = max(position, records[-1][0] + 1)
            if records and records[0][0] < self.position:
                records = [r for r in records if r[0] >= self.position]  # Record or a message type
            if records:
                out.append(RecordBatch(h, records))
        self.position = position
        cur.next = i
        if i >= len(headers) and cur.slicing is None:
            self._finish(cur)
        return out

    def _slicing(self, cur: _Decoding, i: int, h: BatchHeader) -> _Slicing:
        """Batch ``i`` of the window, to decode in slices: its records section, checked and decompressed
        (ahead by the download thread, or now)."""
        key = cur.head.copy.log_key
        payload = cur.payloads[i]
        cur.payloads[i] = None
        if isinstance(payload, FormatError):  # found ahead; not raised again here (this frame would hold it)
            raise RemoteDataCorrupt(key, cur.base + payload.position, payload.reason) from payload
        try:
            if payload is None:
                payload = batch_payload(key, cur.view, h)
        except FormatError as exc:
            raise RemoteDataCorrupt(key, cur.base + exc.position, exc.reason) from exc
        return _Slicing(h, payload, Record if self.record_class is None else self.record_class(h))

    def _finish(self, cur: _Decoding) -> None:
        """The window is decoded: keep its partial last batch, free its pool bytes (its copy is done after its
        last window: the next read enters the next one)."""
        head, copy = cur.head, cur.head.copy
        if cur.headers:
            self.last_seen = cur.headers[-1].last_offset
        self.carry = cur.data[cur.whole :]
        self.current = None
        self.windows.pop()
        if head.last:
            self.position = max(self.position, copy.end_offset + 1)
            self.copy = None
        self.windows.fill()
