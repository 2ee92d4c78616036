"""JSON Schema values in the schema registry's wire format exported as typed columns (issue 28, part 1).

As for Avro (test_export_avro.py): the schemas are written into a registry storage topic on the real Kafka in
the format Confluent's registry and Karapace keep, here with ``schemaType: JSON``; the values are JSON texts in
the wire format (magic byte 0, the schema id, the text), in two versions of one subject (the second adds a
property and drops one), with values that are not framed, name an unknown schema id, are not JSON, hold a
string where the schema has a number, or are not UTF-8. The tables are read back with pyarrow, DuckDB and
deltalake: every field of every record equal to what was produced; the columns' types come from the schemas,
not from the data.
"""

from __future__ import annotations

import datetime
import itertools
import json
import struct
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
from tests.registry_rows import FramedValues, check_decoded
from tests.sidecar_harness import settings, write_config
from tiering.bench.registry_values import storage_record
from tiering_core.schema_registry import schemas_from_topic

pytestmark = [pytest.mark.integration, pytest.mark.slow]

V1 = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "title": "Order",
    "type": "object",
    "required": ["id"],
    "definitions": {"ship": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "integer"}}}},
    "properties": {
        "id": {"type": "integer"},
        "customer": {"type": "string"},
        "amount": {"type": "number"},
        "day": {"type": "string", "format": "date"},
        "at": {"type": "string", "format": "date-time"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "attrs": {"type": "object", "additionalProperties": {"type": "integer"}},
        "state": {"enum": ["NEW", "PAID", "SHIPPED"]},
        "ship": {"oneOf": [{"type": "null"}, {"$ref": "#/definitions/ship"}]},
        "offset": {"type": "integer"},  # named like a Kafka column: exported as value_offset
    },
}
V2 = json.loads(json.dumps(V1))
V2["properties"]["note"] = {"type": ["string", "null"]}
del V2["properties"]["tags"]  # dropped in version 2: null in its records
FIELDS = ["id", "customer", "amount", "day", "at", "tags", "attrs", "state", "ship", "value_offset", "note"]
V1_ID, V2_ID, UNKNOWN_ID, KEY_ID = 31, 32, 999, 33
KEY = {"type": "string"}


def framed(schema_id: int, doc: Any) -> bytes:
    return struct.pack(">bi", 0, schema_id) + json.dumps(doc).encode()


def record(n: int, version: int) -> dict[str, Any]:
    at = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC) + datetime.timedelta(seconds=n, milliseconds=n % 1000)
    doc: dict[str, Any] = {
        "id": n, "customer": f"c-{n % 17}", "amount": n / 100,
        "day": (datetime.date(2026, 1, 1) + datetime.timedelta(days=n % 300)).isoformat(),
        # RFC 3339 as writers send it: in UTC with Z, and with an offset
        "at": at.isoformat(timespec="milliseconds").replace("+00:00", "Z") if n % 2 else
        at.astimezone(datetime.timezone(datetime.timedelta(hours=2))).isoformat(timespec="milliseconds"),
        "tags": [f"t{i}" for i in range(n % 3)], "attrs": {f"k{i}": n * i for i in range(n % 2)},
        "state": ["NEW", "PAID", "SHIPPED"][n % 3],
        "ship": None if n % 4 == 0 else {"city": f"city-{n % 5}", "zip": 10_000 + n % 90},
        "offset": -n,
    }  # fmt: skip
    if n % 7 == 0:
        del doc["customer"]  # absent: null
    if version == 2:
        doc["note"] = None if n % 3 == 0 else f"note {n}"
        del doc["tags"]
    return doc


def expected_row(doc: dict[str, Any] | None) -> dict[str, Any] | None:
    """The fields as a Parquet reader gives them back (maps as key/value pairs, timestamps as UTC instants)."""
    if doc is None:
        return None
    row = {f: doc.get(f) for f in FIELDS if f != "value_offset"}
    row["value_offset"] = doc.get("offset")
    row["day"] = datetime.date.fromisoformat(doc["day"])
    row["at"] = datetime.datetime.fromisoformat(doc["at"]).astimezone(datetime.UTC)
    row["attrs"] = sorted(doc["attrs"].items())
    return row


class Written(FramedValues):
    def __init__(self, topic: str, config: Path) -> None:
        super().__init__(topic, config)
        self.keys: dict[int, str | None] = {}  # the key's text; None: a key that is not framed


