"""Exponential backoff with a cap and jitter, as Kafka's clients and RemoteLogManager do it.

The n-th consecutive failure waits ``initial x 2^(n-1)``, at most ``maximum``, times a random factor
in ``[1 - jitter, 1 + jitter]`` (Kafka's ``ExponentialBackoff``: ``retry.backoff.ms`` /
``retry.backoff.max.ms``, ``remote.log.manager.task.retry.backoff.ms`` / ``...max.ms`` / ``...jitter``).
The jitter keeps many failing partitions (or sidecars) from retrying in lockstep.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Backoff:
    """Delays in seconds. ``rng`` is for tests (a seeded ``random.Random``)."""

    initial: float
    maximum: float
    jitter: float = 0.2
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not 0 < self.initial <= self.maximum:
            raise ValueError(f"backoff needs 0 < initial <= maximum, got {self.initial} and {self.maximum}")
        if not 0 <= self.jitter < 1:
            raise ValueError(f"backoff jitter must be in [0, 1), got {self.jitter}")

    def delay(self, failures: int) -> float:
        """How long to wait after ``failures`` consecutive failures (``failures`` >= 1)."""
        exponent = min(max(failures, 1) - 1, 62)  # 2**62 x initial is past any maximum
        term = min(self.maximum, self.initial * 2.0**exponent)
        return term * self.rng.uniform(1 - self.jitter, 1 + self.jitter)
