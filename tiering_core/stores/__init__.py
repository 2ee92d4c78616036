"""Remote object stores behind one small interface: S3 (and compatible) and a local filesystem."""

from tiering_core.stores.base import (
    IncompleteUpload,
    ObjectNotFound,
    RemoteStore,
    RemoteStoreError,
    StoreUnavailable,
)
from tiering_core.stores.config import FileSystemStoreConfig, S3StoreConfig, StoreConfig
from tiering_core.stores.factory import open_store
from tiering_core.stores.filesystem import FileSystemStore
from tiering_core.stores.prefixed import PrefixedStore
from tiering_core.stores.s3 import S3Store

__all__ = [
    "FileSystemStore",
    "FileSystemStoreConfig",
    "IncompleteUpload",
    "ObjectNotFound",
    "PrefixedStore",
    "RemoteStore",
    "RemoteStoreError",
    "S3Store",
    "S3StoreConfig",
    "StoreConfig",
    "StoreUnavailable",
    "open_store",
]
