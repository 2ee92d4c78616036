"""An optional disk cache of downloaded windows, with a size cap (least recently used go first).

Each entry is one file named by a hash of (key, start, end), holding a CRC-32C of the bytes followed
by the bytes; an entry whose CRC does not match (a damaged disk, a cut write) is dropped and the
window is downloaded again. Writes go to a temp file renamed into place. The object keys contain the
copy's unique segment id, so an entry never goes stale: a new copy has new keys.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections import OrderedDict
from pathlib import Path

import crc32c

from tiering_core.logs import get_logger

log = get_logger(__name__)


class DiskCache:
    def __init__(self, directory: Path, capacity: int) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.capacity = capacity
        self.lock = threading.Lock()
        self.entries: OrderedDict[str, int] = OrderedDict()  # file name -> size, least recently used first
        self.size = 0
        for path in sorted(self.dir.glob("*.win"), key=lambda p: p.stat().st_mtime):
            self.entries[path.name] = path.stat().st_size
            self.size += path.stat().st_size
        for tmp in self.dir.glob("*.tmp"):
            tmp.unlink(missing_ok=True)
        self._evict()

    @staticmethod
    def _object(key: str) -> str:
        return hashlib.sha256(key.encode()).hexdigest()[:32]

    @classmethod
    def _name(cls, key: str, start: int, end: int) -> str:
        return f"{cls._object(key)}-{start}-{end}.win"

    def discard(self, key: str) -> None:
        """Drop every window of the object ``key``: a read found it damaged (what the store holds may be
        repaired, and a cached window must not keep the damage)."""
        prefix = self._object(key) + "-"
        with self.lock:
            names = [name for name in self.entries if name.startswith(prefix)]
        for name in names:
            self._drop(name)

    def contains(self, key: str, start: int, end: int) -> bool:
        with self.lock:
            return self._name(key, start, end) in self.entries

    def get(self, key: str, start: int, end: int) -> bytes | None:
        name = self._name(key, start, end)
        with self.lock:
            if name not in self.entries:
                return None
            self.entries.move_to_end(name)
        try:
            raw = (self.dir / name).read_bytes()
        except FileNotFoundError:
            raw = b""
        if len(raw) >= 4 and int.from_bytes(raw[:4], "big") == crc32c.crc32c(raw[4:]):
            return raw[4:]
        log.warning("dropping a damaged disk cache entry", key=key, start=start, end=end)
        self._drop(name)
        return None

    def put(self, key: str, start: int, end: int, data: bytes) -> None:
        if len(data) + 4 > self.capacity:
            return
        name = self._name(key, start, end)
        path = self.dir / name
        tmp = path.with_name(f"{name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            with tmp.open("wb") as f:
                f.write(crc32c.crc32c(data).to_bytes(4, "big"))
                f.write(data)
            tmp.replace(path)
        except OSError as exc:  # a full or failing disk only costs cache hits
            tmp.unlink(missing_ok=True)
            log.warning("disk cache write failed", error=str(exc))
            return
        with self.lock:
            self.size += len(data) + 4 - self.entries.pop(name, 0)
            self.entries[name] = len(data) + 4
            self._evict()

    def _drop(self, name: str) -> None:
        with self.lock:
            self.size -= self.entries.pop(name, 0)
        (self.dir / name).unlink(missing_ok=True)

    def _evict(self) -> None:
        while self.size > self.capacity and self.entries:
            name, size = self.entries.popitem(last=False)
            self.size -= size
            (self.dir / name).unlink(missing_ok=True)
