"""Avro values in the schema registry's wire format exported as typed columns (issue 28, part 1).

No schema registry server installs here: the schemas are written into a registry storage topic on the real
Kafka in the format Confluent's registry and Karapace keep (``_schemas``), with records of other key types
beside them, and the export reads them from there; the REST path is held to the same answer through
confluent-kafka's in-process registry (``mock://``). The values are written with fastavro in the registry's
wire format, in two versions of one subject (the second adds a field and an enum symbol and drops a field),
with values that are not in the wire format, name an unknown schema id, or do not decode. The tables are
read back with pyarrow, DuckDB and deltalake: every field of every record equal to what fastavro wrote.
"""

from __future__ import annotations

import datetime
import decimal
import itertools
import json
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fastavro
import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from pyspark.sql import SparkSession

from deploy.stack import Endpoints
from reader.spark.export import ExportRequest, run_export
from reader.spark.registry_wire import NOT_FRAMED
from tests.conftest import create_topic
from tests.export_readers import exported_rows
from tests.integration.test_spark_export import cli_export, enable_and_tier, local_spark, registry_storage_topic
from tests.sidecar_harness import settings, write_config
from tiering.bench.registry_values import framed as framed_with
from tiering.bench.registry_values import storage_record
from tiering_core.schema_registry import schemas_from_registry, schemas_from_topic

pytestmark = [pytest.mark.integration, pytest.mark.slow]

V1 = {
    "type": "record", "name": "Order", "namespace": "shop",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "customer", "type": "string"},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "attrs", "type": {"type": "map", "values": "long"}},
        {"name": "state", "type": {"type": "enum", "name": "State", "symbols": ["NEW", "PAID"]}},
        {"name": "ship", "type": ["null", {"type": "record", "name": "Ship", "fields": [
            {"name": "city", "type": "string"}, {"name": "zip", "type": "int"}]}], "default": None},
        {"name": "offset", "type": "int"},  # named like a Kafka column: exported as value_offset
    ],
}  # fmt: skip
V2 = json.loads(json.dumps(V1))
V2["fields"][7]["type"]["symbols"].append("SHIPPED")
V2["fields"].append({"name": "note", "type": ["null", "string"], "default": None})
V2["fields"] = [f for f in V2["fields"] if f["name"] != "tags"]  # dropped in version 2: null in its records
FIELDS = ["id", "customer", "amount", "day", "at", "tags", "attrs", "state", "ship", "value_offset", "note"]
V1_ID, V2_ID, UNKNOWN_ID, KEY_ID = 7, 12, 999, 20
KEY = {"type": "string"}  # keys are strings (StringSerializer's Avro twin): one typed key column


def framed(schema_id: int, schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    return framed_with(schema_id, fastavro.parse_schema(schema), record)


def record(n: int, version: int) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "id": n, "customer": f"c-{n % 17}", "amount": decimal.Decimal(n) / 100,
        "day": datetime.date(2026, 1, 1) + datetime.timedelta(days=n % 300),
        "at": datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC) + datetime.timedelta(seconds=n),
        "tags": [f"t{i}" for i in range(n % 3)], "attrs": {f"k{i}": n * i for i in range(n % 2)},
        "state": ["NEW", "PAID", "SHIPPED"][n % (3 if version == 2 else 2)],
        "ship": None if n % 4 == 0 else {"city": f"city-{n % 5}", "zip": 10_000 + n % 90},
        "offset": -n,
    }  # fmt: skip
    if version == 2:
        doc["note"] = None if n % 3 == 0 else f"note {n}"
        del doc["tags"]
    return doc


def schema_records(subject: str) -> list[tuple[bytes | None, bytes | None]]:
    """What a registry writes to its storage topic for two versions of ``subject``, with records of other key
    types (skipped) and a version registered then deleted for good (tombstone)."""

    def key(keytype: str, **fields: Any) -> bytes:
        return json.dumps({"keytype": keytype, **fields, "magic": 1 if keytype == "SCHEMA" else 0}).encode()

    gone = storage_record(subject, 3, 40, {"type": "record", "name": "Gone", "fields": []})
    return [
        (key("NOOP"), None),
        (key("CONFIG", subject=subject), json.dumps({"compatibilityLevel": "BACKWARD"}).encode()),
        storage_record(subject, 1, V1_ID, V1),
        storage_record("other-value", 1, 3, {"type": "string"}),
        storage_record(subject, 2, V2_ID, V2),
        storage_record(subject.removesuffix("-value") + "-key", 1, KEY_ID, KEY),
        gone,
        (gone[0], None),  # deleted for good
    ]


