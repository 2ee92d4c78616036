"""MetadataWal's offsets are asked again on a fresh admin client after refreshing the leaders, at least once:
librdkafka's admin client queues a ListOffsets to a cached leader whose broker stopped until the request times
out (answered OFFSET_INVALID), and the first request alone can take the whole timeout."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from metadata.wal import MetadataWal, WalError


class Answer:
    def __init__(self, offset: int) -> None:
        self.offset = offset


class StaleLeadersAdmin:
    """Answers ListOffsets OFFSET_INVALID (a request that timed out) until ``refreshes_needed`` refreshes."""

    def __init__(self, refreshes_needed: int) -> None:
        self.refreshes_needed = refreshes_needed
        self.calls: list[str] = []

    def list_offsets(self, request: dict[TopicPartition, Any], **_: Any) -> dict[TopicPartition, Future]:
        self.calls.append("ListOffsets")
        futures = {}
        for tp in request:
            future: Future = Future()
            future.set_result(Answer(-1001 if self.refreshes_needed > 0 else 7))
            futures[tp] = future
        return futures

    def refresh(self) -> None:
        self.calls.append("refresh")
        self.refreshes_needed -= 1

    def replace(self) -> None:
        self.calls.append("new client")


def wal_with(admin: StaleLeadersAdmin, monkeypatch: pytest.MonkeyPatch) -> MetadataWal:
    wal = MetadataWal("127.0.0.1:1", "wal", 2, timeout=0.0)  # the first request already used all the time
    monkeypatch.setattr(wal, "_admin", lambda: admin)
    monkeypatch.setattr(wal, "_refresh_leaders", admin.refresh)
    monkeypatch.setattr(wal, "_replace_admin", admin.replace)
    return wal


def test_a_leader_gone_is_refreshed_and_asked_again_after_the_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    admin = StaleLeadersAdmin(refreshes_needed=1)
    assert wal_with(admin, monkeypatch).end_offsets() == {0: 7, 1: 7}
    assert admin.calls == ["ListOffsets", "new client", "refresh", "ListOffsets"]


def test_still_unanswered_after_the_refresh_and_the_timeout_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    admin = StaleLeadersAdmin(refreshes_needed=2)
    with pytest.raises(WalError, match=r"reading the end offsets of wal: no answer for partitions \[0, 1\]"):
        wal_with(admin, monkeypatch).end_offsets()
    assert admin.calls == ["ListOffsets", "new client", "refresh", "ListOffsets"]
