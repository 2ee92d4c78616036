"""Record batches v2 decoded straight into Arrow columns, with Spark's Kafka source schema.

The hot path makes no Python object per record: one loop walks each batch's records section and
appends only integers (positions, offsets, timestamps) to ``array`` buffers. Keys, values and header
fields are then cut out of the records sections by Arrow in C: the start and end positions of
consecutive fields, interleaved, are the offsets of a binary array whose even elements are the
fields and whose odd elements are the gaps between them; ``take`` of the even elements copies just
the fields into a compact column.

The schema is Spark's own Kafka source schema (``includeHeaders=true``), so a job can switch
between ``format("kafka")`` and ``format("kafka_tiered")``.
"""

from __future__ import annotations

from array import array
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from tiering_core.formats.batch import HEADER_SIZE, LOG_OVERHEAD, BatchHeader

HEADER_TYPE = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("timestampType", pa.int32()),
        pa.field("headers", pa.list_(HEADER_TYPE)),
    ]
)
MAX_TIMESTAMP_MS = (2**63 - 1) // 1000  # the largest timestamp Spark's microsecond timestamps hold
SPARK_SCHEMA = (
    "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
    "timestampType int, headers array<struct<key: string, value: binary>>"
)


def _varint(buf: bytearray, pos: int) -> tuple[int, int]:
    """Zigzag varlong at ``pos``, any length: (value, next position)."""
    result = 0
    shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")


