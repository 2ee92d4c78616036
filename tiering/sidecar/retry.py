"""Running the sidecar's operations so that a failure stays where it happened.

Every operation (a partition's copy, its local or remote retention, its sweep, a deleted partition's
cleanup, the tick's view of the cluster) runs through ``Retrier.run``: any exception is caught,
logged once with its traceback, counted in ``tiering_task_errors_total``, kept for the status, and
the operation is not tried again before its backoff (exponential, capped, with jitter) has passed.
So one failing partition never stops another, a repeating error is logged once per backoff step,
and ``tiering topic status`` shows the error and when it is tried next.

``tiering_task_consecutive_failures{topic,partition,operation}`` is there while an operation keeps failing
(its failures since it last succeeded) and gone once it succeeds: an alert on it held for a while is "a
partition stuck in an error", which the errors counter alone cannot tell from errors that recover.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple, TypeVar

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tiering_core.backoff import Backoff
from tiering_core.errors import TieringError
from tiering_core.logs import get_logger

log = get_logger(__name__)
T = TypeVar("T")


class Scope(NamedTuple):
    """What an operation works on: a partition (by topic id: a re-created topic is another), or the
    sidecar as a whole (``SIDECAR``)."""

    topic: str
    topic_id: str
    partition: int

    @property
    def labels(self) -> dict[str, str]:
        """The ``topic`` and ``partition`` labels of the metrics about this scope."""
        return {"topic": self.topic, "partition": _label(self)}


SIDECAR = Scope("", "", -1)


@dataclass(frozen=True)
class Failure:
    """The last failure of an operation that has not succeeded since."""

    error: str
    at_ms: int
    attempts: int  # consecutive failures
    next_retry_ms: int  # wall clock, for people; scheduling uses the monotonic clock

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Retrier:
    """Per (scope, operation): run if due, record failures, back off. Thread-safe."""

    def __init__(self, backoff: Backoff, errors: Counter, registry: CollectorRegistry | None = None) -> None:
        self.backoff = backoff
        self.errors = errors
        self._lock = threading.Lock()
        self._failures: dict[tuple[Scope, str], tuple[Failure, float]] = {}  # -> (failure, monotonic due time)
        if registry is not None:
            registry.register(_FailingOperations(self))

    def due(self, scope: Scope, operation: str) -> bool:
        with self._lock:
            entry = self._failures.get((scope, operation))
        return entry is None or time.monotonic() >= entry[1]

    def run(self, scope: Scope, operation: str, fn: Callable[[], T]) -> T | None:
        """``fn()``'s result; None when the operation is still backing off or failed (then recorded)."""
        if not self.due(scope, operation):
            return None
        try:
            result = fn()
        except Exception as exc:
            self.failed(scope, operation, exc)
            return None
        self.succeeded(scope, operation)
        return result

    def failed(self, scope: Scope, operation: str, exc: BaseException) -> Failure:
        message = str(exc) if isinstance(exc, TieringError) else f"{type(exc).__name__}: {exc}"
        with self._lock:
            previous = self._failures.get((scope, operation))
            attempts = 1 if previous is None else previous[0].attempts + 1
            delay = self.backoff.delay(attempts)
            now = time.time()
            failure = Failure(message, int(now * 1000), attempts, int((now + delay) * 1000))
            self._failures[(scope, operation)] = (failure, time.monotonic() + delay)
        self.errors.labels(**scope.labels, operation=operation).inc()
        log.error(
            "operation failed", topic=scope.topic or None, partition=_label(scope) or None, operation=operation,
            error=message, attempts=attempts, retry_in_s=round(delay, 3), exc_info=exc,
        )  # fmt: skip
        return failure

    def succeeded(self, scope: Scope, operation: str) -> None:
        with self._lock:
            previous = self._failures.pop((scope, operation), None)
        if previous is not None:
            log.info("operation recovered", topic=scope.topic or None, partition=_label(scope) or None,
                     operation=operation, failed_attempts=previous[0].attempts)  # fmt: skip

    def clear(self, scope: Scope, operation: str) -> None:
        """Forget a failure of an operation that no longer applies (e.g. uploads were paused)."""
        with self._lock:
            self._failures.pop((scope, operation), None)

    def forget(self, scope: Scope) -> None:
        """Forget every failure of ``scope`` (a partition led elsewhere now: its new leader reports it)."""
        with self._lock:
            for key in [key for key in self._failures if key[0] == scope]:
                del self._failures[key]

    def failures(self, scope: Scope) -> dict[str, Failure]:
        with self._lock:
            return {op: f for (s, op), (f, _) in self._failures.items() if s == scope}

    def failing(self) -> list[tuple[Scope, str, Failure]]:
        """Every operation failing now: its scope, its name and its last failure."""
        with self._lock:
            return [(s, op, f) for (s, op), (f, _) in self._failures.items()]

    def failing_scopes(self) -> set[Scope]:
        with self._lock:
            return {s for s, _ in self._failures}

    def summary(self, scope: Scope) -> dict[str, Any]:
        """For the status: the latest error, when, the next retry, and every failing operation's error."""
        failures = self.failures(scope)
        latest = max(failures.values(), key=lambda f: f.at_ms, default=None)
        return {
            "last_error": latest.error if latest else None,
            "last_error_ms": latest.at_ms if latest else None,
            "next_retry_ms": min((f.next_retry_ms for f in failures.values()), default=None),
            "failing": {op: f.error for op, f in sorted(failures.items())},
        }


class _FailingOperations(Collector):
    """``tiering_task_consecutive_failures``, read from the retrier at scrape time."""

    def __init__(self, retrier: Retrier) -> None:
        self.retrier = retrier

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "tiering_task_consecutive_failures", "Failures in a row of a sidecar operation that has not succeeded "
            "since, retried after a growing backoff; no series once it succeeds (partition '' for the sidecar).",
            labels=("topic", "partition", "operation"),
        )  # fmt: skip
        for scope, operation, failure in self.retrier.failing():
            family.add_metric([scope.topic, _label(scope), operation], failure.attempts)
        yield family


def _label(scope: Scope) -> str:
    return "" if scope.partition < 0 else str(scope.partition)
