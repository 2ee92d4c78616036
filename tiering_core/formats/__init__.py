"""Kafka's on-disk formats: record batches v2, records, indexes and partition metadata files.

Every parser raises ``tiering_core.errors.FormatError`` (path, byte position, reason) on bad input and
nothing else. See docs/kafka-formats.md for the layouts and their sources.
"""

from tiering_core.formats.batch import HEADER_SIZE, BatchHeader, TruncatedBatchError, scan_headers
from tiering_core.formats.indexes import (
    AbortedTxn,
    EpochEntry,
    OffsetIndexEntry,
    ProducerEntry,
    TimeIndexEntry,
    parse_leader_epoch_checkpoint,
    parse_offset_index,
    parse_producer_snapshot,
    parse_time_index,
    parse_txn_index,
    read_topic_id,
)
from tiering_core.formats.layout import (
    VALIDATION_WINDOW,
    SegmentFiles,
    SegmentSummary,
    file_mtime_ms,
    find_partition_dirs,
    list_segments,
    mapped,
    mapped_fd,
    parse_partition_dir,
    segment_file_name,
    summarize_buffer,
    summarize_fd,
    summarize_segment,
)
from tiering_core.formats.records import (
    ControlMarker,
    Record,
    RecordBatch,
    control_marker,
    decode_batch,
    iter_batches,
    verify_batches,
)

__all__ = [
    "HEADER_SIZE",
    "VALIDATION_WINDOW",
    "AbortedTxn",
    "BatchHeader",
    "ControlMarker",
    "EpochEntry",
    "OffsetIndexEntry",
    "ProducerEntry",
    "Record",
    "RecordBatch",
    "SegmentFiles",
    "SegmentSummary",
    "TimeIndexEntry",
    "TruncatedBatchError",
    "control_marker",
    "decode_batch",
    "file_mtime_ms",
    "find_partition_dirs",
    "iter_batches",
    "list_segments",
    "mapped",
    "mapped_fd",
    "parse_leader_epoch_checkpoint",
    "parse_offset_index",
    "parse_partition_dir",
    "parse_producer_snapshot",
    "parse_time_index",
    "parse_txn_index",
    "read_topic_id",
    "scan_headers",
    "segment_file_name",
    "summarize_buffer",
    "summarize_fd",
    "summarize_segment",
    "verify_batches",
]
