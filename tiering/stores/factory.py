"""Build the configured remote store."""

from __future__ import annotations

from tiering.stores.base import RemoteStore
from tiering.stores.config import FileSystemStoreConfig, S3StoreConfig
from tiering.stores.filesystem import FileSystemStore
from tiering.stores.s3 import S3Store


def open_store(config: S3StoreConfig | FileSystemStoreConfig) -> RemoteStore:
    if isinstance(config, FileSystemStoreConfig):
        return FileSystemStore(config.root)
    return S3Store(config)
