"""The log start offsets of a tiered partition: our local retention's requests vs a user's deletions.

The property that matters (issue 7.9): a LOG_START is recorded, and copies below it deleted, only when
a user's delete_records (or the broker's retention) really moved the log start offset that far;
never because of our own local retention, whatever the leader changes and lagging metadata views.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metadata import MetadataState, RecordDecodeError, decode
from metadata.records import parse, unparse
from metadata.snapshot import load_snapshot, write_snapshot
from segment_fsm import LogStartKind, LogStarts, log_start_rejection
from tests.metadata_factory import TOPIC_ID, log_start
from tiering.policy import log_start_to_record

LOCAL, START = LogStartKind.LOCAL_LOG_START, LogStartKind.LOG_START


def starts(state: MetadataState, partition: int = 0) -> LogStarts:
    p = state.partition(TOPIC_ID, partition)
    return LogStarts() if p is None else p.log_starts


def test_rule_moves_forward_and_a_log_start_must_pass_every_request() -> None:
    assert log_start_rejection(LogStarts(), LOCAL, 0) is None
    assert "not above 50" in (log_start_rejection(LogStarts(50, -1), LOCAL, 50) or "")
    assert log_start_rejection(LogStarts(50, 70), LOCAL, 60) is None  # a request below a user's deletion
    assert log_start_rejection(LogStarts(50, -1), START, 60) is None
    assert "not above 70" in (log_start_rejection(LogStarts(50, 70), START, 70) or "")
    assert "not above 50" in (log_start_rejection(LogStarts(50, -1), START, 50) or "")


def test_records_round_trip_apply_in_order_and_are_fenced() -> None:
    record = log_start(START, 120, epoch=4, token=2)
    assert decode(record.encode()) == record and unparse(*parse(record.encode())) == record.encode()
    state = MetadataState()
    assert state.apply(log_start(LOCAL, 100, epoch=4)).accepted
    assert state.apply(log_start(START, 120, epoch=4)).accepted
    assert starts(state) == LogStarts(100, 120)
    assert state.apply(log_start(LOCAL, 130, epoch=4)).accepted
    behind = state.apply(log_start(START, 125, epoch=4))  # a view that had not seen the request to 130
    assert not behind.accepted and "not above 130" in (behind.reason or "")
    fenced = state.apply(log_start(START, 140, epoch=3))
    assert not fenced.accepted and "fenced" in (fenced.reason or "")
    assert starts(state) == LogStarts(130, 120)
    assert starts(state, 1) == LogStarts()


def test_invalid_log_start_records_are_garbage() -> None:
    good = log_start(START, 120).encode()
    state = MetadataState()
    for kind_id in (2, 255):
        bad = bytearray(good)
        bad[3 + 4 + 4 + 8 + 8 + 16 + 4] = kind_id  # the kind byte after the common fields, topic id, partition
        with pytest.raises(RecordDecodeError, match="kind"):
            state.apply_payload(bytes(bad))
    assert state.counters.garbage == 2 and starts(state) == LogStarts()


def test_log_starts_survive_snapshots_and_older_snapshots_load(tmp_path: Path) -> None:
    state = MetadataState()
    assert state.apply(log_start(LOCAL, 100)).accepted
    assert state.apply(log_start(START, 150)).accepted
    loaded, _, _ = load_snapshot(write_snapshot(tmp_path / "new", state, {0: 2}))
    assert loaded.digest() == state.digest() and starts(loaded) == LogStarts(100, 150)
    # a snapshot written before log start offsets existed has no such entry: nothing recorded yet
    data = write_snapshot(tmp_path / "old", state, {0: 2}).read_bytes()
    magic, version, _crc, _n = struct.unpack_from(">4sHIQ", data)
    body = data[18:]
    (head_len,) = struct.unpack_from(">I", body)
    header = json.loads(body[4 : 4 + head_len])
    header["partitions"] = [entry[:7] for entry in header["partitions"]]
    head = json.dumps(header).encode()
    body = struct.pack(">I", len(head)) + head + body[4 + head_len :]
    old = tmp_path / "old.tsnap"
    old.write_bytes(struct.pack(">4sHIQ", magic, version, crc32c.crc32c(body), len(body)) + body)
    assert starts(load_snapshot(old)[0]) == LogStarts()


def test_what_the_leader_records() -> None:
    assert log_start_to_record(40, None, LogStarts()) == (LOCAL, 40)  # baseline: as if we had asked for it
    assert log_start_to_record(40, 29, LogStarts()) == (LOCAL, 30)  # a hole is not adopted as ours
    assert log_start_to_record(40, 29, LogStarts(30, -1)) == (START, 40)
    assert log_start_to_record(30, 29, LogStarts(30, -1)) is None  # where local retention put it
    assert log_start_to_record(25, 29, LogStarts(30, -1)) is None  # below a request (delete_records failed)
    assert log_start_to_record(45, 60, LogStarts(30, 40)) == (START, 45)
    assert log_start_to_record(40, 60, LogStarts(30, 40)) is None


# -- the safety property, on interleavings of leaders with lagging views -----------------------
ACTIONS = st.lists(
    st.tuples(
        st.sampled_from(["copy", "request", "user", "detect"]),
        st.integers(0, 40),
        st.integers(0, 6),
        st.integers(0, 3),
    ),
    max_size=40,
)


@settings(max_examples=400, deadline=None)
@given(ACTIONS)
def test_a_recorded_log_start_never_passes_what_a_user_deleted(actions: list[tuple[str, int, int, int]]) -> None:
    """Leaders act on views of the metadata that lag the WAL by up to six records, and on log start
    offsets read from the broker earlier; a user deletes records at any time. Whatever happens, every
    LOG_START the state accepts is at or below what a user really deleted, and every delete_records
    our local retention makes is recorded (or covered by a record) before it is made."""
    state = MetadataState()
    views = [LogStarts()]  # the partition's log starts after each WAL record: what a lagging follower sees
    lxs = [0]  # the broker's log start offset over time (ListOffsets answers may be old)
    ry, user_deleted = -1, 0
    for action, amount, lag, lx_lag in actions:
        view = views[max(0, len(views) - 1 - lag)]
        lx = lxs[-1]
        if action == "copy":
            ry += amount + 1
        elif action == "user":
            user_deleted = max(user_deleted, lx + amount)
            lxs.append(max(lx, user_deleted))
        elif action == "request":  # local retention: a segment boundary above Lx, at most Ry + 1
            target = min(lx + amount + 1, ry + 1)
            if target <= lx:
                continue
            if target > view.local:
                result = state.apply(log_start(LOCAL, target))
                views.append(starts(state))
                if not result.accepted:
                    continue
            assert target <= starts(state).local, "delete_records beyond what the metadata records"
            lxs.append(max(lx, target))
        else:
            seen_lx = lxs[max(0, len(lxs) - 1 - lx_lag)]
            todo = log_start_to_record(seen_lx, ry if ry >= 0 else None, view)
            if todo is None:
                continue
            result = state.apply(log_start(todo[0], todo[1]))
            views.append(starts(state))
            if result.accepted and todo[0] is START:
                assert todo[1] <= user_deleted, f"LOG_START {todo[1]} but a user deleted only below {user_deleted}"