class ColumnBuilder:
    """Accumulates decoded batches of one partition into Arrow columns, then emits a RecordBatch.

    Memory: the records sections appended since the last ``flush`` (the caller flushes when
    ``data_bytes`` or ``rows`` reach its bound) plus a few integers per record.
    """

    def __init__(self, topic: str, partition: int) -> None:
        self.topic = topic
        self.partition = partition
        self._reset()

    def _reset(self) -> None:
        self.data = bytearray()
        self.offsets = array("q")
        self.timestamps = array("q")
        self.ts_types = array("i")
        self.key_bounds = array("i")
        self.value_bounds = array("i")
        # Rare cases are recorded sparsely (row numbers), so the common record costs no append for them.
        self.null_keys = array("q")
        self.null_values = array("q")
        self.header_rows = array("q")
        self.header_counts = array("i")
        self.hkey_bounds = array("i")
        self.hvalue_bounds = array("i")
        self.hvalue_null = bytearray()

    @property
    def rows(self) -> int:
        return len(self.offsets)

    @property
    def data_bytes(self) -> int:
        return len(self.data)

    def add_batch(self, header: BatchHeader, records: bytes | memoryview) -> None:
        """Append the decoded records of one batch (``records``: its uncompressed records section).

        Varints of one and two bytes (nearly every length, delta and count) are decoded inline; longer
        ones by ``_varint``. Raises ValueError or IndexError on malformed records; the caller names the
        object and position.
        """
        data = self.data
        pos = len(data)
        data += records
        end = len(data)
        first_row = len(self.offsets)
        base_offset = header.base_offset
        append_time = header.attributes & 0x08
        base_ts = header.max_timestamp if append_time else header.base_timestamp
        offsets = self.offsets.append
        timestamps = self.timestamps.append
        key_bounds = self.key_bounds.append
        value_bounds = self.value_bounds.append
        slow = _varint
        for row in range(first_row, first_row + header.records_count):
            b = data[pos]
            if b < 0x80:
                length = (b >> 1) ^ -(b & 1)
                pos += 1
            elif data[pos + 1] < 0x80:
                u = (b & 0x7F) | (data[pos + 1] << 7)
                length = (u >> 1) ^ -(u & 1)
                pos += 2
            else:
                length, pos = slow(data, pos)
            record_end = pos + length
            if length < 6 or record_end > end:
                raise ValueError(f"record length {length} out of bounds")
            pos += 1  # attributes (unused)
            b = data[pos]
            if b < 0x80:
                ts_delta = (b >> 1) ^ -(b & 1)
                pos += 1
            elif data[pos + 1] < 0x80:
                u = (b & 0x7F) | (data[pos + 1] << 7)
                ts_delta = (u >> 1) ^ -(u & 1)
                pos += 2
            else:
                ts_delta, pos = slow(data, pos)
            b = data[pos]
            if b < 0x80:
                off_delta = (b >> 1) ^ -(b & 1)
                pos += 1
            elif data[pos + 1] < 0x80:
                u = (b & 0x7F) | (data[pos + 1] << 7)
                off_delta = (u >> 1) ^ -(u & 1)
                pos += 2
            else:
                off_delta, pos = slow(data, pos)
            b = data[pos]
            if b < 0x80:
                klen = (b >> 1) ^ -(b & 1)
                pos += 1
            elif data[pos + 1] < 0x80:
                u = (b & 0x7F) | (data[pos + 1] << 7)
                klen = (u >> 1) ^ -(u & 1)
                pos += 2
            else:
                klen, pos = slow(data, pos)
            key_bounds(pos)
            if klen >= 0:
                pos += klen
            elif klen == -1:
                self.null_keys.append(row)
            else:
                raise ValueError(f"key length {klen}")
            key_bounds(pos)
            b = data[pos]
            if b < 0x80:
                vlen = (b >> 1) ^ -(b & 1)
                pos += 1
            elif data[pos + 1] < 0x80:
                u = (b & 0x7F) | (data[pos + 1] << 7)
                vlen = (u >> 1) ^ -(u & 1)
                pos += 2
            else:
                vlen, pos = slow(data, pos)
            value_bounds(pos)
            if vlen >= 0:
                pos += vlen
            elif vlen == -1:
                self.null_values.append(row)
            else:
                raise ValueError(f"value length {vlen}")
            value_bounds(pos)
            if data[pos] == 0:
                pos += 1
            else:
                self.header_rows.append(row)
                pos = self._headers(data, pos)
            if pos != record_end:
                raise ValueError(f"record declared {length} bytes but its fields span {pos - record_end + length}")
            offsets(base_offset + off_delta)
            timestamps(base_ts if append_time else base_ts + ts_delta)
        if pos != end:
            raise ValueError(f"{end - pos} bytes remain after {header.records_count} records")
        stamps = self.timestamps[first_row:]
        if stamps and (max(stamps) > MAX_TIMESTAMP_MS or min(stamps) < -MAX_TIMESTAMP_MS):
            raise ValueError("timestamp out of range")
        self.ts_types.extend(array("i", [1 if append_time else 0]) * header.records_count)

    def _headers(self, data: bytearray, pos: int) -> int:
        count, pos = _varint(data, pos)
        if count < 0:
            raise ValueError(f"header count {count}")
        for _ in range(count):
            klen, pos = _varint(data, pos)
            if klen < 0:
                raise ValueError(f"header key length {klen}")
            self.hkey_bounds.append(pos)
            data[pos : pos + klen].decode()  # a string column: UnicodeDecodeError here, not at the flush
            pos += klen
            self.hkey_bounds.append(pos)
            vlen, pos = _varint(data, pos)
            self.hvalue_bounds.append(pos)
            if vlen < 0:
                self.hvalue_null.append(0)
            else:
                pos += vlen
                self.hvalue_null.append(1)
            self.hvalue_bounds.append(pos)
        self.header_counts.append(count)
        return pos

    def flush(self, first_offset: int | None = None, last_offset: int | None = None) -> pa.RecordBatch | None:
        """The rows added since the last flush as one RecordBatch (None if there are none).

        Rows outside ``[first_offset, last_offset]`` (inclusive bounds) are left out.
        """
        n = self.rows
        if n == 0:
            return None
        data = pa.py_buffer(self.data)
        headers = pa.ListArray.from_arrays(
            _list_offsets(n, self.header_rows, self.header_counts),
            pa.StructArray.from_arrays(
                [
                    _cut(data, self.hkey_bounds, None).cast(pa.string()),
                    _cut(data, self.hvalue_bounds, self.hvalue_null),
                ],
                fields=list(HEADER_TYPE),
            ),
        )
        batch = record_batch(
            self.topic,
            self.partition,
            _cut(data, self.key_bounds, _present(n, self.null_keys)),
            _cut(data, self.value_bounds, _present(n, self.null_values)),
            _int64(self.offsets),
            pa.py_buffer(self.timestamps),
            _int32(self.ts_types),
            headers,
        )
        if (first_offset is not None and self.offsets[0] < first_offset) or (
            last_offset is not None and self.offsets[-1] > last_offset
        ):
            offsets = batch.column(4)
            lo = pa.scalar(first_offset if first_offset is not None else -1, pa.int64())
            hi = pa.scalar(last_offset if last_offset is not None else 2**63 - 1, pa.int64())
            batch = batch.filter(pc.and_(pc.greater_equal(offsets, lo), pc.less_equal(offsets, hi)))
        self._reset()
        return batch


def record_batch(topic: str, partition: int, keys: pa.Array, values: pa.Array, offsets: pa.Array,
                 timestamps_ms: pa.Buffer, timestamp_types: pa.Array, headers: pa.Array) -> pa.RecordBatch:  # fmt: skip
    """The columns of Spark's Kafka source schema (``timestamps_ms``: int64 milliseconds since the epoch)."""
    n = len(offsets)
    headers = null_when_empty(headers)
    columns = [
        keys,
        values,
        _repeat_string(topic, n),
        pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(array("i", [partition]) * n)]),
        offsets,
        pa.Array.from_buffers(pa.timestamp("ms", tz="UTC"), n, [None, timestamps_ms]).cast(
            pa.timestamp("us", tz="UTC")
        ),
        timestamp_types,
        headers,
    ]
    return pa.RecordBatch.from_arrays(columns, schema=SCHEMA)


