"""One partition's work in one tick: each of its operations, run through the retrier in order.

The operations live in their own modules: ``leadership`` (may this broker act: its leader epoch and
lease), ``copy``, ``retention`` (local and total, and the log start offset) and ``sweeping``; they share
the partition's ``PartitionWriter``. The task keeps what lasts across ticks: the status, the copy lag
and the segments found corrupt.
"""

from __future__ import annotations

import math
import random
import threading
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from tiering.policy import OffsetViolation, PartitionOffsets, RetentionSettings, copy_lag, next_time_rule_ms
from tiering.sidecar.context import SidecarContext
from tiering.sidecar.copy import CorruptSegments, copy_backlog
from tiering.sidecar.facts import (
    Local,
    PartitionFacts,
    StepInputs,
    local_segments,
    partition_offsets,
)
from tiering.sidecar.leadership import fence
from tiering.sidecar.retention import (
    apply_local_retention,
    apply_remote_retention,
    finished_copies,
    record_log_start,
    retention_settings,
)
from tiering.sidecar.retry import Scope
from tiering.sidecar.status import PartitionStatus
from tiering.sidecar.sweeping import next_stale_ms, sweep
from tiering.sidecar.writer import PartitionWriter
from tiering_core.kafka_cluster import LocalOffsets


@dataclass(frozen=True)
class _Settled:
    """A step that left nothing to do: what it decided on, and until when the same inputs mean the same."""

    inputs: StepInputs
    next_rule_ms: int  # wall clock
    orphans_due: float  # monotonic; infinite while nothing is remote (the orphan listing never runs then)


