"""Unknown tagged fields are skipped, as Kafka skips them: every request and response schema the proxy can
parse, filled with a value in every field (tagged ones too), comes back from ``without_unknown_tags``
unchanged; with a tag its schema does not name added (at the top, or inside a nested entity) it parses to
the same entity instead of closing the connection; a body that does not follow its schema is a
ProtocolError naming the message."""

from __future__ import annotations

import dataclasses
import datetime
import uuid
from typing import Any

import pytest
from kio.schema.errors import ErrorCode
from kio.serial._implicit_defaults import get_tagged_field_default
from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveTupleField,
    classify_field,
    get_schema_field_type,
    is_optional,
)

from reader.proxy.protocol import ProtocolError, encode, parse, request_type, response_type, supported_versions
from reader.proxy.tagged import without_unknown_tags

_VALUES: dict[str, Any] = {
    "int8": 1, "uint8": 2, "int16": 3, "uint16": 4, "int32": 5, "uint32": 6, "int64": 7, "uint64": 8,
    "float64": 1.5, "bool": True, "string": "s", "bytes": b"xy", "records": b"rec", "uuid": uuid.UUID(int=9),
    "error_code": ErrorCode.none, "timedelta_i32": datetime.timedelta(milliseconds=3),
    "timedelta_i64": datetime.timedelta(milliseconds=4),
    "datetime_i64": datetime.datetime(2026, 1, 2, tzinfo=datetime.UTC),
}  # fmt: skip


def sample(entity_type: type, tags: bool = True) -> Any:
    """An instance with a value in every field, nested entities and arrays of two; tagged fields at their
    defaults unless ``tags``."""
    values = {}
    for f in dataclasses.fields(entity_type):
        if "tag" in f.metadata and not tags:  # the default: not written
            values[f.name] = f.default if f.default is not dataclasses.MISSING else get_tagged_field_default(f)
            continue
        shape = classify_field(f)
        if isinstance(shape, EntityTupleField):
            values[f.name] = (sample(shape.type_, tags), sample(shape.type_, tags))
        elif isinstance(shape, EntityField):
            values[f.name] = None if is_optional(f) and "tag" not in f.metadata else sample(shape.type_, tags)
        else:
            value = _VALUES[get_schema_field_type(f)]
            values[f.name] = (value, value) if isinstance(shape, PrimitiveTupleField) else value
    return entity_type(**values)


def schemas() -> list[type]:
    out = []
    for key, (low, high) in supported_versions().items():
        for version in range(low, high + 1):
            for of in (request_type, response_type):
                try:
                    out.append(of(key, version))
                except Exception:
                    continue
    return out


def test_every_schema_the_proxy_reads_comes_back_unchanged() -> None:
    checked = 0
    for entity_type in schemas():
        raw = encode(sample(entity_type))
        assert without_unknown_tags(entity_type, raw, 0) == raw, entity_type
        checked += 1
    assert checked > 300


def _with_unknown_tag(raw: bytes, at: int) -> bytes:
    """``raw`` with tag 90 (2 bytes) in the empty tag section at ``at``."""
    assert raw[at] == 0
    return raw[:at] + bytes([1, 90, 2, 0xAB, 0xCD]) + raw[at + 1 :]


def test_an_unknown_tag_at_the_top_is_skipped() -> None:
    for entity_type in (t for t in schemas() if t.__flexible__):
        entity = sample(entity_type, tags=False)
        raw = encode(entity)
        assert parse(entity_type, _with_unknown_tag(raw, len(raw) - 1), 0) == entity, entity_type


def test_an_unknown_tag_inside_a_nested_entity_is_skipped() -> None:
    """MetadataResponse v12: a tag in the last topic's own tag section and one at the top."""
    entity_type = response_type(3, 12)
    entity = sample(entity_type, tags=False)
    raw = encode(entity)
    topic = encode(entity.topics[-1])
    at = raw.rindex(topic) + len(topic) - 1  # the topic's tag section
    injected = _with_unknown_tag(_with_unknown_tag(raw, len(raw) - 1), at)
    assert parse(entity_type, injected, 0) == entity


def test_a_body_that_does_not_follow_its_schema_is_a_protocol_error() -> None:
    entity_type = response_type(3, 12)
    raw = _with_unknown_tag(encode(sample(entity_type, tags=False)), len(encode(sample(entity_type, tags=False))) - 1)
    with pytest.raises(ProtocolError, match="MetadataResponse v12"):
        parse(entity_type, raw[:-3], 0)  # the tag's value cut short
    with pytest.raises(ProtocolError, match="MetadataResponse v12"):
        without_unknown_tags(entity_type, raw + b"\x00", 0)  # a byte after the body
