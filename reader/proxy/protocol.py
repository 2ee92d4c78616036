"""The Kafka protocol as the proxy handles it: frames, headers, and ``kio`` for the bodies it must read.

A frame is an int32 size and that many bytes. A request starts with ``api_key`` int16, ``api_version``
int16 and ``correlation_id`` int32, then ``client_id`` (nullable int16 string) and, in header v2 (the
flexible versions), tagged fields; a response starts with the ``correlation_id`` and, in header v1, tagged
fields (ApiVersions answers with header v0 at every version, so that a client that does not know the
broker's versions yet can read it). Bodies are parsed and written with ``kio``: its dataclasses are
generated from Kafka's own JSON schemas, parsing runs in native code and record batches stay bytes.
``kio`` raises on a tagged field it does not know, so the proxy parses only what it must read or rewrite
(without the tags its schemas do not name: ``tagged.py``) and forwards everything else as the bytes it
received.
"""

from __future__ import annotations

import dataclasses
import io
import struct
import sys
from functools import cache
from types import ModuleType
from typing import Any, NamedTuple

from kio.index import load_request_schema, load_response_schema
from kio.schema.index import api_key_map, schema_name_map
from kio.serial import entity_reader, entity_writer
from kio.static.constants import EntityType

from reader.proxy.tagged import without_unknown_tags
from reader.proxy.wire import ProtocolError, skip_tagged_fields

API_VERSIONS = 18
_HEAD = struct.Struct(">hhi")
_INT32 = struct.Struct(">i")
_GATHER_FROM = 1 << 14  # a write of this size or more is a piece of its own


class RequestHead(NamedTuple):
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body: int  # where the body starts in the frame


@cache
def supported_versions() -> dict[int, tuple[int, int]]:
    """``{api key: (min, max)}``: the versions ``kio`` has schemas for (what the proxy can parse)."""
    out: dict[int, tuple[int, int]] = {}
    for key, name in api_key_map.items():
        versions = [v for v, kinds in schema_name_map[name].items() if EntityType.response in kinds]
        if versions:
            out[key] = (min(versions), max(versions))
    return out


def can_parse(api_key: int, version: int) -> bool:
    found = supported_versions().get(api_key)
    return found is not None and found[0] <= version <= found[1]


@cache
def request_type(api_key: int, version: int) -> type:
    return load_request_schema(api_key, version)


@cache
def response_type(api_key: int, version: int) -> type:
    return load_response_schema(api_key, version)


def schema_module(entity_type: type) -> ModuleType:
    """The module of a kio entity: its nested types (``PartitionData``...) for building responses."""
    return sys.modules[entity_type.__module__]


@cache
def _request_flexible_header(api_key: int, version: int) -> bool:
    if not can_parse(api_key, version):
        raise ProtocolError(f"API {api_key} v{version} is not one the proxy can read")
    return request_type(api_key, version).__flexible__


@cache
def response_flexible_header(api_key: int, version: int) -> bool:
    """Whether the response uses header v1 (tagged fields after the correlation id)."""
    return api_key != API_VERSIONS and response_type(api_key, version).__flexible__


def peek_request(frame: bytes | memoryview) -> tuple[int, int, int]:
    """``(api_key, api_version, correlation_id)`` of a request frame (without its size prefix)."""
    if len(frame) < _HEAD.size:
        raise ProtocolError(f"a request of {len(frame)} bytes is shorter than a request header")
    return _HEAD.unpack_from(frame, 0)


def read_request_head(frame: bytes | memoryview) -> RequestHead:
    """The whole request header, and where the body starts (the version must be one kio knows)."""
    api_key, version, correlation_id = peek_request(frame)
    pos = _HEAD.size
    if len(frame) < pos + 2:
        raise ProtocolError("request header ends before its client id")
    (length,) = struct.unpack_from(">h", frame, pos)
    pos += 2
    client_id = None
    if length >= 0:
        client_id = bytes(frame[pos : pos + length]).decode("utf-8", "replace")
        pos += length
    if _request_flexible_header(api_key, version):
        pos = skip_tagged_fields(frame, pos)
    if pos > len(frame):
        raise ProtocolError("request header runs past the frame")
    return RequestHead(api_key, version, correlation_id, client_id, pos)


