"""Exponential backoff with a cap and jitter; the retrier records failures and skips until the backoff passed."""

from __future__ import annotations

import random

import pytest
from prometheus_client import CollectorRegistry, Counter

from tiering.sidecar.retry import SIDECAR, Retrier, Scope
from tiering_core.backoff import Backoff


def test_delays_double_up_to_the_cap_within_the_jitter() -> None:
    backoff = Backoff(0.5, 30.0, jitter=0.2, rng=random.Random(7))
    for failures in range(1, 80):
        expected = min(30.0, 0.5 * 2 ** (failures - 1))
        assert expected * 0.8 <= backoff.delay(failures) <= expected * 1.2
    assert Backoff(1.0, 8.0, jitter=0.0).delay(3) == 4.0
    with pytest.raises(ValueError, match="initial <= maximum"):
        Backoff(2.0, 1.0)
    with pytest.raises(ValueError, match="jitter"):
        Backoff(1.0, 2.0, jitter=1.5)


def test_a_failed_operation_waits_for_its_backoff_and_others_do_not() -> None:
    errors = Counter("errors", "test", ("topic", "partition", "operation"), registry=CollectorRegistry())
    retrier = Retrier(Backoff(3600.0, 3600.0, jitter=0.0), errors)
    scope = Scope("orders", "id", 3)
    calls: list[str] = []

    def boom() -> None:
        calls.append("boom")
        raise KeyError("surprise")

    assert retrier.run(scope, "copy", boom) is None
    assert retrier.run(scope, "copy", boom) is None  # still backing off: not called again
    assert calls == ["boom"]
    assert retrier.run(scope, "sweep", lambda: 42) == 42  # another operation is not held back
    assert retrier.run(SIDECAR, "copy", lambda: 1) == 1  # nor another scope
    summary = retrier.summary(scope)
    assert summary["last_error"] == "KeyError: 'surprise'" and list(summary["failing"]) == ["copy"]
    assert summary["next_retry_ms"] >= summary["last_error_ms"] + 3600 * 1000
    assert errors.labels(topic="orders", partition="3", operation="copy")._value.get() == 1
    retrier.succeeded(scope, "copy")
    assert retrier.summary(scope)["last_error"] is None and retrier.run(scope, "copy", lambda: "ok") == "ok"
