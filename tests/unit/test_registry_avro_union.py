"""The reader schema of a subject's Avro versions (reader/spark/registry_avro.py ``union_avro_schema``)."""

from __future__ import annotations

import io
from typing import Any

import fastavro
import pytest

from reader.spark.registry_avro import union_avro_schema
from tiering_core.errors import ConfigError


def record(name: str, *fields: dict[str, Any]) -> dict[str, Any]:
    return {"type": "record", "name": name, "fields": list(fields)}


ADDRESS_1 = record("Address", {"name": "city", "type": "string"})
ADDRESS_2 = record("Address", {"name": "city", "type": "string"}, {"name": "zip", "type": "int", "default": 0})
V1 = record("Order", {"name": "id", "type": "int"}, {"name": "old", "type": "string"},
            {"name": "state", "type": {"type": "enum", "name": "S", "symbols": ["A", "B"]}},
            {"name": "address", "type": ADDRESS_1})  # fmt: skip
V2 = record("Order", {"name": "id", "type": "long"}, {"name": "new", "type": "string", "default": "x"},
            {"name": "state", "type": {"type": "enum", "name": "S", "symbols": ["A", "C"]}},
            {"name": "address", "type": ADDRESS_2})  # fmt: skip


def read(writer: dict[str, Any], reader: dict[str, Any], doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` written with ``writer``, read with ``reader`` by fastavro's schema resolution (Avro's rules)."""
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(writer), doc)
    out.seek(0)
    return fastavro.schemaless_reader(out, fastavro.parse_schema(writer), fastavro.parse_schema(reader))


def test_every_field_of_every_version_with_null_where_a_version_lacks_it() -> None:
    union = union_avro_schema([V1, V2])
    assert [f["name"] for f in union["fields"]] == ["id", "new", "state", "address", "old"]
    by_name = {f["name"]: f for f in union["fields"]}
    assert by_name["id"]["type"] == "long", "the newest type (int promotes to long)"
    assert by_name["old"]["type"] == ["null", "string"] and by_name["old"]["default"] is None
    assert by_name["new"]["type"] == ["null", "string"] and by_name["new"]["default"] is None
    assert by_name["state"]["type"]["symbols"] == ["A", "B", "C"]
    assert [f["name"] for f in by_name["address"]["type"]["fields"]] == ["city", "zip"]


def test_records_of_each_version_read_with_the_union() -> None:
    union = union_avro_schema([V1, V2])
    old = read(V1, union, {"id": 1, "old": "o", "state": "B", "address": {"city": "Oslo"}})
    assert old == {"id": 1, "new": None, "state": "B", "address": {"city": "Oslo", "zip": None}, "old": "o"}
    new = read(V2, union, {"id": 2, "new": "n", "state": "C", "address": {"city": "Rome", "zip": 7}})
    assert new == {"id": 2, "new": "n", "state": "C", "address": {"city": "Rome", "zip": 7}, "old": None}


def test_versions_that_are_not_one_record_are_refused() -> None:
    with pytest.raises(ConfigError, match="not one Avro record"):
        union_avro_schema([V1, record("Other", {"name": "id", "type": "int"})])
    with pytest.raises(ConfigError, match="no schema versions"):
        union_avro_schema([])
