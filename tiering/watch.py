"""Wake the sidecar when a broker rolls a segment.

watchdog reports new ``.log`` files in the broker's log dirs (a roll creates the next segment's
``.log``); because inotify events can be lost (queue overflow, a log dir remounted), the sidecar
also rescans everything every ``rescan_interval`` seconds. Events only say *which partitions* to
look at soon; the rescan is what guarantees nothing is missed. The sidecar steps only the partitions
an event names between its full rescans (see ``Sidecar.run_forever``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from pathlib import Path

from watchdog.events import FileCreatedEvent, FileMovedEvent, FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer

from tiering_core.logs import get_logger

log = get_logger(__name__)


class _RollHandler(FileSystemEventHandler):
    def __init__(self, watcher: SegmentWatcher) -> None:
        self.watcher = watcher

    def on_created(self, event: FileSystemEvent) -> None:
        self.watcher.notice(str(event.src_path))

    def on_moved(self, event: FileSystemEvent) -> None:
        self.watcher.notice(str(event.dest_path))


class SegmentWatcher:
    """Collects the partition directories in which a new segment appeared.

    ``wait(timeout)`` returns the set of partition directory names seen since the last call, or
    an empty set when the timeout (the rescan interval) passed first. Thread-safe.
    """

    def __init__(self, log_dirs: Iterable[Path]) -> None:
        self.log_dirs = [Path(d) for d in log_dirs]
        self._dirty: set[str] = set()
        self._cond = threading.Condition()
        self._observer = Observer()

    def notice(self, path: str) -> None:
        p = Path(path)
        if p.suffix != ".log":
            return
        with self._cond:
            self._dirty.add(p.parent.name)
            self._cond.notify_all()

    def start(self) -> None:
        handler = _RollHandler(self)
        for d in self.log_dirs:
            if d.is_dir():
                # creations and renames only: inotify then never reports the appends (IN_MODIFY) that every
                # produced batch makes to a partition's active segment, thousands a second on a busy broker
                self._observer.schedule(
                    handler, str(d), recursive=True, event_filter=[FileCreatedEvent, FileMovedEvent]
                )
            else:
                log.warning("log dir does not exist; only rescans will find it", log_dir=str(d))
        self._observer.start()

    def wait(self, timeout: float) -> set[str]:
        with self._cond:
            if not self._dirty:
                self._cond.wait(timeout)
            dirty, self._dirty = self._dirty, set()
            return dirty

    def wake(self) -> None:
        """Make a pending ``wait`` return now (used on shutdown and by CLI-triggered rescans)."""
        with self._cond:
            self._cond.notify_all()

    def stop(self) -> None:
        self._observer.stop()
        self._observer.join(timeout=5)
        self.wake()
