"""The sidecar's main loop: wake on segment rolls or every rescan interval, run each led partition's
task (at most ``upload_max_concurrency`` at once), clean up deleted topics, publish status.

The loop acts on the metadata state, so it must never outlive the metadata follower: when the
follower dies the sidecar stops at once and ``run_forever`` raises MetadataFollowerDied (the CLI exits
non-zero); the next start recovers the state from a snapshot and the WAL, or says why it cannot."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from types import FrameType
from typing import Any

from tiering.sidecar.context import SidecarContext
from tiering.sidecar.endpoint import StatusEndpoint
from tiering.sidecar.facts import step_inputs
from tiering.sidecar.janitor import DeletedTopicsJanitor
from tiering.sidecar.leadership import LedPartition, led_partitions
from tiering.sidecar.partition_task import PartitionTask
from tiering.sidecar.retry import SIDECAR
from tiering.sidecar.status import status_document, status_key, write_status
from tiering.sidecar.sweeping import abort_stale_uploads
from tiering.watch import SegmentWatcher
from tiering_core.errors import TieringError
from tiering_core.kafka_cluster import LocalOffsets
from tiering_core.logs import get_logger

log = get_logger(__name__)


class MetadataFollowerDied(TieringError):
    """The metadata follower thread stopped (a WAL gap, Kafka failing fatally, a bug): the sidecar stopped
    rather than upload or delete on a state that no longer follows the WAL. Restarting recovers."""


class Sidecar:
    def __init__(self, ctx: SidecarContext) -> None:
        self.ctx = ctx
        ctx.manager.on_failure = self._on_metadata_failure
        ctx.cluster.on_request = lambda api: ctx.metrics.kafka_requests.labels(api=api).inc()
        self.tasks: dict[tuple[str, int], PartitionTask] = {}
        self.janitor = DeletedTopicsJanitor(ctx)
        self.watcher = SegmentWatcher(ctx.settings.log_dirs)
        self.pool = ThreadPoolExecutor(max_workers=ctx.settings.upload_max_concurrency, thread_name_prefix="tier")
        self.ticks = 0
        self.last_error: str | None = None
        self.led: dict[tuple[str, int], tuple[PartitionTask, Path]] = {}  # as of the last tick
        self.endpoint: StatusEndpoint | None = None
        self.refused: set[str] = set()  # topic ids never tiered though the metadata says so: reported once
        self._monitor = threading.Thread(target=self._monitor_loop, name="lag-monitor", daemon=True)
        self._tick_began: float | None = None  # monotonic start of the tick running now
        # the last ListOffsets answers with no open transaction (Ly == Lz), by topic id: Ly is not asked for again
        # while Lz and the epoch stay (a topic recreated under the same name has another id)
        self._settled: dict[tuple[str, int], LocalOffsets] = {}

    def start(self) -> None:
        settings = self.ctx.settings
        if settings.metrics_port is not None:  # first: a taken port fails before anything else starts
            self.endpoint = StatusEndpoint(settings.metrics_host, settings.metrics_port, self.ctx.metrics.registry,
                                           self.status)  # fmt: skip
        self.ctx.manager.start()
        self.watcher.start()
        self._monitor.start()
        log.info("sidecar started", broker_id=self.ctx.broker_id, log_dirs=[str(d) for d in settings.log_dirs])

    def run_forever(self) -> None:
        """Run until SIGTERM/SIGINT (or ``stop``); then finish the copies in flight and exit cleanly."""
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGINT, self._on_signal)
        self.start()
        rescan = self.ctx.settings.rescan_interval_seconds
        try:
            last_full = time.monotonic()
            self.tick()
            while not self.ctx.stopping.is_set():
                rolled = self.watcher.wait(max(0.0, last_full + rescan - time.monotonic()))
                if self.ctx.stopping.is_set():
                    break
                if rolled and time.monotonic() - last_full < rescan:
                    self.tick(only=rolled)  # event-driven: only the partitions where a segment rolled
                else:
                    last_full = time.monotonic()
                    self.tick()
        finally:
            self.close()
        failure = self.ctx.manager.failure
        if failure is not None:
            raise MetadataFollowerDied(
                f"the metadata follower died ({type(failure).__name__}: {failure}); the sidecar stopped"
            )

    def _on_metadata_failure(self, exc: BaseException) -> None:
        log.error("stopping the sidecar: its metadata follower died", error=f"{type(exc).__name__}: {exc}")
        self.stop()

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        log.info("stopping: finishing the copies in flight", signal=signal.Signals(signum).name)
        self.stop()

    def stop(self) -> None:
        self.ctx.stopping.set()
        self.watcher.wake()

    def tick(self, only: set[str] | None = None) -> None:
        """One pass over every tiered partition this broker leads, then the deleted topics' cleanup; with
        ``only`` (partition directory names where a segment rolled), a pass over just those, no cleanup.

        Between full rescans the watcher's events decide what to step: with thousands of partitions a roll in
        one of them must not cost a pass over all (their segments, offsets and sweeps). Leadership is still
        asked for the whole broker (one request), so partitions led elsewhere are let go at once.

        Nothing escapes: a partition's failure is its own (see PartitionTask.step), a failure to learn
        the cluster's state (Kafka unreachable) is the sidecar's and backs off like any operation.
        """
        if self.ctx.manager.failure is not None:
            return  # never act on a state that stopped following the WAL; run_forever is stopping
        began = self._tick_began = time.monotonic()
        self.ticks += 1
        self.ctx.retry.run(SIDECAR, "wal_lag", self._update_wal_lag)  # unknown while Kafka is down: backs off
        if self.ctx.retry.run(SIDECAR, "tick", partial(self._tick, only)):
            if only is None and not self.ctx.stopping.is_set():
                self.ctx.retry.run(SIDECAR, "janitor", self._janitor)
        else:  # leadership could not be confirmed: hold no lease another leader may need
            self._release_leases(self.tasks)
        self.last_error = self.ctx.retry.summary(SIDECAR)["last_error"]
        write_status(self.ctx.settings.state_dir, self.status())
        kind = "full" if only is None else "rolled"
        self.ctx.metrics.tick_seconds.labels(kind=kind).set(time.monotonic() - began)
        self.ctx.metrics.ticks.labels(kind=kind).inc()
        self._tick_began = None

    def status(self) -> dict[str, Any]:
        """The status as ``/status`` serves it and status.json holds it (copy lag as of now)."""
        deleted = {
            status_key(s.topic_id, s.partition): {"topic": s.topic, **self.ctx.retry.summary(s)}
            for s in self.ctx.retry.failing_scopes()
            if s != SIDECAR and (s.topic_id, s.partition) not in self.tasks
        }
        return status_document(
            self.ctx.broker_id,
            {
                status_key(t.scope.topic_id, t.scope.partition): {"topic": t.scope.topic, **t.status.as_dict()}
                for t in list(self.tasks.values())
            },
            sidecar=self.ctx.retry.summary(SIDECAR),
            other_partitions=deleted,
        )

    def _monitor_loop(self) -> None:
        """Every ``lag_refresh_seconds``: during a tick that has run that long (one can take minutes behind slow
        uploads), refresh every led partition's copy lag; and ask an idle store whether it answers.

        Between ticks the lags are current without it: each step refreshes its partition's, a skipped step's is
        what it was (nothing it depends on changed), and a roll gets its partition stepped at once. Refreshing
        them between ticks too cost an idle broker a second ListOffsets of every led partition."""
        interval = self.ctx.settings.lag_refresh_seconds
        while not self.ctx.stopping.wait(interval):
            began = self._tick_began
            if began is not None and time.monotonic() - began >= interval:
                self.ctx.retry.run(SIDECAR, "lag", self._refresh_lag)
            if self.ctx.store.idle_seconds() >= interval:
                self.ctx.retry.run(SIDECAR, "store_probe", self.ctx.store.probe)

    def _refresh_lag(self) -> None:
        led = list(self.led.values())
        if not led:
            return
        offsets = self.ctx.cluster.local_offsets([(task.scope.topic, task.scope.partition) for task, _ in led])
        for task, directory in led:
            local = offsets.get((task.scope.topic, task.scope.partition))
            if local is not None:
                task.refresh_lag(directory, local)

    def _update_wal_lag(self) -> None:
        self.ctx.metrics.metadata_wal_lag_seconds.set(self.ctx.manager.take_apply_lag())
        self.ctx.metrics.kafka_requests.labels(api="ListOffsets").inc()  # the WAL's end offsets, just below
        for partition, records in self.ctx.manager.wal_lag().items():
            self.ctx.metrics.metadata_wal_lag.labels(wal_partition=str(partition)).set(records)

    def _release_leases(self, partitions: Iterable[tuple[str, int]]) -> None:
        if self.ctx.leases is not None:
            for topic_id, partition in partitions:
                self.ctx.leases.release(topic_id, partition)

    def _let_go(self, led: set[tuple[str, int]]) -> None:
        """Drop the partitions this sidecar no longer acts on (led elsewhere, topic deleted, or rolled back with
        nothing remote left): their metric series and status go, and their leases are released at once (the
        new leader's sidecar is refused the lease until then; the keepalive keeps it alive otherwise)."""
        gone = [key for key in self.tasks if key not in led]
        self.led = {key: entry for key, entry in self.led.items() if key in led}  # the lag monitor's view
        for topic_id, partition in gone:
            task = self.tasks.pop((topic_id, partition))
            task.close()
            log.info("partition dropped: led elsewhere now, deleted, or rolled back with nothing remote",
                     topic=task.scope.topic, topic_id=topic_id, partition=partition)  # fmt: skip
        self._release_leases(gone)

    def _janitor(self) -> None:
        """The cluster's cleanups, on the sidecar of the lowest live broker id, after its partitions' steps (no copy
        of its own in flight): uploads crashes left incomplete, then deleted topics' remote data."""
        brokers = self.ctx.cluster.broker_ids()
        if brokers and self.ctx.broker_id == min(brokers):
            self.ctx.retry.run(SIDECAR, "upload_sweep", partial(abort_stale_uploads, self.ctx))
            self.janitor.run()

    def _local_offsets(
        self, stepped: list[LedPartition], led: set[tuple[str, int]]
    ) -> dict[tuple[str, int], LocalOffsets]:
        """Kafka's offsets of the partitions to step; Ly only where it may have moved (see ``local_offsets``)."""
        settled = {(p.topic.name, p.partition): self._settled[p.key] for p in stepped if p.key in self._settled}
        offsets = self.ctx.cluster.local_offsets([(p.topic.name, p.partition) for p in stepped], settled)
        self._settled = {key: got for key, got in self._settled.items() if key in led}
        for p in stepped:
            got = offsets[(p.topic.name, p.partition)]
            if got.ly == got.lz:
                self._settled[p.key] = got
            else:
                self._settled.pop(p.key, None)
        return offsets

    def _tick(self, only: set[str] | None) -> bool:
        """Run the partitions' steps (those in ``only`` when given); True once they ran (then the janitor may run)."""
        led = led_partitions(self.ctx)
        for topic_id, (name, reason) in led.refused.items():
            if topic_id not in self.refused:  # once, not every tick
                log.error("topic is never tiered; skipping it (nothing copied or trimmed)", topic=name,
                          topic_id=topic_id, reason=reason)  # fmt: skip
                self.refused.add(topic_id)
        self._let_go({p.key for p in led.partitions})
        stepped = [p for p in led.partitions if only is None or p.partition_dir.name in only]
        offsets = self._local_offsets(stepped, {p.key for p in led.partitions})
        futures = []
        now_led: dict[tuple[str, int], tuple[PartitionTask, Path]] = {}
        for p in led.partitions:
            task = self.tasks.get(p.key)
            if task is None:
                task = self.tasks[p.key] = PartitionTask(self.ctx, p.topic.name, *p.key)
            now_led[p.key] = (task, p.partition_dir)
        for p in stepped:
            task, facts = now_led[p.key][0], p.facts(offsets[(p.topic.name, p.partition)])
            inputs = step_inputs(facts, self.ctx.manager, task.scope)
            if task.unchanged(inputs):  # most partitions of an idle broker are: no thread hand-off for them
                self.ctx.metrics.partition_steps.labels(outcome="unchanged").inc()
            else:
                futures.append(self.pool.submit(task.step, facts, inputs))
        self.led = now_led
        for future in futures:
            future.result()  # step() records its own failures and never raises
        return True

    def close(self) -> None:
        self.ctx.stopping.set()
        self.watcher.stop()
        self.pool.shutdown(wait=True)
        if self._monitor.is_alive():
            self._monitor.join(timeout=30)
        if self.endpoint is not None:
            self.endpoint.close()
        self.ctx.close()
        log.info("sidecar stopped")
