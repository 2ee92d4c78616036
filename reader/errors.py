"""Errors of remote reads. Each names what failed and where (topic-partition, offset, object key).

None of them is ever turned into records: a read that cannot be served correctly raises.
"""

from __future__ import annotations

from tiering_core.errors import TieringError


class RemoteReadError(TieringError):
    """A remote read failed. Nothing was delivered from the failed range."""


class OffsetOutOfRange(RemoteReadError):
    """The offset is below the partition's remote start (Rx) and the broker's log start: the data is gone,
    as a broker's OFFSET_OUT_OF_RANGE says. Seek to ``remote_start`` (auto.offset.reset=earliest) or later."""

    def __init__(
        self, topic: str, partition: int, offset: int, remote_start: int | None, log_start: int | None
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.remote_start = remote_start
        self.log_start = log_start
        super().__init__(
            f"{topic}-{partition}: offset {offset} is out of range (remote start {remote_start}, "
            f"broker log start {log_start})"
        )


class NotInRemote(RemoteReadError):
    """No finished remote copy holds the offset (it is above the remote end, Ry): read it from the broker."""

    def __init__(self, topic: str, partition: int, offset: int, remote_end: int | None) -> None:
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.remote_end = remote_end
        super().__init__(f"{topic}-{partition}: offset {offset} has no remote copy (remote end {remote_end})")


class RemoteObjectMissing(RemoteReadError):
    """A finished copy's object is gone from the store (lost or deleted behind the metadata's back).

    Never served; an operator should look at the key (the sidecar's sweeper and retention log deletions).
    """

    def __init__(self, key: str, stored_as: str | None = None) -> None:
        self.key = key
        super().__init__(f"remote object missing: {stored_as or key}")  # the store's whole key, prefix included


class RemoteDataCorrupt(RemoteReadError):
    """A remote object's bytes do not match what the manifest and the batch CRCs say. Never served."""

    def __init__(self, key: str, position: int, reason: str) -> None:
        self.key = key
        self.position = position
        self.reason = reason
        super().__init__(f"remote object {key} at byte {position}: {reason}")


class RemoteUnavailable(RemoteReadError):
    """The store stayed unreachable through every attempt. Retry later: reading resumes where it stopped."""

    def __init__(self, key: str, attempts: int, cause: object) -> None:
        self.key = key
        self.attempts = attempts
        super().__init__(f"reading {key}: the remote store stayed unreachable after {attempts} attempts: {cause}")


class UnknownTopic(RemoteReadError):
    """The topic exists neither in the Kafka cluster nor in the tiering metadata."""


class WouldBlock(Exception):
    """A read asked not to wait (``block=False``) would have waited: for a download, the location of a copy,
    its transaction index, or the cluster. Its position did not move; the caller reads again where waiting is
    allowed (the access layer reads on the event loop what read-ahead already holds, the rest on its remote
    threads)."""


class MemoryBusy(RemoteReadError):
    """No room in the memory pool for the window a read needs, within the wait allowed (``reader/cursor.py``):
    the access layer answers the partition without records this time, the HTTP service 503 with Retry-After."""
