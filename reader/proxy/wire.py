"""The Kafka protocol's primitive encodings as the proxy reads them in place: unsigned varints, tagged-field
sections, array and string lengths (compact in the flexible versions), and the error for a frame that does
not follow them. ``protocol``, ``tagged``, ``fetch_scan`` and ``fetch_request`` read with these."""

from __future__ import annotations

import struct
import uuid

from tiering_core.errors import TieringError

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")


class ProtocolError(TieringError):
    """A frame the proxy cannot read: its connection is closed (with a log line), never the process."""


def uvarint(buf: bytes | bytearray | memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf) or shift > 28:
            raise ProtocolError("malformed unsigned varint")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7


def skip_tagged_fields(buf: bytes | bytearray | memoryview, pos: int) -> int:
    count, pos = uvarint(buf, pos)
    for _ in range(count):
        _, pos = uvarint(buf, pos)
        size, pos = uvarint(buf, pos)
        pos += size
    return pos


def array_length(buf: bytes | bytearray | memoryview, pos: int, flexible: bool) -> tuple[int, int]:
    """An array's item count (0 for null) and where its items start: a compact array (count + 1 as an
    unsigned varint) in the flexible versions, else an int32 count. Records and bytes are sized the same
    way (their byte length in place of the count)."""
    if flexible:
        n, pos = uvarint(buf, pos)
        return max(n - 1, 0), pos
    (n,) = _INT32.unpack_from(buf, pos)
    return max(n, 0), pos + 4


def string_length(buf: bytes | bytearray | memoryview, pos: int, flexible: bool) -> tuple[int, int]:
    """A string's byte length (0 for null) and where its bytes start (compact or int16 length)."""
    if flexible:
        n, pos = uvarint(buf, pos)
        return max(n - 1, 0), pos
    (n,) = _INT16.unpack_from(buf, pos)
    return max(n, 0), pos + 2


def topic_keys(named: list[bytes | str]) -> list[uuid.UUID | str]:
    """Topics as the compiled walks of a Fetch give them (``tiering_native``: 16 bytes of id, or a name) as the proxy
    keys them: a ``uuid.UUID``, or the name."""
    return [uuid.UUID(bytes=topic) if isinstance(topic, bytes) else topic for topic in named]


def put_uvarint(buf: bytearray, value: int) -> None:
    """Append ``value`` as an unsigned varint."""
    while value >= 0x80:
        buf.append((value & 0x7F) | 0x80)
        value >>= 7
    buf.append(value)
