"""What every part of the sidecar shares, built once from the settings."""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass, field

from metadata import EtcdLeases, MetadataManager, MetadataWal
from metadata.remote_snapshots import StoreSnapshots, snapshot_prefix
from metadata.snapshot import SnapshotStore
from tiering.config import SidecarSettings
from tiering.copier import SegmentCopier
from tiering.metrics import SidecarMetrics
from tiering.observed_store import ObservedStore
from tiering.sidecar.retry import Retrier
from tiering_core.errors import ConfigError
from tiering_core.kafka_client import client_properties
from tiering_core.kafka_cluster import KafkaCluster
from tiering_core.ratelimit import RateLimiter
from tiering_core.stores.base import RemoteStore
from tiering_core.stores.factory import open_store


@dataclass
class SidecarContext:
    settings: SidecarSettings
    broker_id: int
    cluster: KafkaCluster
    manager: MetadataManager
    store: ObservedStore
    copier: SegmentCopier
    metrics: SidecarMetrics
    retry: Retrier
    leases: EtcdLeases | None = None
    stopping: threading.Event = field(default_factory=threading.Event)

    @staticmethod
    def now_ms() -> int:
        return int(time.time() * 1000)

    def close(self) -> None:
        """Revoke the etcd lease, stop the metadata manager (its WAL clients) and release the cluster's admin
        client (idempotent); each part is released even when one before it fails."""
        try:
            if self.leases is not None:
                self.leases.close()
        finally:
            try:
                self.manager.close()
            finally:
                self.cluster.close()

    @classmethod
    def build(cls, settings: SidecarSettings, *, writes_snapshots: bool = True) -> SidecarContext:
        """Everything the sidecar needs; ``writes_snapshots=False`` for observers, which only read them."""
        if not settings.log_dirs:
            raise ConfigError("log_dirs is not set: the sidecar runs beside a broker and needs its log.dirs")
        broker_id = settings.resolve_broker_id()
        leases = None
        if settings.etcd_url:
            leases = EtcdLeases(settings.etcd_url, f"broker-{broker_id}", ttl=settings.etcd_lease_ttl_seconds)
        store = open_store(settings.remote_storage)
        return cls._assemble(settings, broker_id, store, leases=leases, writes_snapshots=writes_snapshots)

    @classmethod
    def for_admin(cls, settings: SidecarSettings, store: RemoteStore, *, timeout: float, read_only: bool,
                  store_reachable: bool) -> SidecarContext:  # fmt: skip
        """What a ``tiering topic`` / ``cluster`` command needs, from any host: the bootstrap servers, the Kafka
        client settings and the store are enough (no log_dirs, no broker id: its records carry broker -1).

        Every Kafka request waits at most ``timeout`` seconds; ``read_only`` never creates the metadata WAL
        topic; snapshots are read from ``store`` only when ``store_reachable`` (else recovery replays the WAL
        alone) and never written.
        """
        return cls._assemble(settings, ADMIN_BROKER_ID, store, writes_snapshots=False, timeout=timeout,
                             read_only=read_only, remote_snapshots=store_reachable)  # fmt: skip

    @classmethod
    def _assemble(
        cls, settings: SidecarSettings, broker_id: int, inner_store: RemoteStore, *, writes_snapshots: bool,
        leases: EtcdLeases | None = None, timeout: float | None = None, read_only: bool = False,
        remote_snapshots: bool = True,
    ) -> SidecarContext:  # fmt: skip
        kafka_client = client_properties(settings.kafka_client)
        metrics = SidecarMetrics()
        store = ObservedStore(inner_store, metrics, probe_key=".probe")
        snapshots: SnapshotStore | None = StoreSnapshots(store) if remote_snapshots else None
        waits = {} if timeout is None else {"timeout": timeout}
        manager = MetadataManager(
            MetadataWal(
                settings.bootstrap_servers,
                settings.metadata_topic,
                settings.metadata_partitions,
                client_config=kafka_client,
                **waits,
            ),
            settings.state_dir / "snapshots",
            remote=snapshots,
            remote_prefix=snapshot_prefix(settings.metadata_topic),
            snapshot_every_records=settings.snapshot_every_records if writes_snapshots else sys.maxsize,
            snapshot_every_seconds=settings.snapshot_every_seconds if writes_snapshots else float("inf"),
            read_only=read_only,
        )
        limiter = RateLimiter(settings.upload_bytes_per_second) if settings.upload_bytes_per_second else None
        copier = SegmentCopier(store, limiter=limiter, max_concurrent=settings.upload_max_concurrency)
        return cls(
            settings=settings,
            broker_id=broker_id,
            cluster=KafkaCluster(settings.bootstrap_servers, client_config=kafka_client, **waits),
            manager=manager,
            store=store,
            copier=copier,
            metrics=metrics,
            retry=Retrier(settings.retry_backoff(), metrics.task_errors, metrics.registry),
            leases=leases,
        )


# The broker id in records an operator's command writes (it runs on no broker); Kafka's "no broker" as well.
ADMIN_BROKER_ID = -1
