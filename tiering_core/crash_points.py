"""Crash points: named places where a test makes the process die by SIGKILL, as a crash would there.

The crash soak (``tests/integration/test_sidecar_crash_soak.py``) runs ``tiering sidecar run`` with
``TIERING_CRASH_AT`` naming points and the hit of each on which to die, e.g. ``copy.part:2,sweep.orphans:1``:
the process kills itself the second time it reaches ``copy.part`` or the first time it reaches
``sweep.orphans``, whichever comes first (hits are counted from the process's start). Before dying it
appends ``<point>:<hit>`` to the file named by ``TIERING_CRASH_LOG`` (if set), so the test knows where.
Both variables are read once, at import; without ``TIERING_CRASH_AT`` a crash point returns at once.
"""

from __future__ import annotations

import os
import signal
import threading
from collections import Counter

from tiering_core.errors import ConfigError

POINTS = {
    "metadata.appended": "a record is durable in the metadata WAL, not applied here yet (its writer never learns)",
    "copy.started": "COPY_SEGMENT_STARTED is durable, nothing uploaded yet",
    "copy.part": "before the next part of the .log is read, validated and sent, the earlier ones gone out or in flight",
    "copy.log_uploaded": "the .log is uploaded (multipart completed), the .indexes not yet",
    "copy.indexes_uploaded": "the .indexes are uploaded, the manifest not yet",
    "copy.manifest_written": "every object is written, COPY_SEGMENT_FINISHED not yet",
    "copy.finished": "COPY_SEGMENT_FINISHED is durable",
    "local_retention.recorded": "LOCAL_LOG_START is durable, delete_records not asked yet",
    "local_retention.deleted": "delete_records answered",
    "delete.started": "DELETE_SEGMENT_STARTED is durable, the copy's objects not deleted yet",
    "delete.objects_deleted": "the copy's objects are deleted, DELETE_SEGMENT_FINISHED not yet",
    "sweep.orphans": "orphan objects found, not deleted yet",
    "sweep.upload_abort": "before a stale incomplete upload is aborted",
    "snapshot.written": "a snapshot's temp file is written and synced, not renamed into place yet",
    "snapshot.local": "the local snapshot is in place, its remote copy not written yet",
    "snapshot.remote": "the remote copy is written, old remote snapshots not pruned yet",
    "export.files_written": "an Iceberg export run's files are written, its snapshot not committed yet",
}


def parse(spec: str) -> dict[str, frozenset[int]]:
    """``point:hit[,point:hit...]`` as {point: hits}; ConfigError naming an unknown point or a bad hit."""
    armed: dict[str, set[int]] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        point, _, hit = item.partition(":")
        if point not in POINTS or not hit.isdigit() or int(hit) < 1:
            raise ConfigError(f"TIERING_CRASH_AT: {item!r} is not <point>:<hit >= 1> with a point of {sorted(POINTS)}")
        armed.setdefault(point, set()).add(int(hit))
    return {point: frozenset(hits) for point, hits in armed.items()}


_ARMED = parse(os.environ.get("TIERING_CRASH_AT", ""))
_LOG = os.environ.get("TIERING_CRASH_LOG")
_hits: Counter[str] = Counter()
_lock = threading.Lock()


def crash_point(point: str) -> None:
    """Die here by SIGKILL if ``TIERING_CRASH_AT`` arms this hit of ``point``; otherwise do nothing."""
    hits = _ARMED.get(point)
    if hits is None:
        return
    with _lock:
        _hits[point] += 1
        hit = _hits[point]
        if hit not in hits:
            return
        if _LOG is not None:
            fd = os.open(_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            os.write(fd, f"{point}:{hit}\n".encode())
            os.fsync(fd)
            os.close(fd)
        os.kill(os.getpid(), signal.SIGKILL)
