"""Avro values in the schema registry's wire format, decoded into typed columns by Spark's ``from_avro``.

One reader schema for the whole export: the union of the subject's versions (``union_avro_schema``). A
field every version has keeps its type (the newest version's, which Avro's promotions let read the older
ones); a field some versions lack becomes nullable with default null, so a record written before the field
existed reads it as null. Each record is decoded in the executors by ``from_avro`` (spark-avro, compiled
JVM code, no Python per record) with its own writer schema, chosen by the schema id in its first five bytes
(one CASE branch per version), resolved to the reader schema: every branch gives the same struct, whose
fields become the columns. A value that is not in the wire format, names a schema id that is not a version
of the subject, or does not decode keeps its bytes in ``_corrupt`` with the reason in ``_error``.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from reader.spark.registry_wire import payload_of, registry_columns, schema_id_of
from tiering_core.errors import ConfigError
from tiering_core.schema_registry import RegisteredSchema

_DECODED = "_tiering_decoded"


def union_avro_schema(versions: list[Any]) -> Any:
    """The reader schema for records written with any of ``versions`` (parsed Avro schemas, oldest first):
    for records of one name, their union (see above); for versions that are not records (a key that is a
    string or a long), the newest. Raises ConfigError when they are neither."""
    if not versions:
        raise ConfigError("no schema versions to read the values with")
    if not any(_is_record(v) for v in versions):
        return versions[-1]
    names = {v.get("name") for v in versions if isinstance(v, dict)}
    if len(names) != 1 or not all(_is_record(v) for v in versions):
        raise ConfigError(f"the subject's versions are not one Avro record (names: {sorted(map(str, names))})")
    return _merge_records(versions)


def _merge_records(versions: list[dict[str, Any]]) -> dict[str, Any]:
    newest = copy.deepcopy(versions[-1])
    by_name: dict[str, list[dict[str, Any]]] = {}
    order: list[str] = []
    for version in reversed(versions):  # the newest version's order first, then fields only older ones had
        for field in version["fields"]:
            if field["name"] not in by_name:
                order.append(field["name"])
            by_name.setdefault(field["name"], []).append(field)
    fields = []
    for name in order:
        seen = by_name[name]  # newest first
        field = copy.deepcopy(seen[0])
        types = [f["type"] for f in reversed(seen)]
        if all(_is_record(t) for t in types) and len({t["name"] for t in types}) == 1:
            field["type"] = _merge_records(types)
        elif all(_is_enum(t) for t in types) and len({t["name"] for t in types}) == 1:
            field["type"] = {**types[-1], "symbols": list(dict.fromkeys(s for t in types for s in t["symbols"]))}
        if len(seen) < len(versions):
            field["type"] = _nullable(field["type"])
            field["default"] = None
        fields.append(field)
    newest["fields"] = fields
    return newest


def _is_record(t: Any) -> bool:
    return isinstance(t, dict) and t.get("type") == "record"


def _is_enum(t: Any) -> bool:
    return isinstance(t, dict) and t.get("type") == "enum"


def _nullable(t: Any) -> Any:
    if isinstance(t, list):
        return t if "null" in t else ["null", *t]
    return t if t == "null" else ["null", t]


def decode_registry_avro(df: DataFrame, column: str, subject: str, versions: list[RegisteredSchema],
                         taken: set[str], *, prefix: str | None = None, corrupt: str = "_corrupt",
                         error_column: str = "_error") -> DataFrame:  # fmt: skip
    """``df`` with ``column`` (binary, wire format) replaced by its fields as columns, plus ``corrupt`` (the
    bytes of a value that gave none) and ``error_column`` (why). Fields are named ``prefix + name``; without a
    prefix, a field named like a column of ``taken``, ``corrupt`` or ``error_column`` gets ``<column>_``. A
    schema that is not a record (a string key) gives one column named ``column``, typed."""
    from pyspark.sql.avro.functions import from_avro

    avro = [v for v in versions if v.schema_type == "AVRO"]
    if not avro:
        raise ConfigError(f"subject {subject} has no Avro schema in the registry")
    by_id = {v.id: v for v in avro}
    reader = union_avro_schema([json.loads(v.schema) for v in avro])
    record = _is_record(reader)
    if record:
        # from_avro's PERMISSIVE mode gives a struct of nulls, not null, for a value that does not decode: a
        # field no writer has, whose default every decoded value gets, tells the two apart
        reader = {**reader, "fields": [*reader["fields"], {"name": _DECODED, "type": "boolean", "default": True}]}
    reader_json = json.dumps(reader)
    payload = payload_of(column)
    schema_id = schema_id_of(column)
    decoded: Any = None
    for schema_id_value, version in by_id.items():
        branch = from_avro(payload, version.schema, {"avroSchema": reader_json, "mode": "PERMISSIVE"})
        decoded = F.when(schema_id == schema_id_value, branch) if decoded is None else decoded.when(
            schema_id == schema_id_value, branch)  # fmt: skip

    def failed(value: Column) -> Column:
        # a record that does not decode is a struct of nulls; a scalar that decodes to null is a null of a
        # nullable schema, or a value that does not decode
        if record:
            return value.isNull() | value[_DECODED].isNull()
        return value.isNull() & F.lit(not _allows_null(reader))

    fields = [f["name"] for f in reader["fields"] if f["name"] != _DECODED] if record else None
    return registry_columns(df, column, subject, list(by_id), decoded, failed, fields, taken, prefix=prefix,
                            corrupt=corrupt, error_column=error_column)  # fmt: skip


def _allows_null(schema: Any) -> bool:
    return schema == "null" or (isinstance(schema, list) and "null" in schema)
