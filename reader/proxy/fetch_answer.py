"""A Fetch answer the proxy built (remote partitions, merged answers) encoded by hand.

``kio``'s encoder checks and converts every field through Python calls: about 0.9 ms for a Fetch answer
of one partition (profiled), the largest part of the proxy's own work per remote answer. The layout is
Kafka's FetchResponse.json, v4-18; the record batches stay where they are (``Gather``: written by
reference). An answer carrying what this does not write (a partition's tagged fields: a diverging epoch,
a current leader, a snapshot id; node endpoints) returns None and is encoded with ``kio``, so nothing
the broker said is ever dropped. The tests hold both encoders to the same bytes at every version.
"""

from __future__ import annotations

import struct
from functools import cache
from typing import Any

from reader.proxy.protocol import Gather, nested, response_pieces, response_type
from reader.proxy.wire import put_uvarint

_PARTITION = struct.Struct(">ihqq")  # partition_index, error_code, high_watermark, last_stable_offset
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_TXN = struct.Struct(">qq")
_TAGGED = ("diverging_epoch", "current_leader", "snapshot_id")


def encode_fetch_answer(correlation_id: int, version: int, body: Any) -> list[bytes | memoryview]:
    """The whole frame as pieces to write in order: by hand, else (tagged fields set) with ``kio``."""
    pieces = fetch_answer_pieces(correlation_id, version, body)
    return pieces if pieces is not None else response_pieces(correlation_id, 1, version, body)


def fetch_answer_pieces(correlation_id: int, version: int, body: Any) -> list[bytes | memoryview] | None:
    """The whole frame (size prefix included) as pieces to write in order, or None for an answer with
    tagged fields set (``response_pieces`` encodes those)."""
    if getattr(body, "node_endpoints", ()):
        return None
    defaults = _tagged_defaults(version)
    flexible = version >= 12
    out = Gather()
    small = bytearray(b"\0\0\0\0")
    small += _I32.pack(correlation_id)
    if flexible:
        small.append(0)  # response header v1: no tagged fields
    small += _I32.pack(int(body.throttle_time.total_seconds() * 1000))
    if version >= 7:
        small += _I16.pack(int(body.error_code)) + _I32.pack(int(body.session_id))
    _length(small, len(body.responses), flexible)
    for t in body.responses:
        if version >= 13:
            small += t.topic_id.bytes
        else:
            name = t.topic.encode()
            if flexible:
                put_uvarint(small, len(name) + 1)
            else:
                small += _I16.pack(len(name))
            small += name
        _length(small, len(t.partitions), flexible)
        for p in t.partitions:
            if flexible and any(getattr(p, f) != d for f, d in zip(_TAGGED, defaults, strict=True)):
                return None
            small += _PARTITION.pack(int(p.partition_index), int(p.error_code), int(p.high_watermark),
                                     int(p.last_stable_offset))  # fmt: skip
            if version >= 5:
                small += _I64.pack(int(p.log_start_offset))
            aborted = p.aborted_transactions
            _length(small, None if aborted is None else len(aborted), flexible)
            for a in aborted or ():
                small += _TXN.pack(int(a.producer_id), int(a.first_offset))
                if flexible:
                    small.append(0)
            if version >= 11:
                small += _I32.pack(int(p.preferred_read_replica))
            records = p.records
            _length(small, None if records is None else len(records), flexible)
            if records is not None:
                out.write(small)
                small = bytearray()
                out.write(records)
            if flexible:
                small.append(0)  # the partition's tagged fields: none
        if flexible:
            small.append(0)  # the topic's tagged fields
    if flexible:
        small.append(0)  # the answer's tagged fields
    out.write(small)
    return out.finish()


@cache
def _tagged_defaults(version: int) -> tuple[Any, ...]:
    """The values of a partition's tagged fields that ``kio`` does not write (their defaults)."""
    if version < 12:
        return ()
    fields = nested(nested(response_type(1, version), "responses"), "partitions").__dataclass_fields__
    return tuple(fields[name].default for name in _TAGGED)


def _length(buf: bytearray, n: int | None, flexible: bool) -> None:
    """An array's count or a byte string's length (None: null), compact (+1, unsigned varint) or int32: the
    two encodings Kafka's records and (nullable) arrays share."""
    if flexible:
        put_uvarint(buf, 0 if n is None else n + 1)
    else:
        buf += _I32.pack(-1 if n is None else n)
