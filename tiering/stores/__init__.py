"""Remote object stores behind one small interface: S3 (and compatible) and a local filesystem."""

from tiering.stores.base import ObjectNotFound, RemoteStore, RemoteStoreError, StoreUnavailable
from tiering.stores.config import FileSystemStoreConfig, S3StoreConfig, StoreConfig
from tiering.stores.factory import open_store
from tiering.stores.filesystem import FileSystemStore
from tiering.stores.s3 import S3Store

__all__ = [
    "FileSystemStore",
    "FileSystemStoreConfig",
    "ObjectNotFound",
    "RemoteStore",
    "RemoteStoreError",
    "S3Store",
    "S3StoreConfig",
    "StoreConfig",
    "StoreUnavailable",
    "open_store",
]
