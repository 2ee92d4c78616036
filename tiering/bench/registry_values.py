"""Values as a schema registry's Avro serializer writes them, and the registry's own storage records: what
``tiering bench export --value-format avro`` (and the export's tests) produce. fastavro writes the payload."""

from __future__ import annotations

import io
import json
import struct
from typing import Any

import fastavro

from tiering_core.schema_registry import MAGIC


def framed(schema_id: int, parsed_schema: Any, record: dict[str, Any]) -> bytes:
    """``record`` in the wire format: magic byte 0, the schema id (big-endian int32), the Avro payload.
    ``parsed_schema`` from ``fastavro.parse_schema``."""
    out = io.BytesIO()
    out.write(struct.pack(">bi", MAGIC, schema_id))
    fastavro.schemaless_writer(out, parsed_schema, record)
    return out.getvalue()


def storage_record(subject: str, version: int, schema_id: int, schema: Any, schema_type: str = "AVRO",
                   references: list[dict[str, Any]] | None = None) -> tuple[bytes, bytes]:  # fmt: skip
    """The key and value a registry writes to its storage topic (``_schemas``) for one version of a subject, as
    Confluent's registry and Karapace do (``schemaType`` only when not Avro; ``references``: name, subject,
    version of the schemas it imports). ``schema``: its text (a .proto), or a document written as JSON."""
    key = {"keytype": "SCHEMA", "subject": subject, "version": version, "magic": 1}
    text = schema if isinstance(schema, str) else json.dumps(schema)
    value: dict[str, Any] = {"subject": subject, "version": version, "id": schema_id, "schema": text, "deleted": False}
    if schema_type != "AVRO":
        value["schemaType"] = schema_type
    if references:
        value["references"] = references
    return json.dumps(key).encode(), json.dumps(value).encode()
