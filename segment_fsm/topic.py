"""Per-topic tiering state and the actions the CLI applies to it.

``enable`` (with the topic's local retention) from nothing or after a rollback; the pause and resume
actions only while enabled; ``rollback`` stops uploads and local deletion for good (until enabled
again); the remote copy stays readable until its retention unless deleted explicitly.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import IntEnum


class TopicAction(IntEnum):
    ENABLE = 0
    PAUSE_UPLOAD = 1
    RESUME_UPLOAD = 2
    PAUSE_DOWNLOAD = 3
    RESUME_DOWNLOAD = 4
    ROLLBACK = 5
    UPDATE_RETENTION = 6


@dataclass(frozen=True, slots=True)
class TopicTiering:
    """A topic's tiering state. ``local_retention_*`` follow Kafka (-2: same as total, -1: unlimited)."""

    enabled: bool = False
    local_retention_ms: int = -2
    local_retention_bytes: int = -2
    upload_paused: bool = False
    download_paused: bool = False
    rolled_back: bool = False

    @property
    def uploads_allowed(self) -> bool:
        return self.enabled and not self.upload_paused and not self.rolled_back


def apply_topic_action(
    current: TopicTiering | None,
    action: TopicAction,
    local_retention_ms: int = -2,
    local_retention_bytes: int = -2,
) -> tuple[TopicTiering | None, str | None]:
    """(new state, None) when the action is legal, else (current state unchanged, reason).

    Re-applying an action whose effect is already there (enable when enabled with the same
    retention, pause when paused) is legal and changes nothing.
    """
    state = current or TopicTiering()
    if action is TopicAction.ENABLE:
        if state.enabled and (state.local_retention_ms, state.local_retention_bytes) != (
            local_retention_ms,
            local_retention_bytes,
        ):
            return current, "tiering is already enabled with other settings: use update-retention"
        return (
            TopicTiering(True, local_retention_ms, local_retention_bytes, False, False, False)
            if not state.enabled
            else state
        ), None
    if not state.enabled:
        return (
            current,
            f"cannot {action.name.lower().replace('_', '-')}: tiering is not enabled for the topic",
        )
    if action is TopicAction.ROLLBACK:
        return replace(state, enabled=False, rolled_back=True, upload_paused=False, download_paused=False), None
    if action is TopicAction.UPDATE_RETENTION:
        return replace(state, local_retention_ms=local_retention_ms, local_retention_bytes=local_retention_bytes), None
    flags = {
        TopicAction.PAUSE_UPLOAD: {"upload_paused": True},
        TopicAction.RESUME_UPLOAD: {"upload_paused": False},
        TopicAction.PAUSE_DOWNLOAD: {"download_paused": True},
        TopicAction.RESUME_DOWNLOAD: {"download_paused": False},
    }
    return replace(state, **flags[action]), None
