"""When a topic counts as deleted, so that its remote data may go (DELETE_PARTITION_*).

Deleting remote data is the one step that cannot be undone, and a single metadata answer is weak
evidence: a principal without Describe on a topic does not see it listed, a broker behind the
controller answers from stale metadata, a request can fail half-way. So a topic id counts as deleted
only when

- Kafka said so: asked for the topic by name, it answered UNKNOWN_TOPIC_OR_PART, or gave another id
  (the name was re-created). Any other failure (authorization, timeout) is no evidence either way;
- in at least ``MIN_CHECKS`` answers in a row (answers without evidence do not break the run);
- for a grace period of *observed* time: the time between two such answers counts only up to
  ``counted_gap_ms(grace)`` (a third of the grace, at most five minutes). Time the sidecar did not
  watch (it was stopped, or no answer came) does not count, so a restart never shortcuts the grace,
  and the record of it is persisted so a restart does not reset it either. Any answer that shows the
  id again forgets the absence.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

MIN_CHECKS = 3
MAX_COUNTED_GAP_MS = 300_000


@dataclass(frozen=True, slots=True)
class Absence:
    """A topic id that Kafka's answers have lacked, every time it was asked since ``first_missing_ms``."""

    topic: str
    first_missing_ms: int
    last_checked_ms: int
    observed_ms: int = 0
    checks: int = 1

    def due(self, grace_ms: int) -> bool:
        """Whether the topic counts as deleted: enough answers, over enough observed time."""
        return self.checks >= MIN_CHECKS and self.observed_ms >= grace_ms


def counted_gap_ms(grace_ms: int) -> int:
    """The longest time between two answers that counts toward the grace: a third of it, at most
    ``MAX_COUNTED_GAP_MS``, so that at least ``MIN_CHECKS`` answers are spread over the grace."""
    return min(MAX_COUNTED_GAP_MS, grace_ms // MIN_CHECKS)


def observe(
    absences: Mapping[str, Absence],
    candidates: Mapping[str, str],
    answer: Mapping[str, str | None],
    now_ms: int,
    max_gap_ms: int = MAX_COUNTED_GAP_MS,
) -> dict[str, Absence]:
    """The absences after one answer from Kafka.

    ``candidates`` maps the topic ids that have remote data to their names; ``answer`` maps each name
    Kafka answered for to the topic's id now, or None when Kafka said no such topic exists (a name
    missing from ``answer`` got no usable answer). Ids no longer among the candidates are dropped.
    ``max_gap_ms``: the longest step between two answers that counts as observed time.
    """
    out: dict[str, Absence] = {}
    for topic_id, name in candidates.items():
        previous = absences.get(topic_id)
        if name not in answer:
            if previous is not None:
                out[topic_id] = previous  # no evidence: neither counted nor forgotten
            continue
        if answer[name] == topic_id:
            continue  # the topic is there: forget any absence
        if previous is None:
            out[topic_id] = Absence(name, now_ms, now_ms)
            continue
        step = now_ms - previous.last_checked_ms
        counted = step if 0 <= step <= max_gap_ms else 0  # a clock step back or a long pause counts nothing
        out[topic_id] = replace(
            previous, last_checked_ms=now_ms, observed_ms=previous.observed_ms + counted, checks=previous.checks + 1
        )
    return out