def response_body_start(frame: bytes | memoryview, api_key: int, version: int) -> int:
    """Where a response's body starts (after the correlation id and, in header v1, tagged fields)."""
    pos = 4
    if response_flexible_header(api_key, version):
        pos = skip_tagged_fields(frame, pos)
    return pos


def parse(entity_type: type, frame: bytes | bytearray | memoryview, start: int) -> Any:
    """A body of ``entity_type`` from ``start`` to the frame's end; ProtocolError if it does not parse.
    A tagged field the schema does not name is skipped, as Kafka does (``tagged.py``; kio refuses it).
    (kio reads read-only buffers only: a frame received into a bytearray is viewed read-only, not copied.)"""
    buffer = frame if isinstance(frame, bytes) else memoryview(frame).toreadonly()
    try:
        entity, _size = entity_reader(entity_type)(buffer, start)
    except Exception as exc:  # kio raises ValueError, struct errors, UnexpectedEOF... on bad input
        if "Unknown tagged field" not in str(exc):
            raise ProtocolError(f"cannot parse {entity_type.__name__} v{entity_type.__version__}: {exc}") from exc
        return parse(entity_type, without_unknown_tags(entity_type, buffer, start), 0)
    return entity


def encode(entity: Any) -> bytes:
    buf = io.BytesIO()
    entity_writer(type(entity))(buf, entity)
    return buf.getvalue()


def new_request(api_key: int, version: int, correlation_id: int, client_id: str, body: Any) -> bytes:
    """A request frame (without its size prefix): the header the version uses (v2, with tagged fields, for the
    flexible versions; else v1), then ``body``."""
    name = client_id.encode()
    head = struct.pack(">hhih", api_key, version, correlation_id, len(name)) + name
    return head + (b"\x00" if request_type(api_key, version).__flexible__ else b"") + encode(body)


def request_frame(head: RequestHead, frame: bytes | memoryview, body: Any) -> bytes:
    """The request re-encoded with a new body (the header's bytes kept as received)."""
    return bytes(frame[: head.body]) + encode(body)


def response_frame(correlation_id: int, api_key: int, version: int, body: Any) -> memoryview:
    """A whole response frame (size prefix included) with ``body``, written into one buffer."""
    return memoryview(b"".join(response_pieces(correlation_id, api_key, version, body)))


def response_pieces(correlation_id: int, api_key: int, version: int, body: Any) -> list[bytes | memoryview]:
    """A whole response frame (size prefix included) with ``body`` as the pieces to write in order: the
    encoded fields, and between them, by reference, the large byte strings of the body (a Fetch answer's
    record batches, most of what the proxy moves), which are never copied into one buffer."""
    out = Gather()
    out.write(b"\0\0\0\0")
    out.write(_INT32.pack(correlation_id))
    if response_flexible_header(api_key, version):
        out.write(b"\x00")
    entity_writer(type(body))(out, body)
    return out.finish()


class Gather:
    """A ``kio`` writer: small writes (fields, lengths) are copied into a buffer, large ones kept as given."""

    def __init__(self) -> None:
        self.pieces: list[bytes | memoryview] = []
        self.small = bytearray()
        self.size = 0

    def write(self, data: bytes | bytearray | memoryview) -> int:
        size = len(data)
        self.size += size
        if size < _GATHER_FROM:
            self.small += data
        else:
            if self.small:
                self.pieces.append(self.small)
                self.small = bytearray()
            self.pieces.append(memoryview(data))  # a view: what a send() does not take is not sliced off a copy
        return size

    def finish(self) -> list[bytes | memoryview]:
        if self.small:
            self.pieces.append(self.small)
        _INT32.pack_into(self.pieces[0], 0, self.size - 4)  # the size prefix: the first piece starts with it
        return self.pieces


def build(entity_type: type, **values: Any) -> Any:
    """An entity from ``values``, dropping those its version does not have (fields vary by version)."""
    names = _field_names(entity_type)
    return entity_type(**{k: v for k, v in values.items() if k in names})


@cache
def _field_names(entity_type: type) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(entity_type))


def nested(entity_type: type, field: str) -> type:
    """The entity type of a tuple field (``FetchResponse.responses`` -> ``FetchableTopicResponse``), through
    ``X | None`` and ``tuple[X, ...]``."""
    hint: Any = entity_type.__dataclass_fields__[field].type
    while hasattr(hint, "__args__"):
        hint = next(a for a in hint.__args__ if a is not type(None) and a is not Ellipsis)
    return hint
