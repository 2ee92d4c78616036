"""Build the configured remote store."""

from __future__ import annotations

from tiering_core.stores.base import RemoteStore
from tiering_core.stores.config import AnyStoreConfig, FileSystemStoreConfig
from tiering_core.stores.filesystem import FileSystemStore
from tiering_core.stores.prefixed import PrefixedStore
from tiering_core.stores.s3 import S3Store


def open_store(config: AnyStoreConfig) -> PrefixedStore:
    """The configured backend, with every key under ``config.prefix`` (the caller names keys without it)."""
    backend: RemoteStore
    backend = FileSystemStore(config.root) if isinstance(config, FileSystemStoreConfig) else S3Store(config)
    return PrefixedStore(backend, config.prefix)
