"""The Fetch request for the broker written over the client's bytes instead of encoded again.

What the proxy changes in a client's Fetch (``FetchPlan.make``: probes, holes, the sessionless request,
``max_wait`` 0 with remote partitions, ``max_bytes`` within the room) are fixed-size fields: offsets, sizes,
the session id and epoch, the wait. Encoding the whole request again with ``kio`` cost about 0.5 ms per
Fetch (profiled: the largest part of the proxy's own work per remote answer after the socket calls); the
same bytes come from a copy of the client's frame with those fields written in place. A request whose
layout the proxy changes (forgotten topics of a fetch session dropped, a topic left out) is encoded again.
"""

from __future__ import annotations

import struct
from typing import Any

from reader.proxy.wire import ProtocolError, array_length, skip_tagged_fields, string_length

_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")


def patched_fetch_request(frame: bytes | memoryview, start: int, version: int, upstream: Any) -> bytes | None:
    """The request frame (header as received, body from ``start``) with ``upstream``'s values, or None when
    ``upstream`` does not have the client request's layout. Raises ProtocolError on a frame that does not
    read as a Fetch request of ``version``."""
    try:
        return _patch(frame, start, version, upstream)
    except (struct.error, IndexError, ValueError) as exc:
        raise ProtocolError(f"a Fetch v{version} request ends or breaks inside its fields: {exc}") from None


def _patch(frame: bytes | memoryview, pos: int, version: int, upstream: Any) -> bytes | None:
    flexible = version >= 12
    out = bytearray(frame)
    if version <= 14:
        pos += 4  # replica_id
    _I32.pack_into(out, pos, int(upstream.max_wait.total_seconds() * 1000))
    _I32.pack_into(out, pos + 8, int(upstream.max_bytes))  # after min_bytes
    pos += 13  # max_wait, min_bytes, max_bytes, isolation_level
    if version >= 7:
        _I32.pack_into(out, pos, int(upstream.session_id))
        _I32.pack_into(out, pos + 4, int(upstream.session_epoch))
        pos += 8
    count, pos = array_length(out, pos, flexible)
    if count != len(upstream.topics):
        return None
    for topic in upstream.topics:
        if version >= 13:
            pos += 16
        else:
            size, pos = string_length(out, pos, flexible)
            pos += size
        count, pos = array_length(out, pos, flexible)
        if count != len(topic.partitions):
            return None
        for p in topic.partitions:
            (index,) = _I32.unpack_from(out, pos)
            if index != int(p.partition):
                return None
            pos += 8 if version >= 9 else 4  # partition, current_leader_epoch
            _I64.pack_into(out, pos, int(p.fetch_offset))
            pos += 8
            if version >= 12:
                _I32.pack_into(out, pos, int(p.last_fetched_epoch))
                pos += 4
            if version >= 5:
                pos += 8  # log_start_offset
            _I32.pack_into(out, pos, int(p.partition_max_bytes))
            pos += 4
            if flexible:
                pos = skip_tagged_fields(out, pos)
        if flexible:
            pos = skip_tagged_fields(out, pos)
    if version >= 7:
        forgotten, _ = array_length(out, pos, flexible)
        if forgotten != len(upstream.forgotten_topics_data):
            return None  # a fetch session's forgotten topics are dropped (sessionless): the layout changes
    return bytes(out)
