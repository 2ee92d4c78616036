"""Protobuf values in the schema registry's wire format exported as typed columns (issue 28, part 1).

As for Avro and JSON Schema: the schemas are written into a registry storage topic on the real Kafka in the
format Confluent's registry and Karapace keep (``schemaType: PROTOBUF``, the shared ``common.proto`` imported
through a reference); the values are messages encoded by Google's protobuf runtime from protoc's descriptors,
framed with their message indexes (``tests/protobuf_values.py``), in two versions of one subject (the second
adds a field), with values that are not framed, name an unknown schema id, are of another message type of the
schema, are cut short, or hold an unsigned 64-bit value above a long's range. The sidecar tiers them; the tables
are read back with pyarrow, DuckDB and deltalake: every field of every record equal to the message produced.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from pyspark.sql import SparkSession

from deploy.stack import Endpoints
from reader.spark.export import ExportRequest, run_export
from reader.spark.registry_wire import NOT_FRAMED
from tests.conftest import create_topic
from tests.export_readers import exported_rows
from tests.integration.test_spark_export import cli_export, enable_and_tier, local_spark, registry_storage_topic
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
from tests.registry_rows import FramedValues, check_decoded
from tests.sidecar_harness import settings, write_config
from tiering.bench.registry_values import storage_record
from tiering_core.schema_registry import schemas_from_topic

pytestmark = [pytest.mark.integration, pytest.mark.slow]

COMMON_ID, V1_ID, V2_ID, UNKNOWN_ID = 41, 42, 43, 999
FIELDS = ["id", "customer", "amount", "paid", "blob", "status", "tags", "counts", "at", "note", "item", "card",
          "cash", "maybe", "price", "ratio", "big", "channel"]  # fmt: skip
STATUS = ["NEW", "PAID", "SHIPPED"]


def expected_row(message: Any, version: int) -> dict[str, Any]:
    """The fields as a Parquet reader gives them back: what a Protobuf reader of the message sees (defaults for
    fields without presence, null for unset message and optional fields), maps as sorted key/value pairs,
    timestamps as UTC instants without a zone."""
    has = message.HasField
    return {
        "id": message.id, "customer": message.customer, "amount": message.amount, "paid": message.paid,
        "blob": message.blob, "status": STATUS[message.status], "tags": list(message.tags),
        "counts": sorted(message.counts.items()),
        "at": message.at.ToDatetime() if has("at") else None,
        "note": message.note if has("note") else None,
        "item": {"sku": message.item.sku, "qty": message.item.qty} if has("item") else None,
        "card": message.card if has("card") else None, "cash": message.cash if has("cash") else None,
        "maybe": message.maybe.value if has("maybe") else None,
        "price": {"currency": message.price.currency, "cents": message.price.cents} if has("price") else None,
        "ratio": message.ratio, "big": message.big, "channel": message.channel if version == 2 else None,
    }  # fmt: skip


@pytest.fixture(scope="module")
def written(stack: Endpoints, tmp_path_factory: pytest.TempPathFactory) -> FramedValues:
    topic = create_topic(stack.bootstrap, internal_segment_bytes=64 * 1024)
    subject = f"{topic}-value"
    common = [{"name": "common.proto", "subject": "shop-common", "version": 1}]
    schemas_topic = registry_storage_topic(stack.bootstrap, [
        storage_record("shop-common", 1, COMMON_ID, COMMON, "PROTOBUF"),
        storage_record(subject, 1, V1_ID, ORDER_V1, "PROTOBUF", common),
        storage_record(subject, 2, V2_ID, ORDER_V2, "PROTOBUF", common)])  # fmt: skip
    texts = {1: ORDER_V1, 2: ORDER_V2}
    classes = {v: compile_proto({"common.proto": COMMON, "order.proto": text}) for v, text in texts.items()}
    producer = Producer({"bootstrap.servers": stack.bootstrap, "linger.ms": 5, "batch.size": 16384})  # < a segment
    out = FramedValues(topic, write_config(stack, tmp_path_factory.mktemp("protobuf"),
                                      schema_registry={"topic": schemas_topic}))  # fmt: skip
    sent = itertools.count()

    def add(value: bytes | None, expected: dict[str, Any] | None, error: str | None) -> None:
        n = next(sent)

        def report(err: object, msg: Any) -> None:
            assert err is None, err
            out.values[msg.offset()], out.expected[msg.offset()], out.errors[msg.offset()] = value, expected, error

        producer.produce(topic, key=f"k-{n}".encode(), value=value, on_delivery=report)

    undecodable = f"is not a shop.Order message or does not decode with schema id {V2_ID}"
    for n in range(5_000):
        version = 1 if n < 2_500 else 2
        schema_id = V1_ID if version == 1 else V2_ID
        message = order(message_class(classes[version], "shop.Order"), n, version)
        value = framed(schema_id, ORDER_INDEXES, message)
        if n % 500 == 7:
            add(message.SerializeToString(), None, NOT_FRAMED)
        elif n % 500 == 8:
            add(framed(UNKNOWN_ID, ORDER_INDEXES, message), None,
                f"schema id {UNKNOWN_ID} is not a version of subject {subject}")  # fmt: skip
        elif n % 500 == 9:
            add(framed(V2_ID, NOTE_INDEXES, message_class(classes[2], "shop.Note")(text="x")), None, undecodable)
        elif n % 500 == 10:
            add(value[:7] + b"\x12\x05ab", None, undecodable.replace(str(V2_ID), str(schema_id)))  # a string cut short
        elif n % 500 == 11:
            add(None, None, None)
        elif message.big > 2**63 - 1:  # the JSON number does not fit a long: the record is kept in _corrupt
            add(value, None, f"is not a shop.Order message or does not decode with schema id {schema_id}")
        else:
            add(value, expected_row(message, version), None)
        if n % 1000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0
    enable_and_tier(out.config, topic)
    return out


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    yield from local_spark("protobuf export tests")


def check(path: str, fmt: str, written: FramedValues, last: int) -> None:
    rows = {r["offset"]: r for r in exported_rows(path, fmt, ["offset", *FIELDS, "_corrupt", "_error"])}
    assert sum(1 for o in rows if (written.expected[o] or {}).get("channel") is not None) > 1_000, "too few v2"
    errors = check_decoded(rows, written, FIELDS, last, lambda want: want, lambda got: {**got,
                           "counts": sorted(got["counts"]) if got["counts"] is not None else None})  # fmt: skip
    assert len({written.errors[o].split(" with ")[0] for o in errors}) == 3, "not every kind of bad value exported"


def test_protobuf_values_become_typed_columns_in_parquet(written: FramedValues, spark: SparkSession,
                                                         tmp_path: Path) -> None:  # fmt: skip
    cfg = settings(written.config)
    versions = schemas_from_topic(cfg.bootstrap_servers, {}, cfg.schema_registry.topic).versions(
        f"{written.topic}-value")  # fmt: skip
    request = ExportRequest(topic=written.topic, format="parquet", path=str(tmp_path / "pq"),
                            store=cfg.remote_storage, value_format="protobuf", value_schemas=tuple(versions),
                            value_message="shop.Order")  # fmt: skip
    (rng,) = run_export(spark, request).ranges
    check(str(tmp_path / "pq"), "parquet", written, rng.last)
    schema = dict(spark.read.parquet(str(tmp_path / "pq")).dtypes)
    assert (schema["id"], schema["amount"], schema["blob"], schema["at"]) == ("bigint", "double", "binary", "timestamp")
    assert schema["counts"] == "map<string,bigint>" and schema["tags"] == "array<string>"
    assert schema["price"] == "struct<currency:string,cents:bigint>" and schema["status"] == "string"
    assert "value" not in schema and schema["_corrupt"] == "binary"


def test_the_cli_exports_protobuf_values_to_delta_with_auto(written: FramedValues, tmp_path: Path) -> None:
    path = tmp_path / "delta"
    summary = cli_export(written.topic, "delta", path, written.config, "--value-format", "auto",
                         "--value-message", "Order")  # fmt: skip
    check(str(path), "delta", written, summary["ranges"]["0"][1])


def test_a_message_type_the_schema_lacks_is_one_sentence_before_spark(written: FramedValues) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "tiering", "export", written.topic, "--path", "/tmp/never", "--value-format",
         "protobuf", "--value-message", "shop.Nope", "--config", str(written.config)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 1
    assert (
        f"subject {written.topic}-value version 2 (schema id {V2_ID}): the schema has no message type shop.Nope"
        in run.stderr
    )
    assert "Traceback" not in run.stderr and "SparkSession" not in run.stderr
