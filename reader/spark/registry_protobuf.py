"""Protobuf values in the schema registry's wire format, exported as typed columns.

Spark's own Protobuf functions (``spark-protobuf``) are not served by the Maven registry this project builds
from, so the project's compiled module does the Protobuf part (``native/src/protobuf.rs``): on the driver it
compiles each version's schema (``.proto`` text, or a base64 ``FileDescriptorProto`` as confluent-kafka's
serializer registers it, with the schemas it imports through registry references; the well-known types are
built in) and describes the chosen message type's JSON form as a JSON Schema, from which the columns come as
for a JSON Schema subject (``registry_json.py``: versions merged field by field, a field added later null
before it existed). In the executors one Arrow UDF call per batch hands the framed values to the compiled
decoder, which reads the message indexes, decodes the message and writes its proto3 JSON form (the fields'
proto names, 64-bit integers as numbers, fields without presence written with their defaults as a Protobuf
reader sees them, unset message and ``optional`` fields null); Spark's ``from_json`` types it. No Python runs
per record.

One message type becomes the table's columns (``message``: its full name, default the first message type of
the subject's newest version, which is what index ``[0]`` in the framing names). A value of another message
type, an unknown schema id or bytes that do not decode keep their bytes in ``_corrupt`` with the reason in
``_error``. Types as the JSON mapping gives them: 32- and 64-bit integers a long (an unsigned 64-bit value
above 2^63 - 1 does not fit: its record goes to ``_corrupt``), float and double a double, bytes binary, enums
their value's name, ``map`` a map, ``repeated`` an array, ``google.protobuf.Timestamp`` a timestamp, the
wrapper types their value, ``Struct``/``Value``/``ListValue``/``Any``, ``Duration`` and a message that
contains itself as their JSON text.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StringType

from reader.spark.registry_json import json_columns, json_schema_type, union_types
from tiering_core.errors import ConfigError
from tiering_core.schema_registry import RegisteredSchema

Compiled = dict[int, tuple[bytes, str]]  # schema id -> (FileDescriptorSet, the main file's name in it)
_DECODERS: dict[str, Any] = {}  # in each Python worker: the compiled decoders by their schemas' digest


def _native() -> Any:
    try:
        import tiering_native
    except ImportError:
        raise ConfigError("Protobuf values are decoded by the project's compiled module (tiering_native), which "
                          "is not installed here: build it from native/ (deploy/setup.sh does)") from None  # fmt: skip
    return tiering_native


def compile_versions(subject: str, versions: list[RegisteredSchema]) -> Compiled:
    """The subject's Protobuf versions compiled by schema id. Raises ConfigError naming the version whose
    schema does not compile."""
    native, compiled = _native(), {}  # in the versions' order
    for version in versions:
        try:
            compiled[version.id] = native.protobuf_compile(version.schema, dict(version.imports))
        except ValueError as exc:
            raise ConfigError(f"subject {subject} version {version.version} (schema id {version.id}): {exc}") from None
    return compiled


def message_type(subject: str, versions: list[RegisteredSchema], message: str | None) -> tuple[Compiled, str]:
    """The subject's Protobuf versions compiled, and the full name of the message type exported (``message``,
    a full name or one of the newest version's file, else that file's first message type). Raises
    ConfigError, before any Spark work, when a schema does not compile or has no such message type."""
    schemas = [v for v in versions if v.schema_type == "PROTOBUF"]
    if not schemas:
        raise ConfigError(f"subject {subject} has no Protobuf schema in the registry")
    compiled = compile_versions(subject, schemas)
    newest = schemas[-1]
    try:
        name, _ = _native().protobuf_json_schema(*compiled[newest.id], message)
    except ValueError as exc:
        raise ConfigError(f"subject {subject} version {newest.version} (schema id {newest.id}): {exc}") from None
    return compiled, str(name)


def decode_registry_protobuf(df: DataFrame, column: str, subject: str, versions: list[RegisteredSchema],
                             taken: set[str], *, message: str | None = None, prefix: str | None = None,
                             corrupt: str = "_corrupt", error_column: str = "_error") -> DataFrame:  # fmt: skip
    """``df`` with ``column`` (binary, wire format, Protobuf) replaced by the fields of ``message`` as columns,
    plus ``corrupt`` and ``error_column`` (``reader/spark/registry_wire.py``)."""
    compiled, name = message_type(subject, versions, message)
    types = []  # oldest first (compiled keeps the versions' order), as union_types merges them
    for descriptors, file in compiled.values():
        try:
            _, document = _native().protobuf_json_schema(descriptors, file, name)
        except ValueError:
            continue  # a version without that message type: its records go to _corrupt
        types.append(json_schema_type(json.loads(document)))
    texts = _json_texts(compiled, name)
    return json_columns(df, column, subject, list(compiled), union_types(types), texts(F.col(column)),
                        taken, prefix=prefix, corrupt=corrupt, error_column=error_column,
                        failure=f"is not a {name} message or does not decode")  # fmt: skip


def _json_texts(compiled: Compiled, message: str) -> Any:
    """An Arrow UDF: a column of framed values into their JSON texts (null: none), one compiled call per batch."""
    digest = hashlib.sha256(message.encode())
    for schema_id in sorted(compiled):
        digest.update(schema_id.to_bytes(4, "big") + compiled[schema_id][0])
    key = digest.hexdigest()

    @F.arrow_udf(StringType())  # type: ignore[misc]
    def json_texts(values: pa.Array) -> pa.Array:
        decoder = _DECODERS.get(key)
        if decoder is None:
            decoder = _DECODERS[key] = _native().ProtobufDecoder(compiled, message)
        return protobuf_texts(decoder, values)

    return json_texts


def protobuf_texts(decoder: Any, values: pa.Array) -> pa.Array:
    """``decoder.to_json`` over an Arrow binary array's buffers (no Python object per value)."""
    if values.type != pa.binary():
        values = values.cast(pa.binary())
    validity, offsets, data = values.buffers()
    as_bytes = [memoryview(b).cast("B") if b is not None else None for b in (offsets, data, validity)]
    if as_bytes[1] is None:  # every value null or empty: no data buffer
        as_bytes[1] = memoryview(b"")
    out_offsets, out_data, out_validity, nulls = decoder.to_json(*as_bytes, values.offset, len(values))
    return pa.StringArray.from_buffers(len(values), pa.py_buffer(out_offsets), pa.py_buffer(out_data),
                                       pa.py_buffer(out_validity), nulls)  # fmt: skip
