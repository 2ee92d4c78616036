"""Metadata snapshots kept in the remote object store (under the cluster's key prefix, which the store applies).

``SnapshotStore`` (metadata/snapshot.py) is the protocol; this is its implementation over a
``tiering_core`` RemoteStore, used by the sidecar (which writes them) and by readers (which only
recover from them, without a sidecar).
"""

from __future__ import annotations

from pathlib import Path

from tiering_core.stores.base import ObjectNotFound, RemoteStore


class StoreSnapshots:
    """Snapshot files as objects ``<key>``: ``metadata-snapshots/<WAL topic>/<file>``."""

    def __init__(self, store: RemoteStore) -> None:
        self.store = store

    def put_file(self, key: str, path: Path) -> None:
        with path.open("rb") as f:
            self.store.put_file(key, f, path.stat().st_size)

    def get_file(self, key: str, path: Path) -> None:
        try:
            path.write_bytes(self.store.get_bytes(key))
        except ObjectNotFound as exc:
            raise FileNotFoundError(key) from exc

    def list_keys(self, prefix: str) -> list[str]:
        return sorted(self.store.list_keys(f"{prefix}/"))

    def delete(self, key: str) -> None:
        self.store.delete([key])


def snapshot_prefix(metadata_topic: str) -> str:
    """Where the snapshots of one WAL topic live (relative to the cluster's prefix)."""
    return f"metadata-snapshots/{metadata_topic}"
