"""The Fetch request for the broker written over the client's bytes instead of encoded again.

What the proxy changes in a client's Fetch (``FetchPlan.make``: probes, holes, the sessionless request,
``max_wait`` 0 with remote partitions, ``max_bytes`` within the room; the next fetch asked ahead,
``fetch_ahead.py``) are fixed-size fields: offsets, sizes, the session id and epoch, the wait. Encoding the
whole request again with ``kio`` cost about 0.5 ms per Fetch (profiled: the largest part of the proxy's own
work per remote answer after the socket calls); the same bytes come from a copy of the client's frame with
those fields written in place, at the positions one walk of the request (``fetch_layout``) finds. A request
whose layout the proxy changes (forgotten topics of a fetch session dropped, a topic left out) is encoded
again.
"""

from __future__ import annotations

import struct
import uuid
from typing import Any, NamedTuple

from reader.proxy.wire import ProtocolError, array_length, skip_tagged_fields, string_length, topic_keys
from tiering_core.formats.native import NATIVE

_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")


class PartitionAt(NamedTuple):
    """Where a partition's fields are in a Fetch request (``epoch`` -1 before v12: no last_fetched_epoch)."""

    topic: str | uuid.UUID  # the name (v4-12) or the id (v13+)
    partition: int
    offset: int  # fetch_offset (int64)
    epoch: int  # last_fetched_epoch (int32)
    max_bytes: int  # partition_max_bytes (int32)
    start: int  # where the partition's fields begin
    end: int  # and end (its tagged fields included)


class FetchLayout(NamedTuple):
    """Where the fields the proxy writes are in a Fetch request frame."""

    max_wait: int  # max_wait_ms (int32); min_bytes and max_bytes follow it
    session: int  # session_id and session_epoch (int32 each), -1 before v7
    topics: list[list[PartitionAt]]
    forgotten: int  # how many forgotten topics (v7+; 0 before)
    topics_at: int  # where the topics array begins (its length)
    topics_end: int  # and ends


_NATIVE_LAYOUT = getattr(NATIVE, "fetch_request_layout", None)


def fetch_layout(frame: bytes | bytearray | memoryview, start: int, version: int) -> FetchLayout:
    """The positions of a Fetch request's fields, its body at ``start``: walked by the compiled module where it is
    built (``tiering_native.fetch_request_layout``, held to ``walk_layout`` by tests/unit/test_native_fetch_scan.py),
    else in Python. Raises ProtocolError on a frame that does not read as a Fetch request of ``version``."""
    try:
        return walk_layout(frame, start, version) if _NATIVE_LAYOUT is None else _compiled(frame, start, version)
    except (struct.error, IndexError, ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"a Fetch v{version} request ends or breaks inside its fields: {exc}") from None


def _compiled(frame: bytes | bytearray | memoryview, start: int, version: int) -> FetchLayout:
    assert _NATIVE_LAYOUT is not None
    max_wait, session, named, rows, forgotten, topics_at, topics_end = _NATIVE_LAYOUT(frame, version, start)
    keys = topic_keys(named)
    topics: list[list[PartitionAt]] = [[] for _ in keys]
    for t, index, offset, epoch, max_bytes, begin, end in rows:
        topics[t].append(PartitionAt(keys[t], index, offset, epoch, max_bytes, begin, end))
    return FetchLayout(max_wait, session, topics, forgotten, topics_at, topics_end)


def walk_layout(frame: bytes | bytearray | memoryview, pos: int, version: int) -> FetchLayout:
    flexible = version >= 12
    if version <= 14:
        pos += 4  # replica_id
    max_wait = pos
    pos += 13  # max_wait, min_bytes, max_bytes, isolation_level
    session = -1
    if version >= 7:
        session = pos
        pos += 8
    topics_at = pos
    count, pos = array_length(frame, pos, flexible)
    topics: list[list[PartitionAt]] = []
    for _ in range(count):
        topic: str | uuid.UUID
        if version >= 13:
            topic = uuid.UUID(bytes=bytes(frame[pos : pos + 16]))
            pos += 16
        else:
            size, pos = string_length(frame, pos, flexible)
            topic = bytes(frame[pos : pos + size]).decode()
            pos += size
        partitions: list[PartitionAt] = []
        count, pos = array_length(frame, pos, flexible)
        for _ in range(count):
            start = pos
            (index,) = _I32.unpack_from(frame, pos)
            pos += 8 if version >= 9 else 4  # partition, current_leader_epoch
            offset, epoch = pos, -1
            pos += 8
            if version >= 12:
                epoch = pos
                pos += 4
            if version >= 5:
                pos += 8  # log_start_offset
            max_bytes = pos
            _I32.unpack_from(frame, pos)
            pos += 4
            if flexible:
                pos = skip_tagged_fields(frame, pos)
            partitions.append(PartitionAt(topic, index, offset, epoch, max_bytes, start, pos))
        topics.append(partitions)
        if flexible:
            pos = skip_tagged_fields(frame, pos)
    forgotten = array_length(frame, pos, flexible)[0] if version >= 7 else 0
    return FetchLayout(max_wait, session, topics, forgotten, topics_at, pos)


def patched_fetch_request(frame: bytes | memoryview, start: int, version: int, upstream: Any) -> bytes | None:
    """The request frame (header as received, body from ``start``) with ``upstream``'s values, or None when
    ``upstream`` does not have the client request's layout. Raises ProtocolError on a frame that does not
    read as a Fetch request of ``version``."""
    layout = fetch_layout(frame, start, version)
    forgotten = len(upstream.forgotten_topics_data) if version >= 7 else 0
    if len(layout.topics) != len(upstream.topics) or layout.forgotten != forgotten:
        return None  # a fetch session's forgotten topics are dropped (sessionless): the layout changes
    out = bytearray(frame)
    _I32.pack_into(out, layout.max_wait, int(upstream.max_wait.total_seconds() * 1000))
    _I32.pack_into(out, layout.max_wait + 8, int(upstream.max_bytes))  # after min_bytes
    if layout.session >= 0:
        _I32.pack_into(out, layout.session, int(upstream.session_id))
        _I32.pack_into(out, layout.session + 4, int(upstream.session_epoch))
    for at, topic in zip(layout.topics, upstream.topics, strict=True):
        if len(at) != len(topic.partitions):
            return None
        for p_at, p in zip(at, topic.partitions, strict=True):
            if p_at.partition != int(p.partition):
                return None
            _I64.pack_into(out, p_at.offset, int(p.fetch_offset))
            if p_at.epoch >= 0:
                _I32.pack_into(out, p_at.epoch, int(p.last_fetched_epoch))
            _I32.pack_into(out, p_at.max_bytes, int(p.partition_max_bytes))
    return bytes(out)
