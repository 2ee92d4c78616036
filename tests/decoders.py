"""Both record decoders on the same bytes, for the differential tests (unit and broker-written segments).

``outcome`` runs one decoder over a buffer the way the TieredConsumer and the tools read (every batch,
CRC checked, records as tuples of a message class) and ``column_outcome`` the way the Spark data source
reads (a slice through ``read_slice``: Arrow rows, aborted transactions and control batches dropped).
Each gives the decoded values, or the error's class and byte position: the two decoders must give equal
outcomes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import tiering_native

from reader.messages import message_class
from reader.spark import slices
from reader.spark.columns import SCHEMA
from reader.spark.slices import SegmentSlice, read_slice
from tiering_core.errors import FormatError
from tiering_core.formats import decode_batch, records, scan_headers

KEY = "p/t-AAAAAAAAAAAAAAAAAAAAAA/0/00000000000000000000-0.log"
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
    except FormatError as exc:
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


class MemoryStore:
    """One object in memory, read by ranges like a RemoteStore (the slice reader's only call)."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def get_range(self, key: str, start: int, end: int) -> bytes:
        return self.data[start : end + 1]


def column_outcome(name: str, data: bytes, *, first: int = 0, last: int = 2**63 - 1,
                   aborted: tuple[tuple[int, int, int], ...] = (), window: int = 16 << 20,
                   max_rows: int = 65536) -> Any:  # fmt: skip
    """The slice's rows as one table's Python values (batch boundaries aside), or the error."""
    part = SegmentSlice("t", 3, KEY, 0, len(data), first, last, aborted)

    def run() -> list:
        batches = list(read_slice(MemoryStore(data), part, window_bytes=window, max_rows=max_rows))
        table = pa.Table.from_batches(batches, schema=SCHEMA)
        # timestamps as their int64 values: Spark's range reaches past Python's datetime (year 9999), and a
        # damaged record's timestamp may lie there (to_pylist raised OverflowError on it)
        as_ints = pa.schema([f.with_type(pa.int64()) if pa.types.is_timestamp(f.type) else f for f in table.schema])
        return table.cast(as_ints).to_pylist()

    with decoder(name):
        return _result(run)
