"""Schemas of a Confluent-compatible schema registry, by id and by subject, read once per export.

Two sources, one answer (``SchemaCatalog``):
- the registry's REST API (``schemas_from_registry``), through confluent-kafka's client: basic auth, TLS and
  the rest of its settings as that client names them (``basic.auth.user.info``, ``ssl.ca.location``...);
- the registry's own storage topic (``schemas_from_topic``, default ``_schemas``), where a Spark cluster
  cannot reach a registry: the format Confluent's registry and Karapace both keep. Each record's key is JSON
  ``{"keytype": "SCHEMA", "subject": ..., "version": ...}`` and its value the registered schema as JSON
  (``id``, ``schema``, ``schemaType`` (absent for Avro), ``references``, ``deleted``), or null when the version
  was deleted for good. Records of other key types (CONFIG, MODE, NOOP, DELETE_SUBJECT ...) say nothing about a
  schema's text and are skipped. A soft-deleted version stays: records written with it still decode.

The wire format of a record written with a registry's serializer: magic byte 0, the schema id as a
big-endian int32, then (Protobuf only) the message indexes, then the payload.

A schema may import others (a Protobuf ``import``, an Avro named type, a JSON Schema ``$ref``) registered under
subjects of their own: its ``references`` name them (the import's name, the subject, the version), and
``SchemaCatalog.versions`` hands each version over with the texts it imports, its references' references
included (``RegisteredSchema.imports``).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition
from pydantic import BaseModel, ConfigDict, Field, SecretStr

from tiering_core.errors import ConfigError, TieringError

SCHEMAS_TOPIC = "_schemas"
MAGIC = 0
HEADER_BYTES = 5  # magic byte and schema id


class SchemaRegistrySettings(BaseModel):
    """``schema_registry`` in the settings: where an export finds the schemas of registry-framed values."""

    model_config = ConfigDict(extra="forbid")

    url: str | None = Field(default=None, description="The registry's REST API (https://registry:8081); unset: "
                            "the schemas are read from its storage topic on the Kafka cluster.")  # fmt: skip
    basic_auth_user_info: SecretStr | None = Field(default=None, description="user:password for basic auth.")
    ssl_ca_location: str | None = None
    ssl_certificate_location: str | None = None
    ssl_key_location: str | None = None
    topic: str = Field(default=SCHEMAS_TOPIC, description="The registry's storage topic, read when url is unset.")

    def client_config(self) -> dict[str, str]:
        """The REST client's configuration, as confluent-kafka's SchemaRegistryClient names it."""
        config = {"url": self.url or ""}
        if self.basic_auth_user_info is not None:
            config["basic.auth.user.info"] = self.basic_auth_user_info.get_secret_value()
        for name in ("ssl_ca_location", "ssl_certificate_location", "ssl_key_location"):
            if getattr(self, name) is not None:
                config[name.replace("_", ".")] = getattr(self, name)
        return config


# the export's name for each registry schema type (``--value-format``)
EXPORT_FORMATS = {"AVRO": "avro", "JSON": "json-schema", "PROTOBUF": "protobuf"}
DECODED_FORMATS = ("avro", "json-schema", "protobuf")


def export_format(subject: str, versions: Iterable[RegisteredSchema], asked: str) -> str:
    """How an export decodes values of ``subject``: ``asked`` (avro, json-schema, protobuf), or with ``auto`` the
    schema type of its versions (a registry refuses to change a subject's type under its compatibility rules).
    Raises ConfigError, before any work, when the subject has no schema of that type or mixes types under
    ``auto``."""
    kinds = sorted({EXPORT_FORMATS.get(v.schema_type, v.schema_type.lower()) for v in versions})
    chosen = asked
    if asked == "auto":
        if len(kinds) != 1:
            raise ConfigError(f"subject {subject} has versions of several schema types ({', '.join(kinds)}): "
                              "name the one to decode with --value-format or --key-format")  # fmt: skip
        chosen = kinds[0]
    if chosen not in kinds:
        raise ConfigError(f"subject {subject} has no {chosen} schema in the registry (its versions: "
                          f"{', '.join(kinds) or 'none'})")  # fmt: skip
    if chosen not in DECODED_FORMATS:
        raise ConfigError(f"subject {subject} holds {chosen} schemas, which the export does not decode yet: "
                          "export these bytes as they are (binary)")  # fmt: skip
    return chosen


class SchemaRegistryError(TieringError):
    """The registry, or its storage topic, could not be read or holds something that is not a schema record
    (the message names where). Nothing was exported."""


@dataclass(frozen=True)
class SchemaReference:
    name: str  # how the schema imports it (a Protobuf import's file name)
    subject: str
    version: int


@dataclass(frozen=True)
class RegisteredSchema:
    id: int
    subject: str
    version: int
    schema_type: str  # AVRO, PROTOBUF or JSON, as the registry names them
    schema: str
    deleted: bool = False
    references: tuple[SchemaReference, ...] = ()
    imports: tuple[tuple[str, str], ...] = ()  # (name, schema text) of every schema it imports, set by the catalog


class SchemaCatalog:
    """Registered schemas by id and by subject."""

    def __init__(self, schemas: Iterable[RegisteredSchema]) -> None:
        self._by_subject: dict[str, dict[int, RegisteredSchema]] = {}
        self._by_id: dict[int, RegisteredSchema] = {}
        for schema in schemas:
            self._by_subject.setdefault(schema.subject, {})[schema.version] = schema
            self._by_id.setdefault(schema.id, schema)

    def by_id(self, schema_id: int) -> RegisteredSchema | None:
        return self._by_id.get(schema_id)

    def versions(self, subject: str) -> list[RegisteredSchema]:
        """The subject's versions, oldest first (soft-deleted ones included: their records still decode), each
        with the texts of the schemas it imports. Raises SchemaRegistryError for a reference to a version the
        registry does not hold."""
        versions = self._by_subject.get(subject, {})
        return [replace(versions[v], imports=tuple(self._imports(versions[v]).items())) for v in sorted(versions)]

    def _imports(self, schema: RegisteredSchema) -> dict[str, str]:
        found: dict[str, str] = {}
        pending = list(schema.references)
        while pending:
            ref = pending.pop()
            if ref.name in found:
                continue
            target = self._by_subject.get(ref.subject, {}).get(ref.version)
            if target is None:
                raise SchemaRegistryError(f"schema id {schema.id} (subject {schema.subject} version {schema.version}) "
                                          f"imports {ref.name} as subject {ref.subject} version {ref.version}, "
                                          "which the registry does not hold")  # fmt: skip
            found[ref.name] = target.schema
            pending.extend(target.references)
        return found


def schemas_from_topic(bootstrap: str, client_config: Mapping[str, str] | None = None,
                       topic: str = SCHEMAS_TOPIC, timeout: float = 30.0) -> SchemaCatalog:  # fmt: skip
    """Every schema the registry's storage ``topic`` holds, read from its start to its end as of now."""
    consumer = Consumer({
        "bootstrap.servers": bootstrap, **(client_config or {}), "group.id": f"tiering-schemas-{uuid.uuid4().hex}",
        "enable.auto.commit": False, "enable.partition.eof": True, "auto.offset.reset": "earliest",
    })  # fmt: skip
    try:
        metadata = consumer.list_topics(topic, timeout=timeout).topics.get(topic)
        if metadata is None or metadata.error is not None:
            why = metadata.error.str() if metadata is not None and metadata.error is not None else "not found"
            raise SchemaRegistryError(f"the schema registry's topic {topic} at {bootstrap}: {why}")
        ends = {}
        for partition in metadata.partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=timeout)
            if high > low:
                ends[partition] = high
        consumer.assign([TopicPartition(topic, p, 0) for p in ends])
        records: dict[tuple[str, int], RegisteredSchema | None] = {}
        while ends:
            message = consumer.poll(timeout)
            if message is None:
                raise SchemaRegistryError(f"reading {topic} at {bootstrap}: no record within {timeout:.0f}s")
            error = message.error()
            if error is not None:
                if error.code() != KafkaError._PARTITION_EOF:
                    raise SchemaRegistryError(f"reading {topic} at {bootstrap}: {error.str()}")
                ends.pop(message.partition(), None)
                continue
            _apply(records, message.key(), message.value(), f"{topic}-{message.partition()}@{message.offset()}")
            if message.offset() + 1 >= ends.get(message.partition(), 0):
                ends.pop(message.partition(), None)
        return SchemaCatalog(s for s in records.values() if s is not None)
    finally:
        consumer.close()


