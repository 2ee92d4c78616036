"""One partition's work in one tick: each of its operations, run through the retrier in order.

The operations live in their own modules: ``leadership`` (may this broker act: its leader epoch and
lease), ``copy``, ``retention`` (local and total, and the log start offset) and ``sweeping``; they share
the partition's ``PartitionWriter``. The task keeps what lasts across ticks: the status, the copy lag
and the segments found corrupt.
"""

from __future__ import annotations

import random
import threading
import time
from functools import partial
from pathlib import Path

from tiering.policy import OffsetViolation, PartitionOffsets, copy_lag
from tiering.sidecar.context import SidecarContext
from tiering.sidecar.copy import CorruptSegments, copy_backlog
from tiering.sidecar.facts import Local, PartitionFacts, local_segments, partition_offsets
from tiering.sidecar.leadership import fence
from tiering.sidecar.retention import (
    apply_local_retention,
    apply_remote_retention,
    record_log_start,
    retention_settings,
)
from tiering.sidecar.retry import Scope
from tiering.sidecar.status import PartitionStatus
from tiering.sidecar.sweeping import sweep
from tiering.sidecar.writer import PartitionWriter
from tiering_core.kafka_cluster import LocalOffsets


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

    def close(self) -> None:
        """The partition is led elsewhere now (or no longer tiered): remove its metric series and its
        failures, so only its current leader's sidecar shows it. Idempotent; the lag monitor may still
        hold the task, and its late refreshes change nothing."""
        with self._gauges:
            self._closed = True
            self.ctx.metrics.forget_partition(self.scope.labels)
        self.ctx.retry.forget(self.scope)

    def step(self, facts: PartitionFacts) -> None:
        """Run each operation of the partition that is due. Never raises: a failing operation is recorded
        (log with traceback, metrics, status) and retried after its backoff; the others go on."""
        retry, scope = self.ctx.retry, self.scope
        self.copying = facts.tiered
        begun = retry.run(scope, "partition", lambda: self._begin(facts))
        if begun is not None:
            writer, local, offsets = begun
            retry.run(scope, "log_start", lambda: record_log_start(writer, offsets))
            if facts.uploads_allowed:
                refreshed = partial(self._refreshed, local, facts.offsets)
                retry.run(scope, "copy", lambda: copy_backlog(writer, local, offsets, self.corrupt, refreshed))
                offsets = refreshed()
            else:
                retry.clear(scope, "copy")
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
        self._refresh_status()

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
        calls it between and during ticks)."""
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