class Written:
    def __init__(self, topic: str, schemas_topic: str, config: Path) -> None:
        self.topic, self.schemas_topic, self.config = topic, schemas_topic, config
        self.values: dict[int, bytes | None] = {}
        self.expected: dict[int, dict[str, Any] | None] = {}  # offset -> fields; None: a value that gives none
        self.errors: dict[int, str | None] = {}
        self.keys: dict[int, bytes] = {}
        self.key_expected: dict[int, str | None] = {}  # None: a key that gives none (not framed)


@pytest.fixture(scope="module")
def written(stack: Endpoints, tmp_path_factory: pytest.TempPathFactory) -> Written:
    topic = create_topic(stack.bootstrap, internal_segment_bytes=64 * 1024)
    schemas_topic = registry_storage_topic(stack.bootstrap, schema_records(f"{topic}-value"))
    producer = Producer({"bootstrap.servers": stack.bootstrap, "linger.ms": 5, "batch.size": 16384})  # < a segment
    out = Written(topic, schemas_topic, write_config(stack, tmp_path_factory.mktemp("avro"),
                                                     schema_registry={"topic": schemas_topic}))  # fmt: skip
    subject = f"{topic}-value"

    key_schema = fastavro.parse_schema(KEY)
    sent = itertools.count()

    def add(value: bytes | None, expected: dict[str, Any] | None, error: str | None) -> None:
        n = next(sent)
        key = b"raw key" if n % 500 == 11 else framed_with(KEY_ID, key_schema, f"k-{n}")
        key_expected = None if n % 500 == 11 else f"k-{n}"

        def report(err: object, msg: Any) -> None:
            assert err is None, err
            out.values[msg.offset()], out.expected[msg.offset()], out.errors[msg.offset()] = value, expected, error
            out.keys[msg.offset()], out.key_expected[msg.offset()] = key, key_expected

        producer.produce(topic, key=key, value=value, on_delivery=report)

    for n in range(6_000):
        version = 1 if n < 3_000 else 2
        doc = record(n, version)
        if n % 500 == 7:
            add(b"plain text, not framed", None, NOT_FRAMED)
        elif n % 500 == 8:
            unknown = f"schema id {UNKNOWN_ID} is not a version of subject {subject}"
            add(framed(UNKNOWN_ID, V1 if version == 1 else V2, doc), None, unknown)
        elif n % 500 == 9:
            add(framed(V2_ID, V2, doc)[:12], None, f"does not decode with schema id {V2_ID}")
        elif n % 500 == 10:
            add(None, {f: None for f in FIELDS}, None)
        else:
            add(framed(V1_ID if version == 1 else V2_ID, V1 if version == 1 else V2, doc), doc, None)
        if n % 1000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0
    enable_and_tier(out.config, topic)
    return out


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    yield from local_spark("avro export tests")


def expected_row(doc: dict[str, Any] | None) -> dict[str, Any] | None:
    """The fields as a Parquet reader gives them back (maps as key/value pairs, the enum as its symbol)."""
    if doc is None:
        return None
    row = {f: doc.get(f) for f in FIELDS if f != "value_offset"}
    row["value_offset"] = doc.get("offset")
    row["attrs"] = list(doc["attrs"].items()) if doc.get("attrs") is not None else None
    if isinstance(row["at"], datetime.datetime):
        row["at"] = row["at"].replace(tzinfo=None)  # Spark's timestamp is UTC, written without a zone
    return row


def check(path: str, fmt: str, written: Written, last: int) -> None:
    rows = {r["offset"]: r for r in exported_rows(path, fmt, ["offset", *FIELDS, "_corrupt", "_error"])}
    assert sorted(rows) == [o for o in sorted(written.values) if o <= last], "an offset is missing or extra"
    versions = Counter("note" in (written.expected[o] or {"note": 0}) for o in rows)
    assert versions[False] > 2_500 and versions[True] > 1_000, f"too few records of a version exported: {versions}"
    for offset, row in rows.items():
        want = expected_row(written.expected[offset])
        got = {f: row[f] for f in FIELDS}
        if want is not None:
            if isinstance(got["at"], datetime.datetime):
                got["at"] = got["at"].replace(tzinfo=None)
            got["attrs"] = sorted(got["attrs"]) if got["attrs"] is not None else None
            want["attrs"] = sorted(want["attrs"]) if want["attrs"] is not None else None
            assert got == want, f"offset {offset}: {got} != {want}"
            assert row["_corrupt"] is None and row["_error"] is None, offset
        else:
            assert all(v is None for v in got.values()), f"offset {offset}: fields from a value that gives none"
            assert row["_error"] == written.errors[offset], offset
            assert row["_corrupt"] == written.values[offset], f"offset {offset}: its bytes are not kept"
    errors = {o for o, e in written.errors.items() if e is not None and o <= last}
    assert errors and {o for o, r in rows.items() if r["_error"] is not None} == errors


