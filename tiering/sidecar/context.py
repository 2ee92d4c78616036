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
from tiering_core.kafka_client import client_properties
from tiering_core.kafka_cluster import KafkaCluster
from tiering_core.ratelimit import RateLimiter
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

    @property
    def prefix(self) -> str:
        return self.settings.remote_storage.prefix

    @staticmethod
    def now_ms() -> int:
        return int(time.time() * 1000)

    @classmethod
    def build(cls, settings: SidecarSettings, *, writes_snapshots: bool = True) -> SidecarContext:
        """Everything the sidecar needs; ``writes_snapshots=False`` for CLI commands, which only read them."""
        broker_id = settings.resolve_broker_id()
        kafka_client = client_properties(settings.kafka_client)
        metrics = SidecarMetrics()
        prefix = settings.remote_storage.prefix
        store = ObservedStore(open_store(settings.remote_storage), metrics, probe_key=f"{prefix}/.probe")
        snapshots: SnapshotStore = StoreSnapshots(store, prefix)
        manager = MetadataManager(
            MetadataWal(
                settings.bootstrap_servers,
                settings.metadata_topic,
                settings.metadata_partitions,
                client_config=kafka_client,
            ),
            settings.state_dir / "snapshots",
            remote=snapshots,
            remote_prefix=snapshot_prefix(settings.metadata_topic),
            snapshot_every_records=settings.snapshot_every_records if writes_snapshots else sys.maxsize,
            snapshot_every_seconds=settings.snapshot_every_seconds if writes_snapshots else float("inf"),
        )
        limiter = RateLimiter(settings.upload_bytes_per_second) if settings.upload_bytes_per_second else None
        copier = SegmentCopier(store, prefix, limiter=limiter, max_concurrent=settings.upload_max_concurrency)
        leases = None
        if settings.etcd_url:
            leases = EtcdLeases(settings.etcd_url, f"broker-{broker_id}", ttl=settings.etcd_lease_ttl_seconds)
        return cls(
            settings=settings,
            broker_id=broker_id,
            cluster=KafkaCluster(settings.bootstrap_servers, client_config=kafka_client),
            manager=manager,
            store=store,
            copier=copier,
            metrics=metrics,
            retry=Retrier(settings.retry_backoff(), metrics.task_errors, metrics.registry),
            leases=leases,
        )
