"""Tiering metadata: versioned records, the WAL on a Kafka inner topic, the in-memory state,
snapshots with recovery, and partition leases in etcd."""

from metadata.leases import EtcdLeases, LeaseError
from metadata.manager import MetadataManager
from metadata.partition import PartitionSegments, RemoteSegment
from metadata.records import (
    ClusterRecord,
    LogStartRecord,
    MetadataRecord,
    PartitionDeleteRecord,
    RecordDecodeError,
    SegmentRecord,
    TopicRecord,
    UnknownVersion,
    decode,
)
from metadata.remote_snapshots import StoreSnapshots, snapshot_prefix
from metadata.snapshot import LocalDirSnapshotStore, SnapshotCorrupt, SnapshotStore
from metadata.state import ApplyResult, MetadataState
from metadata.wal import MetadataWal, WalError, WalGap, WalMissing

__all__ = [
    "ApplyResult",
    "ClusterRecord",
    "EtcdLeases",
    "LeaseError",
    "LocalDirSnapshotStore",
    "LogStartRecord",
    "MetadataManager",
    "MetadataRecord",
    "MetadataState",
    "MetadataWal",
    "PartitionDeleteRecord",
    "PartitionSegments",
    "RecordDecodeError",
    "RemoteSegment",
    "SegmentRecord",
    "SnapshotCorrupt",
    "SnapshotStore",
    "StoreSnapshots",
    "TopicRecord",
    "UnknownVersion",
    "WalError",
    "WalGap",
    "WalMissing",
    "decode",
    "snapshot_prefix",
]