@pytest.fixture(scope="module")
def written(stack: Endpoints, tmp_path_factory: pytest.TempPathFactory) -> Written:
    topic = create_topic(stack.bootstrap, internal_segment_bytes=64 * 1024)
    subject = f"{topic}-value"
    schemas_topic = registry_storage_topic(stack.bootstrap, [
        storage_record(subject, 1, V1_ID, V1, "JSON"), storage_record(subject, 2, V2_ID, V2, "JSON"),
        storage_record(f"{topic}-key", 1, KEY_ID, KEY, "JSON")])  # fmt: skip
    producer = Producer({"bootstrap.servers": stack.bootstrap, "linger.ms": 5, "batch.size": 16384})  # < a segment
    out = Written(topic, write_config(stack, tmp_path_factory.mktemp("json-schema"),
                                      schema_registry={"topic": schemas_topic}))  # fmt: skip
    sent = itertools.count()

    def add(value: bytes | None, expected: dict[str, Any] | None, error: str | None) -> None:
        n = next(sent)
        key_text = None if n % 500 == 11 else f"k-{n}"
        key = b"raw key" if key_text is None else framed(KEY_ID, key_text)

        def report(err: object, msg: Any) -> None:
            assert err is None, err
            out.values[msg.offset()], out.expected[msg.offset()], out.errors[msg.offset()] = value, expected, error
            out.keys[msg.offset()] = key_text

        producer.produce(topic, key=key, value=value, on_delivery=report)

    undecodable = f"does not decode with schema id {V2_ID}"
    for n in range(6_000):
        version = 1 if n < 3_000 else 2
        doc = record(n, version)
        schema_id = V1_ID if version == 1 else V2_ID
        if n % 500 == 7:
            add(json.dumps(doc).encode(), None, NOT_FRAMED)
        elif n % 500 == 8:
            add(framed(UNKNOWN_ID, doc), None, f"schema id {UNKNOWN_ID} is not a version of subject {subject}")
        elif n % 500 == 9:
            add(framed(V2_ID, doc)[:20], None, undecodable)  # not JSON: cut short
        elif n % 500 == 10:
            add(None, None, None)
        elif n % 500 == 12:
            add(framed(V2_ID, {**doc, "amount": "a lot"}), None, undecodable)  # a string for a number
        elif n % 500 == 13:
            add(framed(V2_ID, {})[:5] + b'{"id": "\xff\xfe"}', None, undecodable)  # not UTF-8
        else:
            add(framed(schema_id, doc), doc, None)
        if n % 1000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0
    enable_and_tier(out.config, topic)
    return out


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    yield from local_spark("json schema export tests")


def check(path: str, fmt: str, written: Written, last: int) -> None:
    rows = {r["offset"]: r for r in exported_rows(path, fmt, ["offset", *FIELDS, "_corrupt", "_error", "key",
                                                              "_key_corrupt", "_key_error"])}  # fmt: skip
    assert sum(1 for o in rows if "note" in (written.expected[o] or {})) > 1_000, "too few version 2 records"
    errors = check_decoded(rows, written, FIELDS, last, expected_row, _as_expected)
    for offset, row in rows.items():
        key = written.keys[offset]
        if key is None:
            assert (row["key"], row["_key_error"]) == (None, NOT_FRAMED), row
        else:
            assert (row["key"], row["_key_corrupt"], row["_key_error"]) == (key, None, None), row
    assert len({written.errors[o] for o in errors}) == 3, "not every kind of bad value was exported"


def _as_expected(got: dict[str, Any]) -> dict[str, Any]:
    if isinstance(got["at"], datetime.datetime) and got["at"].tzinfo is None:
        got = {**got, "at": got["at"].replace(tzinfo=datetime.UTC)}
    return {**got, "attrs": sorted(got["attrs"]) if got["attrs"] is not None else None}


def test_json_schema_values_become_typed_columns_in_parquet(written: Written, spark: SparkSession,
                                                           tmp_path: Path) -> None:  # fmt: skip
    cfg = settings(written.config)
    catalog = schemas_from_topic(cfg.bootstrap_servers, {}, cfg.schema_registry.topic)
    values, keys = catalog.versions(f"{written.topic}-value"), catalog.versions(f"{written.topic}-key")
    request = ExportRequest(topic=written.topic, format="parquet", path=str(tmp_path / "pq"),
                            store=cfg.remote_storage, value_format="json-schema", value_schemas=tuple(values),
                            key_format="json-schema", key_schemas=tuple(keys))  # fmt: skip
    result = run_export(spark, request)
    (rng,) = result.ranges
    check(str(tmp_path / "pq"), "parquet", written, rng.last)
    schema = dict(spark.read.parquet(str(tmp_path / "pq")).dtypes)
    assert (schema["id"], schema["amount"], schema["day"], schema["at"]) == ("bigint", "double", "date", "timestamp")
    assert schema["attrs"] == "map<string,bigint>" and schema["tags"] == "array<string>"
    assert schema["ship"] == "struct<city:string,zip:bigint>" and schema["state"] == "string"
    assert "value" not in schema and schema["_corrupt"] == "binary" and schema["key"] == "string"


def test_the_cli_exports_json_schema_values_to_delta_with_auto(written: Written, tmp_path: Path) -> None:
    path = tmp_path / "delta"
    summary = cli_export(written.topic, "delta", path, written.config, "--value-format", "auto", "--key-format", "auto")
    check(str(path), "delta", written, summary["ranges"]["0"][1])


def test_a_format_the_subject_does_not_hold_is_one_sentence_before_spark(written: Written) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "tiering", "export", written.topic, "--path", "/tmp/never", "--value-format", "avro",
         "--config", str(written.config)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 1
    assert f"subject {written.topic}-value has no avro schema in the registry (its versions: json-schema)" in run.stderr
    assert "Traceback" not in run.stderr and "SparkSession" not in run.stderr
