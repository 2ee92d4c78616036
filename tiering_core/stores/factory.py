"""Build the configured remote store."""

from __future__ import annotations

from tiering_core.stores.base import RemoteStore
from tiering_core.stores.config import AnyStoreConfig, FileSystemStoreConfig
from tiering_core.stores.filesystem import FileSystemStore
from tiering_core.stores.s3 import S3Store


def open_store(config: AnyStoreConfig) -> RemoteStore:
    if isinstance(config, FileSystemStoreConfig):
        return FileSystemStore(config.root)
    return S3Store(config)
