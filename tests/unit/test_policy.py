"""Unit tests of the pure tiering policy: copy eligibility, offset invariants, retention."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tiering.policy import (
    LocalSegmentInfo,
    OffsetViolation,
    PartitionOffsets,
    RemoteSegmentInfo,
    RetentionSettings,
    copy_lag,
    local_retention_target,
    next_segment_to_copy,
    next_time_rule_ms,
    remote_segments_to_expire,
)
from tiering_core.errors import ConfigError


def segs(*bases: int, size: int = 100, ts: int = 0) -> list[LocalSegmentInfo]:
    return [LocalSegmentInfo(b, size, ts + i) for i, b in enumerate(bases)]


def test_active_segment_is_never_copied() -> None:
    assert next_segment_to_copy(segs(0), PartitionOffsets(0, 50, 50)) is None


def test_copy_waits_for_last_stable_offset() -> None:
    local = segs(0, 10, 20)
    # Ly=15: segment 0..9 is stable, 10..19 is not.
    decision = next_segment_to_copy(local, PartitionOffsets(0, 15, 25))
    assert decision is not None and decision.segment.base_offset == 0 and decision.end_offset == 9
    assert next_segment_to_copy(local, PartitionOffsets(0, 15, 25, rx=0, ry=9)) is None
    decision = next_segment_to_copy(local, PartitionOffsets(0, 20, 25, rx=0, ry=9))
    assert decision is not None and decision.segment.base_offset == 10


def test_new_leader_continues_after_ry_with_overlap() -> None:
    # Old leader uploaded up to 14; the new leader's segments are 0, 10, 30.
    decision = next_segment_to_copy(segs(0, 10, 30), PartitionOffsets(0, 40, 40, rx=0, ry=14))
    assert decision is not None
    assert decision.segment.base_offset == 10 and decision.end_offset == 29
    assert not decision.after_hole


def test_hole_left_by_broker_retention_is_flagged() -> None:
    decision = next_segment_to_copy(segs(50, 60, 70), PartitionOffsets(50, 80, 80, rx=0, ry=19))
    assert decision is not None and decision.after_hole and decision.segment.base_offset == 50


def test_segments_below_log_start_are_skipped() -> None:
    decision = next_segment_to_copy(segs(0, 10, 20), PartitionOffsets(10, 30, 30))
    assert decision is not None and decision.segment.base_offset == 10


def test_copy_lag_counts_stable_rolled_segments_not_yet_copied() -> None:
    local = [LocalSegmentInfo(0, 100), LocalSegmentInfo(10, 200), LocalSegmentInfo(20, 400), LocalSegmentInfo(30, 800)]
    # 0..9 is remote, 10..19 is stable and waits, 20..29 holds offsets above Ly=25, 30.. is active
    assert copy_lag(local, PartitionOffsets(0, 25, 35, rx=0, ry=9)) == (200, 1)
    assert copy_lag(local, PartitionOffsets(0, 30, 35)) == (700, 3)
    assert copy_lag(local, PartitionOffsets(20, 30, 35)) == (400, 1)  # below the log start: Kafka deletes it
    assert copy_lag(local, PartitionOffsets(0, 35, 35, rx=0, ry=29)) == (0, 0)
    assert copy_lag(local[:1], PartitionOffsets(0, 5, 5)) == (0, 0)  # the active segment never lags


def test_offset_invariants() -> None:
    PartitionOffsets(0, 10, 10, rx=0, ry=9).check("t-0")
    with pytest.raises(OffsetViolation, match="t-0: remote end Ry=10"):
        PartitionOffsets(0, 10, 10, rx=0, ry=10).check("t-0")
    with pytest.raises(OffsetViolation, match="Lz=5 < last stable offset Ly=10"):
        PartitionOffsets(0, 10, 5).check("t-0")
    assert PartitionOffsets(30, 40, 40, rx=0, ry=9).has_hole
    assert not PartitionOffsets(10, 40, 40, rx=0, ry=9).has_hole


def test_local_retention_only_releases_uploaded_segments() -> None:
    local = segs(0, 10, 20, 30, size=100)
    settings = RetentionSettings(retention_ms=-1, local_retention_bytes=100)
    # Only 0..9 is remote: even though size wants more gone, stop at Ry + 1.
    assert local_retention_target(local, PartitionOffsets(0, 35, 35, rx=0, ry=9), settings, 0) == 10
    assert local_retention_target(local, PartitionOffsets(0, 35, 35, rx=0, ry=29), settings, 0) == 30
    assert local_retention_target(local, PartitionOffsets(0, 35, 35), settings, 0) is None


def test_local_retention_by_time() -> None:
    local = [LocalSegmentInfo(0, 10, 1_000), LocalSegmentInfo(10, 10, 5_000), LocalSegmentInfo(20, 10, -1)]
    settings = RetentionSettings(retention_ms=-1, local_retention_ms=2_000)
    offsets = PartitionOffsets(0, 25, 25, rx=0, ry=19)
    assert local_retention_target(local, offsets, settings, now_ms=4_000) == 10
    assert local_retention_target(local, offsets, settings, now_ms=8_000) == 20
    assert local_retention_target(local, offsets, settings, now_ms=2_500) is None


def test_local_retention_above_total_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"local.retention.ms=10 exceeds retention.ms=5"):
        RetentionSettings(retention_ms=5, local_retention_ms=10)
    with pytest.raises(ConfigError, match=r"local\.retention\.bytes"):
        RetentionSettings(retention_bytes=5, local_retention_bytes=-1)


def test_remote_expiry_by_time_size_and_log_start() -> None:
    remote = [RemoteSegmentInfo(str(i), i * 10, i * 10 + 9, 100, 1_000 * (i + 1)) for i in range(4)]
    by_time = remote_segments_to_expire(remote, RetentionSettings(retention_ms=1_500), now_ms=3_000)
    assert [s.segment_id for s in by_time] == ["0"]
    by_size = remote_segments_to_expire(
        remote, RetentionSettings(retention_ms=-1, retention_bytes=250), 0, local_only_bytes=50
    )
    assert [s.segment_id for s in by_size] == ["0", "1"]
    # KIP-405: copies whose end offset is below the (user's) log start offset go, whatever their age
    below = remote_segments_to_expire(remote, RetentionSettings(retention_ms=-1), 0, log_start_offset=100)
    assert len(below) == 4
    below = remote_segments_to_expire(remote, RetentionSettings(retention_ms=-1), 0, log_start_offset=25)
    assert [s.segment_id for s in below] == ["0", "1"]  # "2" holds offset 25, which is still readable
    assert remote_segments_to_expire(remote, RetentionSettings(retention_ms=-1), 0, log_start_offset=None) == []


@st.composite
def partitions(draw: st.DrawFn) -> tuple[list[LocalSegmentInfo], PartitionOffsets]:
    gaps = draw(st.lists(st.integers(1, 50), min_size=1, max_size=12))
    bases = [draw(st.integers(0, 20))]
    for gap in gaps:
        bases.append(bases[-1] + gap)
    local = [LocalSegmentInfo(b, draw(st.integers(1, 1000)), draw(st.integers(-1, 10_000))) for b in bases]
    lz = bases[-1] + draw(st.integers(0, 50))
    ly = draw(st.integers(bases[0], lz))
    lx = bases[0]
    ry = draw(st.one_of(st.none(), st.integers(max(lx - 1, 0), max(ly - 1, 0))))
    rx = None if ry is None else draw(st.integers(0, ry))
    return local, PartitionOffsets(lx, ly, lz, rx, ry)


@given(partitions(), st.integers(-2, 3000), st.integers(-2, 5000), st.integers(0, 20_000))
def test_local_retention_never_passes_remote_end(
    part: tuple[list[LocalSegmentInfo], PartitionOffsets], local_bytes: int, local_ms: int, now: int
) -> None:
    local, offsets = part
    settings = RetentionSettings(retention_ms=-1, local_retention_bytes=local_bytes, local_retention_ms=local_ms)
    target = local_retention_target(local, offsets, settings, now)
    if target is not None:
        assert offsets.ry is not None and target <= offsets.ry + 1
        assert target > offsets.lx
        assert target in {s.base_offset for s in local[1:]}


@given(partitions())
def test_copy_choice_is_stable_and_inactive(part: tuple[list[LocalSegmentInfo], PartitionOffsets]) -> None:
    local, offsets = part
    decision = next_segment_to_copy(local, offsets)
    if decision is not None:
        assert decision.segment is not local[-1]
        assert decision.end_offset < offsets.ly
        assert offsets.ry is None or decision.end_offset > offsets.ry


@given(partitions())
def test_copy_lag_is_what_copying_would_take(part: tuple[list[LocalSegmentInfo], PartitionOffsets]) -> None:
    """Lag exactly while a segment is eligible; copying the next one lowers it by that segment."""
    local, offsets = part
    lag_bytes, lag_segments = copy_lag(local, offsets)
    decision = next_segment_to_copy(local, offsets)
    assert (lag_segments > 0) == (decision is not None)
    if decision is not None:
        after = PartitionOffsets(offsets.lx, offsets.ly, offsets.lz, offsets.rx if offsets.rx is not None else
                                 decision.segment.base_offset, decision.end_offset)  # fmt: skip
        assert copy_lag(local, after) == (lag_bytes - decision.segment.size, lag_segments - 1)


@given(partitions(), st.integers(-1, 5000), st.integers(-2, 5000), st.integers(0, 20_000), st.data())
def test_retention_answers_the_same_until_the_next_time_rule(
    part: tuple[list[LocalSegmentInfo], PartitionOffsets], total_ms: int, local_ms: int, now: int, data: st.DataObject
) -> None:
    """What the sidecar relies on to skip an unchanged partition: before ``next_time_rule_ms`` both retentions
    answer as they do now; at it (when there is one) some segment's time rule has turned."""
    local, offsets = part
    if local_ms > total_ms >= 0 or (local_ms == -1 and total_ms >= 0):
        local_ms = -2  # a local limit above the total one is refused (tested above)
    settings = RetentionSettings(retention_ms=total_ms, local_retention_ms=local_ms)
    remote = [RemoteSegmentInfo(str(i), s.base_offset, s.base_offset, s.size, s.max_timestamp + 7) for i, s in
              enumerate(local[:-1])]  # fmt: skip
    due = next_time_rule_ms(local, remote, settings, now)

    def answers(at: int) -> tuple[object, ...]:
        return local_retention_target(local, offsets, settings, at), remote_segments_to_expire(remote, settings, at)

    later = data.draw(st.integers(now, (due if due is not None else now + 100_000) - 1))
    assert answers(later) == answers(now)
    if due is not None:
        assert due > now
        limits = [(settings.effective_local_ms, [s.max_timestamp for s in local if s.max_timestamp >= 0]),
                  (settings.retention_ms, [s.max_timestamp for s in remote])]  # fmt: skip
        turned = [ts for limit, stamps in limits if limit >= 0 for ts in stamps if due - ts - 1 == limit]
        assert turned, "nothing turns at the time said"
