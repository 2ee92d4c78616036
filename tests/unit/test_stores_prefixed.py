"""The cluster's key prefix, applied inside the store: callers name keys under it, the backend holds them whole."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from tiering_core.stores import FileSystemStore, FileSystemStoreConfig, ObjectNotFound, PrefixedStore, open_store


def test_keys_are_put_listed_read_and_deleted_under_the_prefix_and_nowhere_else(tmp_path: Path) -> None:
    backend = FileSystemStore(tmp_path)
    backend.put_bytes("cluster-other/t-id/0/x.log", b"another cluster's")  # a neighbour whose prefix starts alike
    store = PrefixedStore(backend, "cluster")
    store.put_bytes("t-id/0/a.log", b"abc")
    store.put_file("t-id/0/b.log", io.BytesIO(b"defg"), 4)
    assert backend.get_bytes("cluster/t-id/0/a.log") == b"abc"
    assert store.list_keys("") == ["t-id/0/a.log", "t-id/0/b.log"]
    assert store.list_keys("t-id/0/b") == ["t-id/0/b.log"]
    assert store.get_range("t-id/0/b.log", 1, 2) == store.read_range("t-id/0/b.log", 1, 2) == b"ef"
    assert store.head("t-id/0/b.log") == 4 and store.head("t-id/0/x.log") is None
    store.delete(["t-id/0/a.log", "t-id/0/b.log"])
    assert store.list_keys("") == [] and backend.list_keys("") == ["cluster-other/t-id/0/x.log"]
    assert store.full_key("t-id/0/a.log") == "cluster/t-id/0/a.log"
    assert store.location == f"file://{tmp_path}/cluster"


def test_a_missing_object_is_named_by_the_backends_whole_key(tmp_path: Path) -> None:
    store = PrefixedStore(FileSystemStore(tmp_path), "cluster")
    with pytest.raises(ObjectNotFound, match=r"cluster/t-id/0/gone\.log") as missing:
        store.get_bytes("t-id/0/gone.log")
    assert missing.value.key == "cluster/t-id/0/gone.log"


def test_incomplete_uploads_are_listed_under_the_prefix_and_aborted_through_it(tmp_path: Path) -> None:
    backend = FileSystemStore(tmp_path)
    for key in ("cluster/t-id/0/a.log", "cluster-other/t-id/0/a.log"):  # temp files a killed put left
        (tmp_path / key).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / key).with_name(f".a.log.{os.getpid()}.tmp").write_bytes(b"part")
    store = PrefixedStore(backend, "cluster")
    [upload] = store.incomplete_uploads("")
    assert upload.key == "t-id/0/a.log"
    store.abort_upload(upload)
    assert store.incomplete_uploads("") == []
    assert [u.key for u in backend.incomplete_uploads("")] == ["cluster-other/t-id/0/a.log"]


def test_the_configured_store_applies_the_configured_prefix(tmp_path: Path) -> None:
    store = open_store(FileSystemStoreConfig(root=tmp_path, prefix="kafka-tiering"))
    store.put_bytes("metadata-snapshots/wal/1.tsnap", b"s")
    assert (tmp_path / "kafka-tiering" / "metadata-snapshots" / "wal" / "1.tsnap").read_bytes() == b"s"


def test_an_empty_prefix_keeps_the_keys_it_always_had_and_stays_under_them(tmp_path: Path) -> None:
    """Callers wrote ``f"{prefix}/{key}"``: with an empty prefix that is ``/key``. The store keeps it so, and a
    listing or sweep of the cluster's objects never reaches the rest of the bucket."""
    backend = FileSystemStore(tmp_path)
    backend.put_bytes("someone-else/data.bin", b"not ours")
    store = PrefixedStore(backend, "")
    assert store.full_key("t-id/0/a.log") == "/t-id/0/a.log"
    assert store.list_keys("") == []
