"""The settings every part of the project shares: which Kafka cluster, how its clients log in, where the remote
copies are and the metadata WAL topic. Declared once here; the sidecar's, the readers' and the proxy's settings
extend them, so one file (and one set of ``TIERING_*`` variables) configures them all alike."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from tiering_core.kafka_client import KafkaClientProperties
from tiering_core.schema_registry import SchemaRegistrySettings
from tiering_core.stores.config import FileSystemStoreConfig, StoreConfig


class ClusterSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TIERING_", env_nested_delimiter="__")

    bootstrap_servers: str = Field(
        description="Kafka bootstrap servers (for a sidecar, its local broker is enough; readers: the cluster whose "
        "topics they read)."
    )
    kafka_client: KafkaClientProperties = Field(
        default_factory=dict,
        description="librdkafka properties for every Kafka client (security.protocol, sasl.mechanism, sasl.username, "
        "sasl.password, ssl.ca.location...); env TIERING_KAFKA_CLIENT__SASL_PASSWORD (_ for .).",
    )
    remote_storage: StoreConfig = Field(
        default_factory=lambda: FileSystemStoreConfig(root=Path("/var/lib/tiering/remote")),
        description="Where segments go: kind s3 (bucket, prefix, endpoint_url...) or filesystem (root); readers give "
        "the sidecars' settings.",
    )
    metadata_topic: str = Field(default="__tiering_metadata", description="The sidecars' metadata WAL topic.")
    schema_registry: SchemaRegistrySettings = Field(
        default_factory=SchemaRegistrySettings,
        description="Where `tiering export --value-format avro` finds the values' schemas: url (REST API, basic "
        "auth, TLS) or, unset, the registry's storage topic (_schemas) on this Kafka cluster.",
    )
