"""A message body without the tagged fields its schema does not name, so that ``kio`` parses it.

Tagged fields (KIP-482) let Kafka add optional fields to a flexible version without a new version number,
and Kafka's own readers skip a tag they do not know by its size. ``kio`` raises instead. A broker or client
newer than the schemas the proxy was built with may send such a tag in any message the proxy must read
(Metadata, FindCoordinator, DescribeCluster, Produce v10+, ListOffsets, OffsetForLeaderEpoch, Fetch), and
a frame the proxy cannot read closes the connection. ``without_unknown_tags`` walks the body by the
schema ``kio`` has for the version (the same field kinds its writers use) and copies it without the tags
the schema does not name, at every level; the proxy then parses the copy. Only messages that fail to parse
take this path, so the usual cost is nothing. A tag dropped so is lost from a message the proxy rewrites
(the client's schema did not name it at that version either, as far as the proxy can know), and kept in
every message the proxy passes on as it came.
"""

from __future__ import annotations

import struct
from dataclasses import fields
from functools import cache
from typing import NamedTuple

from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
    get_schema_field_type,
    is_optional,
)

from reader.proxy.wire import ProtocolError, put_uvarint, uvarint

_FIXED = {"int8": 1, "uint8": 1, "bool": 1, "int16": 2, "uint16": 2, "error_code": 2, "int32": 4, "uint32": 4,
          "timedelta_i32": 4, "int64": 8, "uint64": 8, "float64": 8, "timedelta_i64": 8, "datetime_i64": 8,
          "uuid": 16}  # fmt: skip
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")


class _Field(NamedTuple):
    kind: str  # a kafka_type ("int32", "string", "records"...), or "entity"
    array: bool
    optional: bool  # a nullable entity (KIP-893: an int8 marker before it)
    entity: type | None


@cache
def _layout(entity_type: type) -> tuple[tuple[_Field, ...], dict[int, _Field]]:
    """The entity's untagged fields in order, and its tagged fields by tag."""
    plain: list[_Field] = []
    tagged: dict[int, _Field] = {}
    for f in fields(entity_type):
        tag = get_field_tag(f)
        shape = classify_field(f)
        entity = shape.type_ if isinstance(shape, EntityField | EntityTupleField) else None
        kind = "entity" if entity is not None else get_schema_field_type(f)
        array = isinstance(shape, EntityTupleField | PrimitiveTupleField)
        described = _Field(kind, array, tag is None and entity is not None and not array and is_optional(f), entity)
        if tag is None:
            plain.append(described)
        else:
            tagged[int(tag)] = described
    return tuple(plain), tagged


def without_unknown_tags(entity_type: type, buf: bytes | memoryview, start: int) -> bytes:
    """``buf[start:]``, a body of ``entity_type``, without the tagged fields its schema does not name.
    Raises ProtocolError where the body does not follow the schema."""
    out = bytearray()
    try:
        end = _entity(entity_type, memoryview(buf), start, out)
    except (IndexError, struct.error, ValueError) as exc:
        raise ProtocolError(f"cannot read {entity_type.__name__} v{entity_type.__version__}: {exc}") from exc
    if end != len(buf):
        raise ProtocolError(f"{entity_type.__name__} v{entity_type.__version__}: {len(buf) - end} bytes after it")
    return bytes(out)


def _entity(entity_type: type, buf: memoryview, pos: int, out: bytearray) -> int:
    flexible = entity_type.__flexible__
    plain, tagged = _layout(entity_type)
    for f in plain:
        pos = _value(f, flexible, buf, pos, out)
    if not flexible:
        return pos
    count, pos = uvarint(buf, pos)
    kept = bytearray()
    n = 0
    for _ in range(count):
        tag, pos = uvarint(buf, pos)
        size, pos = uvarint(buf, pos)
        end = pos + size
        if end > len(buf):
            raise IndexError(f"tagged field {tag} runs past the end")
        known = tagged.get(tag)
        if known is not None:
            value = bytearray()
            if _value(known, True, buf[:end], pos, value) != end:
                raise ValueError(f"tagged field {tag} is not the size it says")
            put_uvarint(kept, tag)
            put_uvarint(kept, len(value))
            kept += value
            n += 1
        pos = end
    put_uvarint(out, n)
    out += kept
    return pos


def _value(f: _Field, flexible: bool, buf: memoryview, pos: int, out: bytearray) -> int:
    if f.array:
        if flexible:
            count, after = uvarint(buf, pos)
            count -= 1
        else:
            (count,) = _INT32.unpack_from(buf, pos)
            after = pos + 4
        out += buf[pos:after]
        pos = after
        for _ in range(max(count, 0)):
            pos = _single(f, flexible, buf, pos, out)
        return pos
    if f.optional:
        marker = buf[pos]
        out.append(marker)
        if marker == 0xFF:  # -1: null
            return pos + 1
        pos += 1
    return _single(f, flexible, buf, pos, out)


def _single(f: _Field, flexible: bool, buf: memoryview, pos: int, out: bytearray) -> int:
    if f.entity is not None:
        return _entity(f.entity, buf, pos, out)
    size = _FIXED.get(f.kind)
    if size is None:  # string, bytes, records: a length, then that many bytes (-1 / 0: null)
        if flexible:
            n, after = uvarint(buf, pos)
            n -= 1
        elif f.kind == "string":
            (n,) = _INT16.unpack_from(buf, pos)
            after = pos + 2
        else:
            (n,) = _INT32.unpack_from(buf, pos)
            after = pos + 4
        size = after - pos + max(n, 0)
    end = pos + size
    if end > len(buf):
        raise IndexError(f"a {f.kind} runs past the end")
    out += buf[pos:end]
    return end
