"""A tiered partition's two log start offsets, and the one rule for moving them.

Kafka with tiered storage (KIP-405) keeps two: the *local* log start offset, which local retention
moves over data already copied, and the log start offset, which ``delete_records`` and total
retention move; remote segments whose end offset is below the log start offset are deleted. An
unmodified broker has only one, and both our local retention and a user's ``kafka-delete-records``
move it. The sidecar tells them apart by writing, before every ``delete_records`` it makes, the
offset it asks for (``LOCAL_LOG_START``). A broker log start offset above every offset recorded so
far was moved by someone else (a user's ``delete_records``, or the broker's own retention): the
leader records it as ``LOG_START``, and copies entirely below it are deleted.

Both are applied in WAL order on every replica, and each request is durable before its
``delete_records`` is made, so when a LOG_START is applied every request that could have moved the
broker's log start offset that far is already applied: a LOG_START at or below the recorded local
log start offset is rejected. A leader whose metadata lags behind a request made by the previous
leader therefore cannot turn that request into a deletion. -1 means "nothing recorded yet".
"""

from __future__ import annotations

from enum import IntEnum
from typing import NamedTuple


class LogStartKind(IntEnum):
    LOCAL_LOG_START = 0  # local retention is about to ask the broker for this log start offset
    LOG_START = 1  # the broker's log start offset moved above every recorded offset: a deletion


class LogStarts(NamedTuple):
    """``local``: the highest log start offset the sidecars asked for (or adopted as a baseline);
    ``log_start``: the highest log start offset seen above every such request. -1: none yet."""

    local: int = -1
    log_start: int = -1


def log_start_rejection(current: LogStarts, kind: LogStartKind, offset: int) -> str | None:
    """None when the record may be applied to ``current``, else the reason it may not: a local log
    start offset must move forward, and a log start offset must be above both."""
    floor = current.local if kind is LogStartKind.LOCAL_LOG_START else max(current)
    if offset <= floor:
        return f"{kind.name} {offset} is not above {floor} (local log start {current.local})"
    return None


def apply_log_start(current: LogStarts, kind: LogStartKind, offset: int) -> LogStarts:
    """The offsets after an accepted record (see ``log_start_rejection``)."""
    if kind is LogStartKind.LOCAL_LOG_START:
        return current._replace(local=offset)
    return current._replace(log_start=offset)
