"""JSON Schema values in the schema registry's wire format, parsed into typed columns by Spark's ``from_json``.

The columns come from the subject's JSON Schemas, not from a sample of the data: each version is turned into a
Spark type (``json_schema_type``) and the versions are merged (``union_types``: an object's properties are the
union of every version's, each nullable, as JSON has no required column in a table; a property whose type
changed between versions keeps the wider one, else its JSON text). The payload (the JSON text after the
framing) is parsed in the executors by ``from_json`` (compiled, no Python per record) with that one schema:
JSON carries its field names, so records of every version parse with it. A value that is not framed, names a
schema id that is not a JSON Schema version of the subject, is not UTF-8, is not JSON, or holds a value of
another type than its schema's (a string where a number belongs) keeps its bytes in ``_corrupt``, the
reason in ``_error``.

The mapping, for what a JSON Schema says about a value's shape (validation keywords such as ``minimum``,
``pattern`` or ``required`` say nothing about it and are not checked):

- ``object`` with ``properties``: a struct of them, in their order; with only ``additionalProperties``
  (a dictionary): a map from string to their type;
- ``array``: an array of ``items``' type (``prefixItems`` or a list of item schemas: of their union);
- ``string``: string; ``format: date`` a date, ``format: date-time`` a timestamp, ``contentEncoding: base64``
  binary (the decoded bytes); ``integer``: long;
  ``number``: double; ``boolean``: boolean; ``enum`` or ``const`` of strings: string;
- ``type`` as a list, ``oneOf`` and ``anyOf``: the union of the branches, ``null`` only making it nullable;
  ``allOf``: its branches' properties together; ``$ref`` within the document (``#/definitions/...``,
  ``#/$defs/...``): the schema it points to (a reference to itself, directly or not, is that value's JSON
  text);
- anything else (no type, ``true``, references to other documents): the value's JSON text, as a string.
"""

from __future__ import annotations

import json
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    DateType,
    DoubleType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from reader.spark.registry_wire import payload_of, registry_columns
from tiering_core.errors import ConfigError
from tiering_core.schema_registry import RegisteredSchema

_SCALARS: dict[str, DataType] = {"integer": LongType(), "number": DoubleType(), "boolean": BooleanType(),
                                 "string": StringType()}  # fmt: skip
_FORMATS: dict[str, DataType] = {"date": DateType(), "date-time": TimestampType()}
_WIDER = {(LongType(), DoubleType()): DoubleType(), (DateType(), TimestampType()): TimestampType()}
_MALFORMED = "_tiering_malformed"  # from_json's corrupt record field


def json_schema_type(schema: Any) -> DataType:
    """The Spark type of values of the JSON Schema ``schema`` (a parsed document)."""
    return _Converter(schema).type_of(schema, ())


class _Converter:
    def __init__(self, document: Any) -> None:
        self.document = document

    def type_of(self, schema: Any, refs: tuple[str, ...]) -> DataType:
        if not isinstance(schema, dict):
            return StringType()  # true, false, or not a schema: its JSON text
        ref = schema.get("$ref")
        if isinstance(ref, str):
            target = self._resolve(ref)
            if target is None or ref in refs:
                return StringType()  # another document, or a recursive structure
            return self.type_of(target, (*refs, ref))
        branches = schema.get("oneOf") or schema.get("anyOf")
        if isinstance(branches, list):
            return union_types([self.type_of(b, refs) for b in branches if not _is_null(b)])
        if isinstance(schema.get("allOf"), list):
            merged = [self.type_of(b, refs) for b in schema["allOf"]]
            return union_types(merged) if all(isinstance(t, StructType) for t in merged) else StringType()
        kind = schema.get("type")
        if isinstance(kind, list):
            return union_types([self.type_of({**schema, "type": k}, refs) for k in kind if k != "null"])
        if kind is None and "properties" in schema:
            kind = "object"
        if kind is None and ("enum" in schema or "const" in schema):
            values = schema["enum"] if isinstance(schema.get("enum"), list) else [schema.get("const")]
            return union_types([_literal_type(v) for v in values if v is not None])
        if kind == "object":
            return self._object(schema, refs)
        if kind == "array":
            items = schema.get("items", schema.get("prefixItems"))
            if isinstance(items, list):
                return ArrayType(union_types([self.type_of(i, refs) for i in items]))
            return ArrayType(self.type_of(items, refs) if items is not None else StringType())
        if kind == "string":
            if schema.get("contentEncoding") == "base64":
                return BinaryType()
            return _FORMATS.get(schema.get("format"), StringType())
        return _SCALARS.get(kind, StringType())

    def _object(self, schema: dict[str, Any], refs: tuple[str, ...]) -> DataType:
        properties = schema.get("properties")
        if isinstance(properties, dict) and properties:
            return StructType([StructField(name, self.type_of(p, refs)) for name, p in properties.items()])
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            return MapType(StringType(), self.type_of(extra, refs))
        return MapType(StringType(), StringType())  # any keys, any values: their JSON text

    def _resolve(self, ref: str) -> Any:
        if not ref.startswith("#"):
            return None
        node = self.document
        for part in ref[1:].split("/")[1:] if ref != "#" else []:
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(node, dict) or part not in node:
                return None
            node = node[part]
        return node


