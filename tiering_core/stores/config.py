"""Configuration of the remote store, embedded in the sidecar's settings."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, FilePath, SecretStr


class S3StoreConfig(BaseModel):
    """An S3 bucket (AWS or any S3-compatible server)."""

    model_config = ConfigDict(extra="forbid")  # a typo (buckt) is named, not silently dropped

    kind: Literal["s3"] = "s3"
    bucket: str
    prefix: str = Field(default="kafka-tiering", description="Key prefix of every object of this cluster.")
    endpoint_url: str | None = Field(default=None, description="For S3-compatible servers; None for AWS.")
    region: str | None = None
    path_style: bool = Field(default=False, description="Path-style addressing (most S3-compatible servers).")
    ca_bundle: FilePath | None = Field(
        default=None,
        description="PEM file of the CAs that sign an https endpoint's certificate (a private CA, a self-signed "
        "S3-compatible server); None: the system's CAs, or AWS_CA_BUNDLE's file when that is set.",
    )
    access_key_id: str | None = Field(default=None, description="None: the standard AWS credential chain.")
    secret_access_key: SecretStr | None = Field(default=None, description="Never shown in logs, errors or repr.")
    sse: Literal["AES256", "aws:kms"] | None = Field(default=None, description="Server-side encryption.")
    kms_key_id: str | None = None
    part_size: int = Field(default=8 << 20, ge=5 << 20, description="Multipart part size (S3 minimum 5 MiB).")
    max_concurrency: int = Field(default=8, ge=1, le=64, description="Parts in flight per upload.")
    connect_timeout: float = 5.0
    read_timeout: float = 60.0
    max_attempts: int = Field(default=5, ge=1, description="Attempts per request, with backoff (botocore).")

    def secret_key(self) -> str | None:
        """The secret access key itself, for boto3 only (a SecretStr everywhere else)."""
        return self.secret_access_key.get_secret_value() if self.secret_access_key is not None else None

    def bounded(self, connect_seconds: float, read_seconds: float, attempts: int) -> S3StoreConfig:
        """This store with requests that give up sooner (an operator's command, not the sidecar's patience)."""
        return self.model_copy(update={
            "connect_timeout": min(self.connect_timeout, connect_seconds),
            "read_timeout": min(self.read_timeout, read_seconds),
            "max_attempts": min(self.max_attempts, attempts),
        })  # fmt: skip


class FileSystemStoreConfig(BaseModel):
    """A directory (a mounted NFS/object gateway, or the embedded default for trials)."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["filesystem"] = "filesystem"
    root: Path
    prefix: str = "kafka-tiering"

    def secret_key(self) -> str | None:
        """No secret: a directory."""
        return None

    def bounded(self, connect_seconds: float, read_seconds: float, attempts: int) -> FileSystemStoreConfig:
        """A directory answers at once or fails: nothing to bound."""
        return self


STORE_CONFIGS = (S3StoreConfig, FileSystemStoreConfig)  # every backend's settings: a new one is added here
AnyStoreConfig = S3StoreConfig | FileSystemStoreConfig
StoreConfig = Annotated[AnyStoreConfig, Field(discriminator="kind")]
