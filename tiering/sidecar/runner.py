"""The sidecar's main loop: wake on segment rolls or every rescan interval, run each led partition's
task (at most ``upload_max_concurrency`` at once), clean up deleted topics, publish status.

The loop acts on the metadata state, so it must never outlive the metadata follower: when the
follower dies the sidecar stops at once and ``run_forever`` raises MetadataFollowerDied (the CLI exits
non-zero); the next start recovers the state from a snapshot and the WAL, or says why it cannot."""

from __future__ import annotations

import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from types import FrameType

from metadata import WalError
from metadata.records import topic_id_str
from tiering.sidecar.context import SidecarContext
from tiering.sidecar.janitor import DeletedTopicsJanitor
from tiering.sidecar.partition_task import PartitionFacts, PartitionTask
from tiering.sidecar.retry import SIDECAR
from tiering.sidecar.status import status_key, write_status
from tiering.watch import SegmentWatcher
from tiering_core.errors import TieringError
from tiering_core.formats import find_partition_dirs
from tiering_core.logs import get_logger

log = get_logger(__name__)


class MetadataFollowerDied(TieringError):
    """The metadata follower thread stopped (a WAL gap, Kafka failing fatally, a bug): the sidecar stopped
    rather than upload or delete on a state that no longer follows the WAL. Restarting recovers."""


class Sidecar:
    def __init__(self, ctx: SidecarContext) -> None:
        self.ctx = ctx
        ctx.manager.on_failure = self._on_metadata_failure
        self.tasks: dict[tuple[str, int], PartitionTask] = {}
        self.janitor = DeletedTopicsJanitor(ctx)
        self.watcher = SegmentWatcher(ctx.settings.log_dirs)
        self.pool = ThreadPoolExecutor(max_workers=ctx.settings.upload_max_concurrency, thread_name_prefix="tier")
        self.ticks = 0
        self.last_error: str | None = None

    def start(self) -> None:
        self.ctx.manager.start()
        if self.ctx.settings.metrics_port is not None:
            self.ctx.metrics.serve(self.ctx.settings.metrics_port, self.ctx.settings.metrics_host)
        self.watcher.start()
        log.info("sidecar started", broker_id=self.ctx.broker_id, log_dirs=[str(d) for d in self.ctx.settings.log_dirs])

    def run_forever(self) -> None:
        """Run until SIGTERM/SIGINT (or ``stop``); then finish in-flight steps and exit cleanly."""
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGINT, self._on_signal)
        self.start()
        try:
            while not self.ctx.stopping.is_set():
                self.tick()
                self.watcher.wait(self.ctx.settings.rescan_interval_seconds)
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
        log.info("stopping: finishing in-flight steps", signal=signal.Signals(signum).name)
        self.stop()

    def stop(self) -> None:
        self.ctx.stopping.set()
        self.watcher.wake()

    def tick(self) -> None:
        """One pass over every tiered partition this broker leads, then the deleted topics' cleanup.

        Nothing escapes: a partition's failure is its own (see PartitionTask.step), a failure to learn
        the cluster's state (Kafka unreachable) is the sidecar's and backs off like any operation.
        """
        if self.ctx.manager.failure is not None:
            return  # never act on a state that stopped following the WAL; run_forever is stopping
        self.ticks += 1
        self._update_wal_lag()
        if self.ctx.retry.run(SIDECAR, "tick", self._tick):
            self.ctx.retry.run(SIDECAR, "janitor", self._janitor)
        sidecar = self.ctx.retry.summary(SIDECAR)
        self.last_error = sidecar["last_error"]
        deleted = {
            status_key(s.topic_id, s.partition): {"topic": s.topic, **self.ctx.retry.summary(s)}
            for s in self.ctx.retry.failing_scopes()
            if s != SIDECAR and (s.topic_id, s.partition) not in self.tasks
        }
        write_status(
            self.ctx.settings.state_dir,
            self.ctx.broker_id,
            {status_key(t.topic_id, t.partition): {"topic": t.topic, **asdict(t.status)} for t in self.tasks.values()},
            sidecar=sidecar,
            other_partitions=deleted,
        )

    def _update_wal_lag(self) -> None:
        try:
            lag = self.ctx.manager.wal_lag()
        except WalError as exc:
            log.warning("metadata WAL lag unknown this tick", error=str(exc))
            return
        for partition, records in lag.items():
            self.ctx.metrics.metadata_wal_lag.labels(wal_partition=str(partition)).set(records)

    def _janitor(self) -> None:
        brokers = self.ctx.cluster.broker_ids()
        if brokers and self.ctx.broker_id == min(brokers):
            self.janitor.run()

    def _tick(self) -> bool:
        """Run the partitions' steps; True once they ran (then the janitor may run)."""
        ctx = self.ctx
        with ctx.manager.lock:
            topics = {topic_id_str(tid): entry for tid, entry in ctx.manager.state.topics.items()}
            cluster_flags = (ctx.manager.state.cluster.upload_paused, ctx.manager.state.cluster.rolled_back)
        existing = set(ctx.cluster.topic_names())
        infos = ctx.cluster.topics({name for name, _ in topics.values()} & existing)
        dirs = find_partition_dirs(ctx.settings.log_dirs)
        led = []
        for topic_id, (name, tiering) in topics.items():
            info = infos.get(name)
            if info is None or info.topic_id != topic_id:
                continue
            if info.compacted:
                log.error("compacted topics cannot be tiered; skipping", topic=name)
                continue
            for p in info.partitions:
                if p.leader == ctx.broker_id and (name, p.partition) in dirs:
                    led.append((info, p.partition, dirs[(name, p.partition)], tiering))
        offsets = ctx.cluster.local_offsets([(info.name, p) for info, p, _, _ in led])
        futures = []
        for info, partition, directory, tiering in led:
            task = self.tasks.get((info.topic_id, partition))
            if task is None:
                task = self.tasks[(info.topic_id, partition)] = PartitionTask(ctx, info.name, info.topic_id, partition)
            facts = PartitionFacts(
                topic=info,
                partition=partition,
                partition_dir=directory,
                offsets=offsets[(info.name, partition)],
                tiering=tiering,
                uploads_allowed=tiering.uploads_allowed and not any(cluster_flags),
                local_deletion_allowed=tiering.enabled and not tiering.rolled_back and not cluster_flags[1],
            )
            futures.append(self.pool.submit(task.step, facts))
        for future in futures:
            future.result()  # step() records its own failures and never raises
        return True

    def close(self) -> None:
        self.watcher.stop()
        self.pool.shutdown(wait=True)
        if self.ctx.leases is not None:
            self.ctx.leases.close()
        self.ctx.manager.close()
        log.info("sidecar stopped")
