"""A RemoteStore over a local directory (the embedded default, and for tests).

Objects are files under ``root``; a put writes a temp file (``.<name>.<pid>.tmp`` beside the object),
fsyncs it and renames it into place, so a reader never sees a partial object. A temp file a crash left
is an incomplete upload, aborted by deleting it.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

import crc32c

from tiering_core.stores.base import IncompleteUpload, ObjectNotFound, Part, RemoteStoreError, consecutive_parts

_CHUNK = 1 << 20
_TMP = ".tmp"


class FileSystemStore:
    def __init__(self, root: Path, part_size: int = 8 << 20) -> None:
        self.root = Path(root)
        self.endpoint = f"file://{self.root}"
        self.part_size = part_size  # the window a copy validates at a time (small in tests: many windows)

    def _path(self, key: str) -> Path:
        path = (self.root / key).resolve()
        if not path.is_relative_to(self.root.resolve()):
            raise RemoteStoreError(f"key {key!r} escapes the store root {self.root}")
        return path

    def _files(self) -> Iterator[tuple[str, str]]:
        """(key of the directory, with its trailing /; file name) of every file under the root."""
        for dirpath, _, files in os.walk(self.root):
            relative = Path(dirpath).relative_to(self.root).as_posix()
            directory = "" if relative == "." else f"{relative}/"
            for name in files:
                yield directory, name

    def put_file(self, key: str, fileobj: BinaryIO, length: int) -> None:
        def chunks() -> Iterator[bytes]:
            remaining = length
            while remaining > 0:
                chunk = fileobj.read(min(_CHUNK, remaining))
                if not chunk:
                    raise RemoteStoreError(f"source for {key} ended {remaining} bytes early")
                remaining -= len(chunk)
                yield chunk

        self._write(key, chunks())

    def put_parts(self, key: str, fd: int, length: int, parts: Iterable[Part]) -> None:
        """Each part is read again and checked against its CRC-32C as it is written, as S3 checks it."""

        def chunks() -> Iterator[bytes]:
            for part in consecutive_parts(key, parts, length, self.part_size):
                data = os.pread(fd, part.size, part.offset)
                if len(data) != part.size or crc32c.crc32c(data) != part.crc32c:
                    where = f"bytes {part.offset}-{part.offset + part.size - 1}"
                    raise RemoteStoreError(f"upload of {key}: {where} read back differently from the CRC-32C given")
                yield data

        self._write(key, chunks())

    def _write(self, key: str, chunks: Iterable[bytes]) -> None:
        """Write the chunks to a temp file, fsync it and rename it into place (none on failure)."""
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}{_TMP}")
        try:
            with tmp.open("wb") as out:
                for chunk in chunks:
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
            tmp.replace(path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def put_bytes(self, key: str, data: bytes) -> None:
        self.put_file(key, io.BytesIO(data), len(data))

    def read_range(self, key: str, start: int, end: int) -> bytes:
        return self.get_range(key, start, end)

    def read_url(self, key: str, seconds: int) -> str:
        return self._path(key).as_uri()  # no expiry: the reader has the files' permissions or it has not

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
        keys = (directory + name for directory, name in self._files() if not name.startswith("."))
        return sorted(key for key in keys if key.startswith(prefix))

    def incomplete_uploads(self, prefix: str) -> list[IncompleteUpload]:
        """Temp files of puts that never renamed them into place, to keys under ``prefix``."""
        found = []
        for directory, name in self._files():
            if name.startswith(".") and name.endswith(_TMP):
                key = directory + name[1:].removesuffix(_TMP).rsplit(".", 1)[0]
                if key.startswith(prefix):
                    mtime = os.stat(self.root / directory / name).st_mtime_ns // 1_000_000
                    found.append(IncompleteUpload(key, name, mtime))
        return found

    def abort_upload(self, upload: IncompleteUpload) -> None:
        self._path(upload.key).with_name(upload.upload_id).unlink(missing_ok=True)

    def delete(self, keys: Iterable[str]) -> None:
        for key in keys:
            self._path(key).unlink(missing_ok=True)
