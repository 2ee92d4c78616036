"""A broker's Fetch answer read without parsing it: the partition headers the proxy needs, the records skipped.

A Fetch answer that the proxy passes through unchanged (no partition of its request is served from remote
storage, no partition has an error, no node endpoints to rewrite) still told the proxy each partition's log
start, high watermark and last stable offset (``TieredView.observe``). Parsing it with ``kio`` copies every
record byte into a new ``bytes`` and builds an object per partition: the largest part of the proxy's own
work per pass-through answer after the socket calls (a 1 MiB answer: 0.13 ms of parsing). The scan walks
the answer by the lengths it carries (Kafka's FetchResponse.json, v4-18) and reads only the few fields the
proxy looks at; record bytes and tagged fields it does not know are skipped by their sizes, so a newer
broker's tagged field never makes a pass-through answer fail. Anything it cannot read raises
ProtocolError and the caller parses the answer in full (which names what is wrong).

The walk (``fetch_walk``) is written once and driven two ways: over an answer received whole
(``walk_fetch``), and over an answer still in the broker's socket whose record bytes are never read into
the process (``splice.py``): it asks for header fields (``Step``: a reader of a buffer at a position) and
gives each partition's header before its records (a ``ScannedPartition``: its ``records`` bytes follow), so
the driver decides where the bytes go and may change the header first.

An answer received whole is scanned by the compiled module where it is built (``tiering_native``'s
``fetch_answer_scan``, ``native/src/fetch_scan.rs``): the same fields, the same answers refused
(tests/unit/test_native_fetch_scan.py holds it to ``walk_fetch``, the reference). In Python the walk costs about
8 us per partition, and a consumer of 48 partitions passing through spent 15% of the proxy's Python time in it
(docs/design.md, "The walks of a Fetch, at production shape").
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable, Generator
from typing import Any, NamedTuple

from reader.proxy.wire import (
    ProtocolError,
    array_length,
    skip_tagged_fields,
    string_length,
    topic_keys,
    uvarint,
)
from tiering_core.formats.native import NATIVE

Buffer = bytes | bytearray | memoryview
Step = Callable[[Buffer, int], tuple[Any, int]]  # reads a field at a position: (its value, where it ends)
Walk = Generator["Step | ScannedPartition", Any, "ScannedFetch"]  # a Step is sent its value; records follow a partition
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_PARTITION_HEAD = struct.Struct(">ihqq")  # partition_index, error_code, high_watermark, last_stable_offset
_I64 = struct.Struct(">q")


class ScannedPartition(NamedTuple):
    topic: str | uuid.UUID  # the name (v4-12) or the id (v13+), as the request named it
    partition: int
    error_code: int
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int  # -1 before v5
    records: int  # bytes of record batches (0 when null)


class ScannedFetch(NamedTuple):
    error_code: int  # the answer's top-level error (v7+; 0 before)
    partitions: list[ScannedPartition]
    tagged: bool  # top-level tagged fields are present (v16+'s node endpoints: addresses to rewrite)
    correlation_id: int = -1  # read only when the walk starts at the response header

    @property
    def plain(self) -> bool:
        """Nothing in it for the proxy to change: no error anywhere and no top-level tagged field."""
        return not self.error_code and not self.tagged and not any(p.error_code for p in self.partitions)


_NATIVE_SCAN = getattr(NATIVE, "fetch_answer_scan", None)


def scan_fetch(frame: Buffer, version: int, start: int, records_at: list[int] | None = None) -> ScannedFetch:
    """The answer's partition headers, from ``start`` (its body), in a frame received whole; where each
    partition's records begin appended to ``records_at``. Raises ProtocolError."""
    if _NATIVE_SCAN is None:
        return walk_fetch(frame, version, start, records_at)
    try:
        error_code, tagged, named, rows = _NATIVE_SCAN(frame, version, start)
    except ValueError as exc:
        raise ProtocolError(f"a Fetch v{version} answer ends or breaks inside its partitions: {exc}") from None
    topics = topic_keys(named)
    partitions = [ScannedPartition(topics[t], index, error, high, stable, log_start, size)
                  for t, index, error, high, stable, log_start, size, _ in rows]  # fmt: skip
    if records_at is not None:
        records_at.extend(row[7] for row in rows)
    return ScannedFetch(error_code, partitions, tagged)


def walk_fetch(frame: Buffer, version: int, start: int, records_at: list[int] | None = None) -> ScannedFetch:
    """``scan_fetch`` in Python, by ``fetch_walk``: the reference the compiled scan is held to."""
    walk = fetch_walk(version, header=False)
    pos = start
    try:
        step = next(walk)
        while True:
            if isinstance(step, ScannedPartition):
                if records_at is not None:
                    records_at.append(pos)
                pos += step.records
                step = walk.send(None)
            else:
                value, pos = step(frame, pos)
                step = walk.send(value)
    except StopIteration as stop:
        scanned: ScannedFetch = stop.value
    except (struct.error, IndexError, ValueError) as exc:
        raise ProtocolError(f"a Fetch v{version} answer ends or breaks inside its partitions: {exc}") from None
    if pos != len(frame):
        raise ProtocolError(f"a Fetch v{version} answer has {len(frame) - pos} bytes after its fields")
    return scanned