def null_when_empty(headers: pa.ListArray) -> pa.Array:
    """The headers column as Spark's Kafka source gives it: null for a record without headers (its
    ``KafkaRecordToRowConverter``), not an empty list."""
    empty = pc.equal(pc.list_value_length(headers), 0)
    if not pc.any(empty).as_py():
        return headers
    if pc.all(empty).as_py():
        return pa.nulls(len(headers), headers.type)
    return pa.ListArray.from_arrays(headers.offsets, headers.values, type=headers.type, mask=empty)


def native_batch(topic: str, partition: int, decoder: Any) -> pa.RecordBatch | None:
    """The rows a ``tiering_native.ColumnDecoder`` holds as one RecordBatch (None if there are none): its
    plain buffers wrapped as Arrow arrays, the only copy being theirs into Python bytes."""
    (n, offsets, timestamps, ts_types, key_offsets, key_data, key_valid, value_offsets, value_data, value_valid,
     header_offsets, hkey_offsets, hkey_data, hvalue_offsets, hvalue_data, hvalue_valid) = decoder.flush()  # fmt: skip
    if n == 0:
        return None
    m = len(hkey_offsets) // 4 - 1
    header_fields = pa.StructArray.from_arrays(
        [
            _binary(pa.string(), m, None, hkey_offsets, hkey_data),
            _binary(pa.binary(), m, hvalue_valid, hvalue_offsets, hvalue_data),
        ],
        fields=list(HEADER_TYPE),
    )
    return record_batch(
        topic,
        partition,
        _binary(pa.binary(), n, key_valid, key_offsets, key_data),
        _binary(pa.binary(), n, value_valid, value_offsets, value_data),
        pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(offsets)]),
        pa.py_buffer(timestamps),
        pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(ts_types)]),
        pa.Array.from_buffers(pa.list_(HEADER_TYPE), n, [None, pa.py_buffer(header_offsets)], children=[header_fields]),
    )


def _binary(kind: pa.DataType, n: int, validity: bytes | None, offsets: bytes, data: bytes) -> pa.Array:
    bitmap = None if validity is None else pa.py_buffer(validity)
    return pa.Array.from_buffers(kind, n, [bitmap, pa.py_buffer(offsets), pa.py_buffer(data)])


def _present(n: int, null_rows: array) -> bytearray | None:
    """A 1/0 byte per row (0: null) from the sparse null row numbers; None when nothing is null."""
    if not null_rows:
        return None
    present = bytearray(b"\x01") * n
    for row in null_rows:
        present[row] = 0
    return present


def _list_offsets(n: int, rows: array, counts: array) -> pa.Array:
    """List offsets for ``n`` rows where only ``rows`` have entries (``counts`` of them each)."""
    if not rows:
        return pa.Array.from_buffers(pa.int32(), n + 1, [None, pa.py_buffer(bytes(4 * (n + 1)))])
    per_row = array("i", bytes(4 * (n + 1)))
    for row, count in zip(rows, counts, strict=True):
        per_row[row + 1] = count
    return pc.cumulative_sum(_int32(per_row))


def records_section(buf: bytes | memoryview, header: BatchHeader, position: int) -> memoryview:
    """The (possibly compressed) records section of the batch at ``position`` of ``buf``."""
    return memoryview(buf)[position + HEADER_SIZE : position + LOG_OVERHEAD + header.length]


def _int32(values: array) -> pa.Array:
    return pa.Array.from_buffers(pa.int32(), len(values), [None, pa.py_buffer(values)])


def _int64(values: array) -> pa.Array:
    return pa.Array.from_buffers(pa.int64(), len(values), [None, pa.py_buffer(values)])


def _cut(data: pa.Buffer, bounds: array, present: bytearray | None) -> pa.Array:
    """The fields ``data[bounds[2i]:bounds[2i+1]]`` as a binary array; null where ``present[i]`` is 0."""
    n = len(bounds) // 2
    if n == 0:
        return pa.array([], pa.binary())
    spans = pa.Array.from_buffers(pa.binary(), 2 * n - 1, [None, pa.py_buffer(bounds), data])
    fields = spans.take(_int32(array("i", range(0, 2 * n, 2))))
    if present is None:
        return fields
    validity = pa.Array.from_buffers(pa.uint8(), n, [None, pa.py_buffer(present)]).cast(pa.bool_())
    return pa.Array.from_buffers(pa.binary(), n, [validity.buffers()[1], *fields.buffers()[1:]])


def _repeat_string(text: str, n: int) -> pa.Array:
    raw = text.encode()
    offsets = _STEP_OFFSETS.get(len(raw))
    if offsets is None or offsets.size < (n + 1) * 4:  # built once per name length and batch size: 6 ms per 64 Ki
        offsets = _STEP_OFFSETS[len(raw)] = pa.py_buffer(array("i", range(0, len(raw) * n + 1, len(raw))))
    return pa.Array.from_buffers(pa.string(), n, [None, offsets, pa.py_buffer(raw * n)])


# 0, step, 2 x step, ...: the offsets of a string column repeating one value of ``step`` bytes, by step (the
# topic column of every batch; a few entries per process, one per length of the topic names read)
_STEP_OFFSETS: dict[int, pa.Buffer] = {}
