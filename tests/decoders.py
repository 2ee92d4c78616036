"""Both record decoders on the same bytes, for the differential tests (unit and broker-written segments).

``outcome`` runs one decoder over a buffer the way the TieredConsumer and the tools read (every batch,
CRC checked, records as tuples of a message class) and ``column_outcome`` the way the Spark data source
reads (a slice through ``decode_slice``: Arrow rows, aborted transactions and control batches dropped).
``slice_over`` and ``windows_of`` make slices and the read core's windows of test bytes.
Each gives the decoded values, or the error's class and byte position: the two decoders must give equal
outcomes.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import crc32c
import pyarrow as pa
import tiering_native

from reader.errors import RemoteDataCorrupt
from reader.listing import Copy
from reader.messages import message_class
from reader.spark import slices
from reader.spark.columns import SCHEMA
from reader.spark.slices import SegmentSlice, decode_slice
from tiering_core.errors import FormatError
from tiering_core.formats import decode_batch, records, scan_headers
from tiering_core.objects import Manifest

TOPIC_ID = "AAAAAAAAAAAAAAAAAAAAAA"
SEGMENT_ID = uuid.UUID(int=0)
KEY = f"t-{TOPIC_ID}/3/{0:020d}-{SEGMENT_ID.hex}.log"  # the key of ``slice_over``'s copy
DECODERS = ("python", "native")


@contextlib.contextmanager
def decoder(name: str) -> Iterator[None]:
    """Use the pure-Python reference (``python``) or the compiled decoder (``native``) inside the block."""
    saved = records._native, slices._native
    records._native = slices._native = None if name == "python" else tiering_native
    try:
        yield
    finally:
        records._native, slices._native = saved


def _result(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except (FormatError, RemoteDataCorrupt) as exc:
        return type(exc), exc.position


def outcome(name: str, data: bytes | memoryview) -> Any:
    """Every batch's header and records (as TieredMessage tuples with their batch fields), or the error."""

    def run() -> list:
        out = []
        for h in scan_headers(KEY, data):
            batch = decode_batch(KEY, data, h, cls=message_class("t", 0, h))
            out.append((h, [(tuple(m), m.timestamp(), m.leader_epoch(), type(m).__name__) for m in batch.records]))
        return out

    with decoder(name):
        return _result(run)


def slice_over(data: bytes, first: int = 0, last: int = 2**63 - 1, aborted: tuple[tuple[int, int, int], ...] = (),
               *, partition: int = 3, copy_offsets: tuple[int, int] = (0, 2**63 - 1)) -> SegmentSlice:  # fmt: skip
    """A slice of all of ``data``, as the plan makes one of a copy holding it: its manifest has the bytes' size and
    CRC-32C, ``copy_offsets`` and no indexes (so the read core reads it in one window). The key is ``KEY``
    for partition 3."""
    manifest = Manifest(topic="t", topic_id=TOPIC_ID, partition=partition, segment_id=SEGMENT_ID,
                        base_offset=copy_offsets[0], end_offset=copy_offsets[1], max_timestamp=0, leader_epochs=[],
                        log_size=len(data), log_crc32c=crc32c.crc32c(data), indexes_size=0, indexes_crc32c=0,
                        index_parts={}, created_ms=0)  # fmt: skip
    ref = manifest.ref
    copy = Copy(manifest, ref.key("log"), ref.key("indexes"), max(first, copy_offsets[0]), copy_offsets[1])
    return SegmentSlice("t", partition, copy, 0, len(data), first, last, aborted)


def windows_of(data: bytes, width: int) -> list[tuple[bytes, int]]:
    """``data`` cut at batch starts into windows of about ``width`` bytes (at least a batch each), as the read core
    cuts a copy at the batch starts its offset index knows."""
    starts = [h.position for h in scan_headers("windows", data)]
    out: list[tuple[bytes, int]] = []
    begin = 0
    for position in [*starts[1:], len(data)]:
        if position - begin >= width or position == len(data):
            out.append((data[begin:position], begin))
            begin = position
    return out


def column_outcome(name: str, data: bytes, *, first: int = 0, last: int = 2**63 - 1,
                   aborted: tuple[tuple[int, int, int], ...] = (), window: int = 16 << 20,
                   max_rows: int = 65536) -> Any:  # fmt: skip
    """The slice's rows as one table's Python values (batch boundaries aside), or the error; ``data`` is one
    window (it may not hold whole batches), ``window`` the bytes of fields that end an Arrow batch."""
    part = slice_over(data, first, last, aborted)

    def run() -> list:
        batches = list(decode_slice(part, [(data, 0)], max_rows=max_rows, max_bytes=window))
        table = pa.Table.from_batches(batches, schema=SCHEMA)
        # timestamps as their int64 values: Spark's range reaches past Python's datetime (year 9999), and a
        # damaged record's timestamp may lie there (to_pylist raised OverflowError on it)
        as_ints = pa.schema([f.with_type(pa.int64()) if pa.types.is_timestamp(f.type) else f for f in table.schema])
        return table.cast(as_ints).to_pylist()

    with decoder(name):
        return _result(run)
