"""Protobuf values of the schema registry decoded by the compiled module (native/src/protobuf.rs) into the JSON
texts the export types with ``from_json`` (reader/spark/registry_protobuf.py). The values are built and encoded
by Google's protobuf runtime from schemas compiled by protoc, and our JSON texts are read back by Google's JSON
parser: each must give back the very message that was encoded."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
import tiering_native as native
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import json_format
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DoubleType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from reader.spark.registry_json import json_schema_type, union_types
from reader.spark.registry_protobuf import compile_versions, message_type, protobuf_texts
from tests.protobuf_values import (
    COMMON,
    NOTE_INDEXES,
    ORDER_INDEXES,
    ORDER_V1,
    ORDER_V2,
    compile_proto,
    framed,
    message_class,
    order,
)
from tiering_core.errors import ConfigError
from tiering_core.schema_registry import (
    RegisteredSchema,
    SchemaCatalog,
    SchemaReference,
    SchemaRegistryError,
    schemas_from_registry,
)

COMMON_REF = SchemaReference("common.proto", "common-value", 1)


def registered(schema_id: int, version: int, text: str) -> RegisteredSchema:
    return RegisteredSchema(schema_id, "orders-value", version, "PROTOBUF", text, references=(COMMON_REF,))


def catalog() -> SchemaCatalog:
    common = RegisteredSchema(5, "common-value", 1, "PROTOBUF", COMMON)
    return SchemaCatalog([common, registered(7, 1, ORDER_V1), registered(8, 2, ORDER_V2)])


def decoder(message: str = "shop.Order") -> object:
    versions = catalog().versions("orders-value")
    return native.ProtobufDecoder(compile_versions("orders-value", versions), message)


def test_every_value_decodes_to_json_googles_parser_reads_back_as_the_same_message() -> None:
    v1 = message_class(compile_proto({"common.proto": COMMON, "order.proto": ORDER_V1}), "shop.Order")
    v2 = message_class(compile_proto({"common.proto": COMMON, "order.proto": ORDER_V2}), "shop.Order")
    messages = [order(v1, n, 1) if n % 2 else order(v2, n, 2) for n in range(400)]
    values = [framed(7 if n % 2 else 8, ORDER_INDEXES, m) for n, m in enumerate(messages)]
    array = pa.array([None, *values], pa.binary()).slice(1)  # an array with an offset, as Arrow batches come
    texts = protobuf_texts(decoder(), array).to_pylist()
    for n, (message, text) in enumerate(zip(messages, texts, strict=True)):
        assert text is not None, f"value {n} gave no JSON"
        back = json_format.Parse(text, type(message)())
        assert back == message, f"value {n}: {text}"
        doc = json.loads(text)
        assert doc["id"] == message.id and isinstance(doc["id"], int), "64-bit integers are numbers"
        assert "customer" in doc and "status" in doc, "fields without presence are written with their defaults"
        assert ("note" in doc) == message.HasField("note") and ("item" in doc) == message.HasField("item")


def test_values_that_give_no_message_are_null() -> None:
    pool = compile_proto({"common.proto": COMMON, "order.proto": ORDER_V1})
    good = framed(7, ORDER_INDEXES, order(message_class(pool, "shop.Order"), 3, 1))
    note = framed(7, NOTE_INDEXES, message_class(pool, "shop.Note")(text="x"))
    # the last three but one: a string field cut short, message indexes past the file's message types
    values = [good, None, b"", b"\x01" + good[1:], framed(999, ORDER_INDEXES, message_class(pool, "shop.Order")()),
              note, good[:7] + b"\x12\x05ab", good[:5] + b"\x02\x0e" + good[7:], good]  # fmt: skip
    texts = protobuf_texts(decoder(), pa.array(values, pa.binary())).to_pylist()
    assert [t is not None for t in texts] == [True, False, False, False, False, False, False, False, True]


def test_the_columns_follow_the_message_in_declaration_order_versions_merged() -> None:
    compiled, name = message_type("orders-value", catalog().versions("orders-value"), None)
    assert name == "shop.Note", "no message named: the newest schema's first message type"
    compiled, name = message_type("orders-value", catalog().versions("orders-value"), "Order")
    assert name == "shop.Order", "a name of the schema's package is qualified"
    types = [json_schema_type(json.loads(native.protobuf_json_schema(*c, name)[1])) for c in compiled.values()]
    merged = union_types(types)
    assert isinstance(merged, StructType)
    assert [f.name for f in merged.fields] == ["id", "customer", "amount", "paid", "blob", "status", "tags", "counts",
                                               "at", "note", "item", "card", "cash", "maybe", "price", "ratio", "big",
                                               "channel"]  # fmt: skip
    kinds = {f.name: f.dataType for f in merged.fields}
    assert kinds["id"] == LongType() and kinds["amount"] == DoubleType() and kinds["paid"] == BooleanType()
    assert kinds["blob"] == BinaryType() and kinds["status"] == StringType() and kinds["at"] == TimestampType()
    assert kinds["tags"] == ArrayType(StringType()) and kinds["counts"] == MapType(StringType(), LongType())
    assert kinds["item"] == StructType([StructField("sku", StringType()), StructField("qty", LongType())])
    assert kinds["maybe"] == LongType(), "a wrapper type is its value"
    assert kinds["price"] == StructType([StructField("currency", StringType()), StructField("cents", LongType())])


def test_a_message_that_contains_itself_is_json_text_below_the_top() -> None:
    tree = 'syntax = "proto3"; message Tree { string name = 1; repeated Tree children = 2; }'
    compiled = native.protobuf_compile(tree, {})
    value_type = json_schema_type(json.loads(native.protobuf_json_schema(*compiled, None)[1]))
    children = StructField("children", ArrayType(StringType()))
    assert value_type == StructType([StructField("name", StringType()), children])


def test_what_confluents_serializer_writes_decodes_through_the_rest_api() -> None:
    """confluent-kafka's ProtobufSerializer registers the schema as a base64 FileDescriptorProto (with the
    well-known types as references it skips) and writes the message indexes itself."""
    pool = compile_proto({"common.proto": COMMON, "order.proto": ORDER_V1})
    cls = message_class(pool, "shop.Order")
    client = SchemaRegistryClient.new_client({"url": "mock://protobuf-test"})
    serializer = ProtobufSerializer(cls, client, {"use.deprecated.format": False})
    messages = [order(cls, n, 1) for n in range(50)]
    ctx = SerializationContext("orders", MessageField.VALUE)
    values = [serializer(m, ctx) for m in messages]
    versions = schemas_from_registry({"url": "mock://protobuf-test"}, ["orders-value"], client=client)
    (version,) = versions.versions("orders-value")
    assert {name for name, _ in version.imports} == {"common.proto"}, "the import registered as a reference"
    compiled, name = message_type("orders-value", [version], "shop.Order")
    texts = protobuf_texts(native.ProtobufDecoder(compiled, name), pa.array(values, pa.binary())).to_pylist()
    assert [json_format.Parse(t, cls()) for t in texts] == messages


def test_a_schema_that_does_not_compile_names_its_version_and_line() -> None:
    broken = RegisteredSchema(9, "orders-value", 3, "PROTOBUF", 'syntax = "proto3";\nmessage A { strin x = 1; }')
    with pytest.raises(ConfigError, match=r"subject orders-value version 3 \(schema id 9\): .*strin"):
        message_type("orders-value", [broken], None)
    with pytest.raises(ConfigError, match=r"has no message type shop\.Nope"):
        message_type("orders-value", catalog().versions("orders-value"), "shop.Nope")


def test_a_reference_the_registry_does_not_hold_is_named() -> None:
    lonely = SchemaCatalog([registered(7, 1, ORDER_V1)])
    with pytest.raises(SchemaRegistryError, match=r"imports common\.proto as subject common-value version 1"):
        lonely.versions("orders-value")
