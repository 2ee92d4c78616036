"""The Spark types of JSON Schemas and of a subject's versions together (reader/spark/registry_json.py)."""

from __future__ import annotations

from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DateType,
    DoubleType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from reader.spark.registry_json import json_schema_type, union_types


def struct(**fields: object) -> StructType:
    return StructType([StructField(name, t) for name, t in fields.items()])  # type: ignore[arg-type]


def test_an_object_becomes_a_struct_of_its_properties_in_their_order_with_logical_types() -> None:
    schema = {
        "type": "object",
        "required": ["id"],
        "properties": {
            "id": {"type": "integer", "minimum": 0},
            "price": {"type": "number"},
            "paid": {"type": "boolean"},
            "day": {"type": "string", "format": "date"},
            "at": {"type": "string", "format": "date-time"},
            "note": {"type": ["string", "null"]},
            "tags": {"type": "array", "items": {"type": "string"}},
            "attrs": {"type": "object", "additionalProperties": {"type": "integer"}},
            "anything": {"type": "object"},
            "status": {"enum": ["NEW", "PAID"]},
            "level": {"enum": [1, 2, 3]},
            "ship": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
    assert json_schema_type(schema) == struct(
        id=LongType(), price=DoubleType(), paid=BooleanType(), day=DateType(), at=TimestampType(),
        note=StringType(), tags=ArrayType(StringType()), attrs=MapType(StringType(), LongType()),
        anything=MapType(StringType(), StringType()), status=StringType(), level=LongType(),
        ship=struct(city=StringType()),
    )  # fmt: skip


def test_references_branches_and_recursion() -> None:
    a_only = {"type": "object", "properties": {"a": {"type": "integer"}}}
    b_only = {"type": "object", "properties": {"b": {"type": "string"}}}
    schema = {
        "$defs": {
            "address": {"type": "object", "properties": {"city": {"type": "string"}}},
            "node": {"type": "object", "properties": {"name": {"type": "string"}, "child": {"$ref": "#/$defs/node"}}},
        },
        "definitions": {"amount": {"type": "number"}},
        "type": "object",
        "properties": {
            "home": {"$ref": "#/$defs/address"},
            "total": {"$ref": "#/definitions/amount"},
            "tree": {"$ref": "#/$defs/node"},
            "elsewhere": {"$ref": "https://example.com/other.json"},
            "id": {"oneOf": [{"type": "integer"}, {"type": "null"}]},
            "either": {"anyOf": [{"type": "integer"}, {"type": "number"}]},
            "mixed": {"type": ["integer", "string"]},
            "both": {"allOf": [a_only, b_only]},
        },
    }
    node = json_schema_type(schema)
    assert isinstance(node, StructType)
    assert node["home"].dataType == struct(city=StringType())
    assert node["total"].dataType == DoubleType()
    assert node["tree"].dataType == struct(name=StringType(), child=StringType())  # the recursion as JSON text
    assert node["elsewhere"].dataType == StringType()
    assert node["id"].dataType == LongType()
    assert node["either"].dataType == DoubleType()
    assert node["mixed"].dataType == StringType()
    assert node["both"].dataType == struct(b=StringType(), a=LongType())


def test_a_scalar_root_keeps_its_type() -> None:
    assert json_schema_type({"type": "string"}) == StringType()
    assert json_schema_type({"type": "array", "items": {"type": "integer"}}) == ArrayType(LongType())
    assert json_schema_type(True) == StringType()


def test_versions_merge_field_by_field_and_widen_what_changed() -> None:
    v1 = struct(id=LongType(), amount=LongType(), old=StringType(), at=DateType(), nested=struct(a=LongType()))
    v2 = struct(id=LongType(), amount=DoubleType(), at=TimestampType(), nested=struct(b=StringType()),
                added=ArrayType(LongType()))  # fmt: skip
    v3 = struct(id=StringType(), added=ArrayType(DoubleType()))
    assert union_types([v1, v2]) == struct(
        id=LongType(), amount=DoubleType(), at=TimestampType(), nested=struct(b=StringType(), a=LongType()),
        added=ArrayType(LongType()), old=StringType(),
    )  # fmt: skip
    merged = union_types([v1, v2, v3])
    assert isinstance(merged, StructType)
    assert merged["id"].dataType == StringType()  # a long in one version, a string in another: the JSON text
    assert merged["added"].dataType == ArrayType(DoubleType())
    assert [f.name for f in merged.fields][:2] == ["id", "added"]  # the newest version's order first
