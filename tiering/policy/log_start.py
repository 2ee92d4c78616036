"""What a partition's leader records about the broker's log start offset (``segment_fsm.log_start``).

The broker's log start offset ``Lx`` moves for two reasons the broker cannot tell apart: our local
retention's ``delete_records`` (data that stays readable remotely) and a user's ``delete_records`` or
the broker's own retention (data that is gone for good, remote copies included, as in KIP-405). Every
offset our local retention asks for is recorded before it asks, so an ``Lx`` above everything recorded
is the second kind. Anything unclear counts as ours: remote data is kept until ``retention.ms``.
"""

from __future__ import annotations

from segment_fsm import LogStartKind, LogStarts


def log_start_to_record(lx: int, ry: int | None, starts: LogStarts) -> tuple[LogStartKind, int] | None:
    """The record to write about log start offset ``lx`` (Ry inclusive, None while nothing is remote),
    or None when there is nothing new.

    With nothing recorded yet (a new partition, or one tiered before this rule), ``lx`` is adopted as
    a baseline, as if local retention had asked for it, and deletes nothing. Local retention never asks
    above ``Ry + 1``, so a baseline stops there: a higher ``Lx`` (a hole: the broker's retention took
    data never copied) is then recorded as LOG_START on the next tick.
    """
    if starts.local < 0:
        return LogStartKind.LOCAL_LOG_START, lx if ry is None else min(lx, ry + 1)
    if lx > max(starts):
        return LogStartKind.LOG_START, lx
    return None