def _apply(records: dict[tuple[str, int], RegisteredSchema | None], key: bytes | None, value: bytes | None,
           where: str) -> None:  # fmt: skip
    try:
        parsed_key = json.loads(key) if key else None
        if not isinstance(parsed_key, dict) or parsed_key.get("keytype") != "SCHEMA":
            return
        subject, version = str(parsed_key["subject"]), int(parsed_key["version"])
        if value is None:
            records[(subject, version)] = None  # deleted for good
            return
        doc: dict[str, Any] = json.loads(value)
        records[(subject, version)] = RegisteredSchema(
            id=int(doc["id"]), subject=subject, version=version, schema_type=str(doc.get("schemaType", "AVRO")),
            schema=str(doc["schema"]), deleted=bool(doc.get("deleted", False)),
            references=tuple(SchemaReference(str(r["name"]), str(r["subject"]), int(r["version"]))
                             for r in doc.get("references") or ()),
        )  # fmt: skip
    except (ValueError, KeyError, TypeError) as exc:
        raise SchemaRegistryError(f"{where} is not a schema registry record: {type(exc).__name__}: {exc}") from None


def schemas_from_registry(config: Mapping[str, str], subjects: Iterable[str], client: Any = None) -> SchemaCatalog:
    """The versions of ``subjects`` from the registry's REST API; ``config`` as confluent-kafka's
    ``SchemaRegistryClient`` takes it (``url``, ``basic.auth.user.info``, ``ssl.ca.location`` ...). ``client``:
    a client made already (confluent-kafka's in-process ``mock://`` registry keeps its schemas per client)."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.error import SchemaRegistryError as ClientError

    if not config.get("url"):
        raise ConfigError("schema_registry.url is not set")
    client = client or SchemaRegistryClient.new_client(dict(config))
    found: dict[tuple[str, int], RegisteredSchema] = {}
    wanted: list[tuple[str, int | None]] = [(subject, None) for subject in subjects]  # None: every version
    while wanted:
        subject, only = wanted.pop()
        try:
            for version in client.get_versions(subject) if only is None else [only]:
                if (subject, version) in found:
                    continue
                registered = client.get_version(subject, version)
                schema = registered.schema
                references = tuple(SchemaReference(r.name, r.subject, r.version) for r in schema.references or ())
                found[(subject, version)] = RegisteredSchema(
                    id=registered.schema_id, subject=subject, version=registered.version,
                    schema_type=schema.schema_type or "AVRO", schema=schema.schema_str, references=references,
                )  # fmt: skip
                wanted.extend((r.subject, r.version) for r in references)  # the schemas it imports
        except ClientError as exc:
            if exc.http_status_code == 404 and only is None:
                continue  # no such subject: its records' schema ids are unknown, reported per record
            raise SchemaRegistryError(f"the schema registry at {config['url']}, subject {subject}: {exc}") from exc
        except Exception as exc:  # the client's transport errors (httpx) name the address
            raise SchemaRegistryError(f"the schema registry at {config['url']}: {type(exc).__name__}: {exc}") from exc
    return SchemaCatalog(found.values())
