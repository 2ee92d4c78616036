"""A following WAL reader notices a WAL that no longer holds what it read (``MetadataWal._check_still_holds``):
the Kafka answers are canned here, the behaviour on a real broker is in test_metadata_follower.py."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

import pytest

from metadata.wal import MetadataWal, WalGap

TOPIC_ID = "AAAAAAAAAAAAAAAAAAAAAQ"
OTHER_ID = "AAAAAAAAAAAAAAAAAAAAAg"


def _done(value: Any) -> Future:
    future: Future = Future()
    future.set_result(value)
    return future


class _Admin:
    """Answers describe_topics and list_offsets as Kafka would, from ``topic_id`` and ``ends``."""

    def __init__(self, topic_id: str, ends: dict[int, int], failing: bool = False) -> None:
        self.topic_id, self.ends, self.failing = topic_id, ends, failing

    def describe_topics(self, topics: Any, request_timeout: float) -> dict[str, Future]:
        if self.failing:
            raise RuntimeError("broker unreachable")
        return {"wal": _done(SimpleNamespace(topic_id=self.topic_id))}

    def list_offsets(self, wanted: dict, request_timeout: float) -> dict:
        return {tp: _done(SimpleNamespace(offset=self.ends[tp.partition])) for tp in wanted}


def _wal(admin: _Admin) -> MetadataWal:
    wal = MetadataWal("127.0.0.1:1", "wal", 2)
    wal.topic_id = TOPIC_ID
    wal._admin = lambda: admin  # type: ignore[method-assign]
    return wal


def test_a_wal_holding_what_was_read_passes() -> None:
    suspects: set[int] = set()
    _wal(_Admin(TOPIC_ID, {0: 7, 1: 3}))._check_still_holds({0: 7, 1: 2}, suspects)
    assert suspects == set()


def test_a_topic_created_again_is_a_gap_at_once() -> None:
    with pytest.raises(WalGap, match=r"wal\[0\].*offset 7.*created again"):
        _wal(_Admin(OTHER_ID, {0: 0, 1: 0}))._check_still_holds({0: 7, 1: 0}, set())


def test_an_end_below_what_was_read_is_a_gap_only_when_seen_twice() -> None:
    wal = _wal(_Admin(TOPIC_ID, {0: 7, 1: 1}))
    suspects: set[int] = set()
    wal._check_still_holds({0: 7, 1: 2}, suspects)  # a new leader's high watermark may lag for a moment
    assert suspects == {1}
    with pytest.raises(WalGap, match=r"wal\[1\].*offset 2.*ends at offset 1"):
        wal._check_still_holds({0: 7, 1: 2}, suspects)


def test_a_lag_that_catches_up_is_forgotten() -> None:
    admin = _Admin(TOPIC_ID, {0: 7, 1: 1})
    wal = _wal(admin)
    suspects: set[int] = set()
    wal._check_still_holds({0: 7, 1: 2}, suspects)
    admin.ends[1] = 2
    wal._check_still_holds({0: 7, 1: 2}, suspects)
    assert suspects == set()


def test_no_answer_tells_nothing() -> None:
    suspects = {1}
    _wal(_Admin(OTHER_ID, {0: 0, 1: 0}, failing=True))._check_still_holds({0: 7, 1: 2}, suspects)
    assert suspects == {1}
