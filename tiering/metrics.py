"""Prometheus metrics of the sidecar, named after Kafka's tiered-storage metrics (KIP-405/KIP-963).

Each help text names the Kafka metric it mirrors (``kafka.server:type=BrokerTopicMetrics,...``),
so dashboards built for Kafka's own tiered storage map one to one. Labels are ``topic`` and
``partition`` where Kafka reports per partition; a partition's series exist only on the sidecar of its
current leader (``forget_partition`` removes them when it stops leading, as Kafka removes a partition's
metrics from a broker that no longer leads it).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

_TP = ("topic", "partition")


class SidecarMetrics:
    """The sidecar's metrics, in their own registry so tests and benches can make several."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry()
        self.copy_bytes = Counter(
            "tiering_remote_copy_bytes",
            "Bytes copied to remote storage (RemoteCopyBytesPerSec).",
            _TP,
            registry=r,
        )
        self.copy_segments = Counter(
            "tiering_remote_copy_segments",
            "Segments whose copy finished (COPY_SEGMENT_FINISHED).",
            _TP,
            registry=r,
        )
        self.copy_errors = Counter(
            "tiering_remote_copy_errors", "Failed segment copies (RemoteCopyErrorsPerSec).", _TP, registry=r
        )
        self.copy_lag_bytes = Gauge(
            "tiering_remote_copy_lag_bytes",
            "Bytes of inactive, stable segments not yet copied (RemoteCopyLagBytes).",
            _TP,
            registry=r,
        )
        self.copy_lag_segments = Gauge(
            "tiering_remote_copy_lag_segments",
            "Inactive, stable segments not yet copied (RemoteCopyLagSegments).",
            _TP,
            registry=r,
        )
        self.delete_errors = Counter(
            "tiering_remote_delete_errors",
            "Failed remote deletions (RemoteDeleteErrorsPerSec).",
            _TP,
            registry=r,
        )
        self.delete_lag_segments = Gauge(
            "tiering_remote_delete_lag_segments",
            "Remote segments past retention not yet deleted (RemoteDeleteLagSegments).",
            _TP,
            registry=r,
        )
        self.remote_log_size_bytes = Gauge(
            "tiering_remote_log_size_bytes",
            "Bytes of the remote log, each offset counted once where copies overlap (RemoteLogSizeBytes).",
            _TP,
            registry=r,
        )
        self.remote_stored_bytes = Gauge(
            "tiering_remote_stored_bytes",
            "Bytes of finished remote copies as stored, overlapping copies included (RemoteLogSizeBytes counts "
            "each offset once).",
            _TP,
            registry=r,
        )
        self.local_deleted_offsets = Counter(
            "tiering_local_retention_offsets",
            "Offsets released from local disk by local.retention.ms / local.retention.bytes.",
            _TP,
            registry=r,
        )
        self.offset_violations = Counter(
            "tiering_offset_invariant_violations",
            "Times a partition's offsets broke Lz >= Ly >= Lx, Ly > Ry >= Rx; nothing was done then.",
            _TP,
            registry=r,
        )
        self.corrupt_segments = Counter(
            "tiering_corrupt_segments",
            "Local segments refused for upload because they are corrupt.",
            _TP,
            registry=r,
        )
        self.uploads_aborted = Counter(
            "tiering_remote_incomplete_uploads_aborted",
            "Incomplete uploads under the prefix (multipart uploads a crash left, whose parts the store keeps and "
            "bills) aborted by the sweeper, older than remote_log_manager_incomplete_upload_abort_ms.",
            registry=r,
        )
        self.metadata_wal_lag = Gauge(
            "tiering_metadata_wal_lag_records",
            "Records of the metadata WAL not yet applied here, per WAL partition (its end offset minus the next "
            "offset this sidecar applies).",
            ("wal_partition",),
            registry=r,
        )
        self.metadata_wal_lag_seconds = Gauge(
            "tiering_metadata_wal_lag_seconds",
            "How far this sidecar's metadata state trailed the WAL: the largest age (now minus the record's Kafka "
            "timestamp) of a record when it was applied here, since the previous tick.",
            registry=r,
        )
        self.ticks = Counter(
            "tiering_sidecar_ticks",
            "Sidecar ticks finished, by kind: full (every led partition, each rescan interval) or rolled (only the "
            "partitions where the watcher saw a segment roll).",
            ("kind",),
            registry=r,
        )
        self.tick_seconds = Gauge(
            "tiering_sidecar_tick_seconds",
            "How long the last tick of each kind took (the partitions' steps, their uploads included, the janitor).",
            ("kind",),
            registry=r,
        )
        self.partition_steps = Counter(
            "tiering_sidecar_partition_steps",
            "Partition steps by outcome: run, or unchanged (skipped: nothing the step decides on changed since a "
            "step that left nothing to do, and no time-based rule can fire yet).",
            ("outcome",),
            registry=r,
        )
        self.kafka_requests = Counter(
            "tiering_kafka_requests",
            "Admin requests to Kafka by API (Metadata, DescribeConfigs, ListOffsets, DeleteRecords): one per call "
            "and leader broker; the metadata WAL's own producer and consumer are not counted.",
            ("api",),
            registry=r,
        )
        self.store_unavailable = Gauge(
            "tiering_remote_store_unavailable",
            "1 while the remote store cannot be reached (the last request was refused, reset, timed out, or got "
            "5xx/throttling past retries), 0 once it answers again.",
            registry=r,
        )
        self.store_requests = Counter(
            "tiering_remote_store_requests",
            "Requests to the remote store by operation (put, get, head, list, delete, abort).",
            ("operation",),
            registry=r,
        )
        self.store_errors = Counter(
            "tiering_remote_store_errors",
            "Failed remote store requests by operation and error (unavailable, refused, not_found, other).",
            ("operation", "error"),
            registry=r,
        )
        self.task_errors = Counter(
            "tiering_task_errors",
            "Failed sidecar operations (copy, local_retention, remote_retention, sweep, delete_partition, ...), each "
            "retried after an exponential backoff; partition '' for the sidecar as a whole.",
            (*_TP, "operation"),
            registry=r,
        )

        # every metric labelled by partition: a partition's series go together when it is led elsewhere
        self.per_partition: tuple[Counter | Gauge, ...] = (
            self.copy_bytes, self.copy_segments, self.copy_errors, self.copy_lag_bytes, self.copy_lag_segments,
            self.delete_errors, self.delete_lag_segments, self.remote_log_size_bytes, self.remote_stored_bytes,
            self.local_deleted_offsets, self.offset_violations, self.corrupt_segments, self.task_errors,
        )  # fmt: skip

    def forget_partition(self, labels: dict[str, str]) -> None:
        """Remove every series of the partition with these ``topic`` and ``partition`` labels (every
        ``operation`` of ``tiering_task_errors_total`` included), so no frozen value stays behind. Idempotent."""
        for metric in self.per_partition:
            metric.remove_by_labels(labels)
