"""Local and total retention under tiering, with Kafka's semantics (KIP-405).

- ``retention.ms`` / ``retention.bytes`` stay the topic's *total* retention, local plus remote; the
  sidecar applies them to the remote copy. ``-1`` means unlimited.
- ``local.retention.ms`` / ``local.retention.bytes`` bound what stays on the broker's disk; ``-2``
  (Kafka's default) means "the same as the total retention". Local data is released only when it is
  already remote: the new log start offset is never above ``Ry + 1``.

The time rule is Kafka's: a segment breaches when ``now - maxTimestamp > retention.ms``. The size
rule is Kafka's too: drop the oldest segment while the size without it is still ``>=`` the limit.
Both walk from the oldest segment and stop at the first that is kept, so what remains stays
contiguous.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from tiering.policy.copy import LocalSegmentInfo
from tiering.policy.offsets import PartitionOffsets
from tiering_core.errors import ConfigError

UNLIMITED = -1
SAME_AS_TOTAL = -2


@dataclass(frozen=True, slots=True)
class RetentionSettings:
    """A topic's retention settings, with Kafka's config names in the docstrings.

    ``retention_ms``: retention.ms, ``retention_bytes``: retention.bytes (per partition),
    ``local_retention_ms``: local.retention.ms, ``local_retention_bytes``: local.retention.bytes.
    """

    retention_ms: int = 7 * 24 * 3600 * 1000
    retention_bytes: int = UNLIMITED
    local_retention_ms: int = SAME_AS_TOTAL
    local_retention_bytes: int = SAME_AS_TOTAL

    def __post_init__(self) -> None:
        for name in ("retention_ms", "retention_bytes"):
            if getattr(self, name) < UNLIMITED:
                raise ConfigError(f"{name.replace('_', '.')} must be -1 (unlimited) or >= 0")
        for name in ("local_retention_ms", "local_retention_bytes"):
            if getattr(self, name) < SAME_AS_TOTAL:
                raise ConfigError(f"{name.replace('_', '.')} must be -2 (same as total), -1 (unlimited) or >= 0")
        if _exceeds(self.effective_local_ms, self.retention_ms):
            raise ConfigError(f"local.retention.ms={self.local_retention_ms} exceeds retention.ms={self.retention_ms}")
        if _exceeds(self.effective_local_bytes, self.retention_bytes):
            raise ConfigError(
                f"local.retention.bytes={self.local_retention_bytes} exceeds retention.bytes={self.retention_bytes}"
            )

    @property
    def effective_local_ms(self) -> int:
        return self.retention_ms if self.local_retention_ms == SAME_AS_TOTAL else self.local_retention_ms

    @property
    def effective_local_bytes(self) -> int:
        if self.local_retention_bytes == SAME_AS_TOTAL:
            return self.retention_bytes
        return self.local_retention_bytes


def _exceeds(local: int, total: int) -> bool:
    """Whether a local limit is larger than the total one (-1 is infinity on both sides)."""
    if total == UNLIMITED:
        return False
    return local == UNLIMITED or local > total


def local_retention_target(
    segments: Sequence[LocalSegmentInfo],
    offsets: PartitionOffsets,
    settings: RetentionSettings,
    now_ms: int,
) -> int | None:
    """The new log start offset that local retention asks for, or None to keep everything.

    ``segments`` are the partition's local segments sorted by base offset, the last one active.
    Only whole segments that are already remote (last offset <= Ry) are released, so the result is
    a segment boundary and never above ``Ry + 1``: deleting below it loses nothing.
    """
    if offsets.ry is None:
        return None
    limit_ms = settings.effective_local_ms
    limit_bytes = settings.effective_local_bytes
    live = [s for s in segments if s.base_offset >= offsets.lx or s is segments[-1]]
    remaining = sum(s.size for s in live)
    target: int | None = None
    for current, following in itertools.pairwise(live):
        if following.base_offset - 1 > offsets.ry:
            break  # not uploaded yet
        by_time = limit_ms != UNLIMITED and current.max_timestamp >= 0 and now_ms - current.max_timestamp > limit_ms
        by_size = limit_bytes != UNLIMITED and remaining - current.size >= limit_bytes
        if not (by_time or by_size):
            break
        remaining -= current.size
        target = following.base_offset
    if target is None or target <= offsets.lx:
        return None
    return target


@dataclass(frozen=True, slots=True)
class RemoteSegmentInfo:
    """A finished remote copy: its offsets (inclusive), size and largest record timestamp."""

    segment_id: str
    base_offset: int
    end_offset: int
    size: int
    max_timestamp: int


def remote_segments_to_expire(
    remote: Sequence[RemoteSegmentInfo],
    settings: RetentionSettings,
    now_ms: int,
    *,
    local_only_bytes: int = 0,
    log_start_offset: int | None = None,
) -> list[RemoteSegmentInfo]:
    """The remote copies that total retention deletes, oldest first.

    ``remote`` is sorted by base offset. ``local_only_bytes`` is the local data above the remote end,
    which counts toward retention.bytes (the total log is remote plus local-only data).
    ``log_start_offset`` is the partition's log start offset as KIP-405 means it: moved by a user's
    ``delete_records`` or the broker's own retention, never by local retention (see
    ``tiering.policy.log_start``). Copies whose end offset is below it are deleted whatever their age,
    as Kafka's RemoteLogManager does.
    """
    expired: list[RemoteSegmentInfo] = []
    remaining = sum(s.size for s in remote) + local_only_bytes
    for segment in remote:
        below_start = log_start_offset is not None and segment.end_offset < log_start_offset
        age_ms = now_ms - segment.max_timestamp
        by_time = settings.retention_ms != UNLIMITED and age_ms > settings.retention_ms
        by_size = settings.retention_bytes != UNLIMITED and remaining - segment.size >= settings.retention_bytes
        if not (below_start or by_time or by_size):
            break
        remaining -= segment.size
        expired.append(segment)
    return expired


def next_time_rule_ms(local: Sequence[LocalSegmentInfo], remote: Sequence[RemoteSegmentInfo],
                      settings: RetentionSettings, now_ms: int) -> int | None:  # fmt: skip
    """The first time after ``now_ms`` at which a time rule can judge a segment differently: some segment's largest
    timestamp plus the limit plus 1 ms (``now - ts > limit`` turns true then). Until then ``local_retention_target``
    and ``remote_segments_to_expire`` answer as they do now for the same other inputs. None when no time rule
    applies to any segment (unlimited, or every threshold already passed)."""
    times = []
    if settings.effective_local_ms != UNLIMITED:
        times += [s.max_timestamp + settings.effective_local_ms + 1 for s in local if s.max_timestamp >= 0]
    if settings.retention_ms != UNLIMITED:
        times += [s.max_timestamp + settings.retention_ms + 1 for s in remote]
    return min((t for t in times if t > now_ms), default=None)