def fetch_walk(version: int, header: bool) -> Walk:
    """The fields of a Fetch answer of ``version`` in order, from its response header (``header``, after the
    size prefix) or from its body."""
    flexible = version >= 12
    correlation_id = -1
    if header:
        correlation_id = yield _response_header if flexible else _int32
    error_code = yield _top_v7 if version >= 7 else _top
    topics = yield _compact_array if flexible else _array
    partitions: list[ScannedPartition] = []
    for _ in range(topics):
        topic, count = yield _topic_id if version >= 13 else (_compact_topic_name if flexible else _topic_name)
        for _ in range(count):
            head = yield _partition_step(version)
            partitions.append(ScannedPartition(topic, *head))
            yield partitions[-1]  # its records follow
            if flexible:
                yield _tagged
        if flexible:
            yield _tagged
    tagged = False
    if flexible:
        tagged = yield _top_tagged
    return ScannedFetch(error_code, partitions, tagged, correlation_id)


# -- steps: each reads one run of fields at ``pos`` and says where it ends -----------------------------
def top_step(step: Step) -> bool:
    """Whether ``step`` reads the answer's top-level error (its value)."""
    return step is _top or step is _top_v7


def _int32(buf: Buffer, pos: int) -> tuple[int, int]:
    return _I32.unpack_from(buf, pos)[0], pos + 4


def _response_header(buf: Buffer, pos: int) -> tuple[int, int]:
    """Response header v1: the correlation id and tagged fields."""
    (correlation_id,) = _I32.unpack_from(buf, pos)
    return correlation_id, _tagged(buf, pos + 4)[1]


def _top(buf: Buffer, pos: int) -> tuple[int, int]:
    _I32.unpack_from(buf, pos)  # throttle_time_ms (present)
    return 0, pos + 4


def _top_v7(buf: Buffer, pos: int) -> tuple[int, int]:
    """throttle_time_ms, error_code, session_id."""
    (error_code,) = _I16.unpack_from(buf, pos + 4)
    _I32.unpack_from(buf, pos + 6)
    return error_code, pos + 10


def _array(buf: Buffer, pos: int) -> tuple[int, int]:
    return array_length(buf, pos, False)


def _compact_array(buf: Buffer, pos: int) -> tuple[int, int]:
    return array_length(buf, pos, True)


def _topic_id(buf: Buffer, pos: int) -> tuple[tuple[uuid.UUID, int], int]:
    if pos + 16 > len(buf):
        raise IndexError("a topic id ends after the answer")
    topic = uuid.UUID(bytes=bytes(buf[pos : pos + 16]))
    count, pos = array_length(buf, pos + 16, True)
    return (topic, count), pos


def _named(buf: Buffer, pos: int, flexible: bool) -> tuple[tuple[str, int], int]:
    size, pos = string_length(buf, pos, flexible)
    if pos + size > len(buf):
        raise IndexError("a topic name ends after the answer")
    topic = bytes(buf[pos : pos + size]).decode()
    count, pos = array_length(buf, pos + size, flexible)
    return (topic, count), pos


def _topic_name(buf: Buffer, pos: int) -> tuple[tuple[str, int], int]:
    return _named(buf, pos, False)


def _compact_topic_name(buf: Buffer, pos: int) -> tuple[tuple[str, int], int]:
    return _named(buf, pos, True)


def _partition_step(version: int) -> Step:
    flexible = version >= 12

    def partition(buf: Buffer, pos: int) -> tuple[tuple[int, int, int, int, int, int], int]:
        """A partition's header up to its records: (index, error, high watermark, last stable, log start,
        records' size)."""
        index, error, high, stable = _PARTITION_HEAD.unpack_from(buf, pos)
        pos += _PARTITION_HEAD.size
        log_start = -1
        if version >= 5:
            (log_start,) = _I64.unpack_from(buf, pos)
            pos += 8
        aborted, pos = array_length(buf, pos, flexible)
        if flexible:
            for _ in range(aborted):  # producer_id, first_offset, tagged fields
                _, pos = _tagged(buf, pos + 16)
        else:  # 16 bytes each, skipped at once: a corrupt count of 2**31 is not 2**31 steps
            pos += 16 * aborted
        if version >= 11:
            pos += 4  # preferred_read_replica
        size, pos = array_length(buf, pos, flexible)  # records: a (nullable) byte string, sized the same way
        if pos > len(buf):
            raise IndexError("a partition header ends after the answer")
        return (index, error, high, stable, log_start, size), pos

    return partition


def _tagged(buf: Buffer, pos: int) -> tuple[None, int]:
    pos = skip_tagged_fields(buf, pos)
    if pos > len(buf):
        raise IndexError("tagged fields end after the answer")
    return None, pos


def _top_tagged(buf: Buffer, pos: int) -> tuple[bool, int]:
    count, _ = uvarint(buf, pos)
    return count > 0, _tagged(buf, pos)[1]