def _literal_type(value: Any) -> DataType:
    if isinstance(value, bool):
        return BooleanType()
    if isinstance(value, int):
        return LongType()
    if isinstance(value, float):
        return DoubleType()
    return StringType()


def _is_null(schema: Any) -> bool:
    return isinstance(schema, dict) and schema.get("type") == "null"


def union_types(types: list[DataType]) -> DataType:
    """One type that holds values of all ``types`` (the versions of a subject, oldest first): structs merged
    field by field (the newest version's order, then fields only older ones had), arrays and maps by their
    elements, a long and a double as a double, a date and a timestamp as a timestamp, else a string (the JSON
    text of whatever the value is)."""
    if not types:
        return StringType()
    out = types[0]
    for t in types[1:]:
        out = _pair(out, t)
    return out


def _pair(a: DataType, b: DataType) -> DataType:
    if a == b:
        return a
    if isinstance(a, StructType) and isinstance(b, StructType):
        older = {f.name: f.dataType for f in a.fields}
        newer = {f.name: f.dataType for f in b.fields}
        names = list(newer) + [n for n in older if n not in newer]
        return StructType([StructField(n, _pair(older[n], newer[n]) if n in older and n in newer
                                       else newer.get(n, older.get(n)))  # type: ignore[arg-type]
                           for n in names])  # fmt: skip
    if isinstance(a, ArrayType) and isinstance(b, ArrayType):
        return ArrayType(_pair(a.elementType, b.elementType))
    if isinstance(a, MapType) and isinstance(b, MapType):
        return MapType(StringType(), _pair(a.valueType, b.valueType))
    return _WIDER.get((a, b)) or _WIDER.get((b, a)) or StringType()


def decode_registry_json(df: DataFrame, column: str, subject: str, versions: list[RegisteredSchema],
                         taken: set[str], *, prefix: str | None = None, corrupt: str = "_corrupt",
                         error_column: str = "_error") -> DataFrame:  # fmt: skip
    """``df`` with ``column`` (binary, wire format, JSON payload) replaced by the fields of the subject's JSON
    Schemas as columns (a schema that is not an object: one typed column ``column``), plus ``corrupt`` and
    ``error_column`` (``reader/spark/registry_wire.py``)."""
    schemas = [v for v in versions if v.schema_type == "JSON"]
    if not schemas:
        raise ConfigError(f"subject {subject} has no JSON Schema in the registry")
    value_type = union_types([json_schema_type(json.loads(v.schema)) for v in schemas])
    text = payload_of(column).cast("string")
    return json_columns(df, column, subject, [v.id for v in schemas], value_type, F.when(F.is_valid_utf8(text), text),
                        taken, prefix=prefix, corrupt=corrupt, error_column=error_column)  # fmt: skip


def json_columns(df: DataFrame, column: str, subject: str, ids: list[int], value_type: DataType, text: Column,
                 taken: set[str], *, prefix: str | None, corrupt: str, error_column: str,
                 failure: str = "does not decode") -> DataFrame:  # fmt: skip
    """``df`` with ``column`` replaced by the values of ``text`` (each value's JSON text, null where there is
    none) parsed by ``from_json`` as ``value_type``: a struct's fields as columns, else one column."""
    fields: list[str] | None
    if isinstance(value_type, StructType):
        fields = [f.name for f in value_type.fields]
        parse: DataType = StructType([*value_type.fields, StructField(_MALFORMED, StringType())])
        options = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": _MALFORMED}

        def failed(value: Column) -> Column:
            return value.isNull() | value[_MALFORMED].isNotNull()
    else:  # from_json parses objects, arrays and maps only: a scalar (or array) root is parsed as [value]
        fields, parse, options = None, ArrayType(value_type), {"mode": "PERMISSIVE"}
        text = F.concat(F.lit("["), text, F.lit("]"))

        def failed(value: Column) -> Column:
            return value.isNull() | (F.size(value) != 1)

    return registry_columns(df, column, subject, ids, F.from_json(text, parse, options), failed, fields, taken,
                            prefix=prefix, corrupt=corrupt, error_column=error_column, failure=failure,
                            scalar=lambda value: value[0])  # fmt: skip