def check_keys(path: str, fmt: str, written: Written) -> None:
    """String keys in the wire format as one typed ``key`` column; the keys that are not framed in
    ``_key_corrupt`` with the reason in ``_key_error``."""
    bad = 0
    for row in exported_rows(path, fmt, ["offset", "key", "_key_corrupt", "_key_error"]):
        want = written.key_expected[row["offset"]]
        if want is None:
            bad += 1
            assert row["key"] is None and row["_key_error"] == NOT_FRAMED, row
            assert row["_key_corrupt"] == written.keys[row["offset"]]
        else:
            assert (row["key"], row["_key_corrupt"], row["_key_error"]) == (want, None, None), row
    assert bad > 5, "no key that gives none was exported"


def test_the_storage_topic_and_the_rest_api_give_the_same_versions(written: Written, stack: Endpoints) -> None:
    subject = f"{written.topic}-value"
    from_topic = schemas_from_topic(stack.bootstrap, {}, written.schemas_topic).versions(subject)
    assert [(s.version, s.id) for s in from_topic] == [(1, V1_ID), (2, V2_ID)], "the tombstoned version is not gone"
    client = SchemaRegistryClient.new_client({"url": "mock://export-test"})
    for schema in (V1, V2):
        client.register_schema(subject, Schema(json.dumps(schema), "AVRO"))
    from_rest = schemas_from_registry({"url": "mock://export-test"}, [subject, "no-such-value"], client=client)
    assert [json.loads(s.schema) for s in from_rest.versions(subject)] == [V1, V2]
    assert from_rest.versions("no-such-value") == []


def test_avro_values_become_typed_columns_in_parquet(written: Written, spark: SparkSession, tmp_path: Path) -> None:
    subject = f"{written.topic}-value"
    cfg = settings(written.config)
    versions = schemas_from_topic(cfg.bootstrap_servers, {}, written.schemas_topic).versions(subject)
    keys = schemas_from_topic(cfg.bootstrap_servers, {}, written.schemas_topic).versions(f"{written.topic}-key")
    request = ExportRequest(topic=written.topic, format="parquet", path=str(tmp_path / "pq"),
                            store=cfg.remote_storage, value_format="avro", value_schemas=tuple(versions),
                            key_format="avro", key_schemas=tuple(keys))  # fmt: skip
    result = run_export(spark, request)
    (rng,) = result.ranges
    check(str(tmp_path / "pq"), "parquet", written, rng.last)
    check_keys(str(tmp_path / "pq"), "parquet", written)
    schema = dict(spark.read.parquet(str(tmp_path / "pq")).dtypes)
    assert schema["amount"] == "decimal(10,2)" and schema["day"] == "date" and schema["at"] == "timestamp"
    assert schema["attrs"] == "map<string,bigint>" and schema["tags"] == "array<string>"
    assert "value" not in schema and schema["_corrupt"] == "binary" and schema["key"] == "string"


def test_the_cli_exports_avro_to_delta_from_the_registry_topic(written: Written, tmp_path: Path) -> None:
    path = tmp_path / "delta"
    summary = cli_export(written.topic, "delta", path, written.config, "--value-format", "avro", "--key-format", "avro")
    check(str(path), "delta", written, summary["ranges"]["0"][1])
    check_keys(str(path), "delta", written)


def test_a_subject_the_registry_does_not_know_is_one_sentence_before_spark(written: Written) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "tiering", "export", written.topic, "--path", "/tmp/never", "--value-format", "avro",
         "--value-subject", "nobody-value", "--config", str(written.config)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 1
    assert f"subject nobody-value has no schema in the schema registry (topic {written.schemas_topic})" in run.stderr
    assert "Traceback" not in run.stderr