class PartitionTask:
    """The state kept across ticks for one partition this broker leads, until ``close``."""

    def __init__(self, ctx: SidecarContext, topic: str, topic_id: str, partition: int) -> None:
        self.ctx = ctx
        self.scope = Scope(topic, topic_id, partition)
        self.status = PartitionStatus()
        self.corrupt = CorruptSegments()
        self.copying = True  # False once the topic is rolled back: nothing lags behind then
        self._gauges = threading.Lock()  # the lag monitor refreshes gauges from another thread
        self._closed = False
        self._orphans_due = 0.0  # monotonic time of the next orphan listing: the first step lists
        self._settled: _Settled | None = None  # the last step's inputs, when it left nothing to do

    def close(self) -> None:
        """The partition is led elsewhere now (or no longer tiered): remove its metric series and its
        failures, so only its current leader's sidecar shows it. Idempotent; the lag monitor may still
        hold the task, and its late refreshes change nothing."""
        with self._gauges:
            self._closed = True
            self.ctx.metrics.forget_partition(self.scope.labels)
        self.ctx.retry.forget(self.scope)

    def unchanged(self, inputs: StepInputs | None) -> bool:
        """Whether the step can be skipped: nothing it decides on changed since a step that left nothing to do (the
        same ``inputs``, see ``StepInputs``) and no time-based rule can fire yet (retention, a stale copy, the
        orphan listing, the periodic recheck). Cheap: the runner asks it for every partition in its own thread, on
        an idle broker thousands of them."""
        settled = self._settled
        return (
            settled is not None and inputs == settled.inputs and self.ctx.now_ms() < settled.next_rule_ms
            and time.monotonic() < settled.orphans_due
        )  # fmt: skip

    def step(self, facts: PartitionFacts, inputs: StepInputs | None = None) -> None:
        """Run each operation of the partition that is due. Never raises: a failing operation is recorded
        (log with traceback, metrics, status) and retried after its backoff; the others go on. ``inputs``
        (``step_inputs`` read before the step reads anything, so that a change during it shows next time) are
        kept when the step leaves nothing to do. A step that had not begun when the sidecar began to stop
        does nothing (see ``_run``)."""
        if self.ctx.stopping.is_set():
            return
        self.ctx.metrics.partition_steps.labels(outcome="run").inc()
        self._settled = None
        done = self._run(facts)
        if done is not None and inputs is not None and not self.ctx.retry.failures(self.scope):
            writer, local, offsets, settings = done
            orphans_due = self._orphans_due if offsets.ry is not None else math.inf
            self._settled = _Settled(inputs, self._next_rule_ms(writer, local, settings), orphans_due)
        self._refresh_status()

    def _run(self, facts: PartitionFacts) -> tuple[PartitionWriter, Local, PartitionOffsets, RetentionSettings] | None:
        """The step's operations; what they decided on when every one ran (None when one could not)."""
        retry, scope = self.ctx.retry, self.scope
        self.copying = facts.tiered
        begun = retry.run(scope, "partition", lambda: self._begin(facts))
        if begun is None:
            return None
        writer, local, offsets = begun
        retry.run(scope, "log_start", lambda: record_log_start(writer, offsets))
        if facts.uploads_allowed:
            refreshed = partial(self._refreshed, local, facts.offsets)
            retry.run(scope, "copy", lambda: copy_backlog(writer, local, offsets, self.corrupt, refreshed))
            offsets = refreshed()
        else:
            retry.clear(scope, "copy")
        if self.ctx.stopping.is_set():
            # A stop finishes the copy in flight (its COPY_SEGMENT_FINISHED is what keeps the upload) and
            # leaves the rest to the next start: retention and the sweep only delete, and each of their
            # Kafka requests can wait its whole timeout for a broker that is going away with the sidecar.
            return None
        settings = retry.run(scope, "retention", lambda: retention_settings(facts))
        if settings is not None and facts.tiered:
            retry.run(scope, "local_retention", lambda: apply_local_retention(writer, local, offsets, settings))
        else:
            retry.clear(scope, "local_retention")
        if settings is not None:
            retry.run(scope, "remote_retention", lambda: apply_remote_retention(writer, local, offsets, settings))
        retry.run(scope, "sweep", lambda: self._sweep(writer, offsets))
        summary = self.ctx.manager.partition_state(scope.topic_id, scope.partition)
        self.ctx.metrics.remote_log_size_bytes.labels(**scope.labels).set(summary.remote_size if summary else 0)
        self.ctx.metrics.remote_stored_bytes.labels(**scope.labels).set(summary.stored_size if summary else 0)
        if settings is None or self.ctx.stopping.is_set():
            return None
        return writer, local, offsets, settings

    def _next_rule_ms(self, writer: PartitionWriter, local: Local, settings: RetentionSettings) -> int:
        """The wall-clock time at which a time-based rule may next decide differently on the same inputs: a
        retention limit reached, a COPY_SEGMENT_STARTED going stale, or the periodic recheck."""
        now = self.ctx.now_ms()
        recheck = self.ctx.settings.unchanged_partition_recheck_seconds * 1000 * random.uniform(0.75, 1.25)
        rules = (
            now + int(recheck),
            next_time_rule_ms([s for s, _ in local], finished_copies(writer)[1], settings, now),
            next_stale_ms(writer, now),
        )
        return min(t for t in rules if t is not None)

    def _sweep(self, writer: PartitionWriter, offsets: PartitionOffsets) -> None:
        """The sweep, listing the partition's objects for orphans only when due: on the first step (after a
        start or a leadership change, when a crash or a deposed leader may have left some) and then every
        ``orphan_sweep_interval_seconds``, +-25 % at random so thousands of partitions do not list in one tick.
        Listing every tick was one S3 LIST per partition per tick on an idle sidecar. Orphans are rare (objects
        no metadata record names: a deposed leader's upload landing after its copy was deleted, a stray PUT)
        and harmless until found: reads only follow the metadata."""
        now = time.monotonic()
        due = offsets.ry is not None and now >= self._orphans_due
        sweep(writer, offsets, list_orphans=due)
        if due:
            interval = self.ctx.settings.orphan_sweep_interval_seconds
            self._orphans_due = now + interval * random.uniform(0.75, 1.25)

    def _refresh_status(self) -> None:
        for name, value in self.ctx.retry.summary(self.scope).items():
            setattr(self.status, name, value)

    def _begin(self, facts: PartitionFacts) -> tuple[PartitionWriter, Local, PartitionOffsets]:
        """The partition's writer (leader epoch and lease token), its local segments and offsets, checked;
        raises if the partition must not be touched this tick (led elsewhere, lease elsewhere, offsets
        out of order)."""
        writer = fence(self.ctx, self.scope, facts)
        local = local_segments(facts.partition_dir)
        offsets = self._refreshed(local, facts.offsets)
        try:
            offsets.check(writer.name)
        except OffsetViolation:
            self.ctx.metrics.offset_violations.labels(**self.scope.labels).inc()
            raise
        return writer, local, offsets

    def refresh_lag(self, partition_dir: Path, local: LocalOffsets) -> None:
        """Recompute the copy lag from the disk, Kafka's offsets and the metadata (the runner's monitor
        calls it during a long tick)."""
        self._refreshed(local_segments(partition_dir), local)

    def _refreshed(self, local: Local, kafka: LocalOffsets) -> PartitionOffsets:
        """The offsets as the metadata has them now, with the copy lag (status and gauges) updated to them."""
        offsets = partition_offsets(self.ctx.manager, self.scope, kafka)
        lag_bytes, lag_segments = copy_lag([s for s, _ in local], offsets) if self.copying else (0, 0)
        with self._gauges:
            if self._closed:
                return offsets
            self.status.copy_lag_bytes, self.status.copy_lag_segments = lag_bytes, lag_segments
            self.ctx.metrics.copy_lag_bytes.labels(**self.scope.labels).set(lag_bytes)
            self.ctx.metrics.copy_lag_segments.labels(**self.scope.labels).set(lag_segments)
        return offsets
