"""A RemoteStore over a local directory (the embedded default, and for tests).

Objects are files under ``root``; a put writes a temp file, fsyncs it and renames it into place, so
a reader never sees a partial object.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO

from tiering_core.stores.base import ObjectNotFound, RemoteStoreError

_CHUNK = 1 << 20


class FileSystemStore:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.endpoint = f"file://{self.root}"

    def _path(self, key: str) -> Path:
        path = (self.root / key).resolve()
        if not path.is_relative_to(self.root.resolve()):
            raise RemoteStoreError(f"key {key!r} escapes the store root {self.root}")
        return path

    def put_file(self, key: str, fileobj: BinaryIO, length: int) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            with tmp.open("wb") as out:
                remaining = length
                while remaining > 0:
                    chunk = fileobj.read(min(_CHUNK, remaining))
                    if not chunk:
                        raise RemoteStoreError(f"source for {key} ended {remaining} bytes early")
                    out.write(chunk)
                    remaining -= len(chunk)
                out.flush()
                os.fsync(out.fileno())
            tmp.replace(path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def put_path(self, key: str, path: str, length: int) -> None:
        with open(path, "rb") as f:
            self.put_file(key, f, length)

    def put_bytes(self, key: str, data: bytes) -> None:
        self.put_file(key, io.BytesIO(data), len(data))

    def get_range(self, key: str, start: int, end: int) -> bytes:
        try:
            with self._path(key).open("rb") as f:
                f.seek(start)
                return f.read(end - start + 1)
        except FileNotFoundError as exc:
            raise ObjectNotFound(key) from exc

    def get_bytes(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError as exc:
            raise ObjectNotFound(key) from exc

    def head(self, key: str) -> int | None:
        try:
            return self._path(key).stat().st_size
        except FileNotFoundError:
            return None

    def list_keys(self, prefix: str) -> list[str]:
        base = self.root
        found = []
        for dirpath, _, files in os.walk(base):
            for name in files:
                if name.startswith("."):
                    continue
                key = str(Path(dirpath, name).relative_to(base))
                if key.startswith(prefix):
                    found.append(key)
        return sorted(found)

    def delete(self, keys: Iterable[str]) -> None:
        for key in keys:
            self._path(key).unlink(missing_ok=True)
