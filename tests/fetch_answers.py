"""Fetch answers built with kio for the proxy's unit tests: two topics, the first with two partitions (one with
aborted transactions and records, one with null records), at every version the proxy handles."""

from __future__ import annotations

import datetime
import uuid

from kio.schema.errors import ErrorCode
from kio.static.primitive import i32, i64

from reader.proxy.fetch_scan import ScannedPartition
from reader.proxy.protocol import build, nested, response_frame, response_type

VERSIONS = range(4, 19)
TOPIC_IDS = (uuid.UUID(int=7), uuid.UUID(int=11))


def fetch_answer(version: int, *, error: ErrorCode = ErrorCode.none, endpoints: bool = False, diverging: bool = False,
                 record_copies: int = 3, top_error: ErrorCode = ErrorCode.none,
                 ) -> tuple[memoryview, list[ScannedPartition]]:  # fmt: skip
    """A Fetch answer frame (without its size) of two topics, the first with two partitions (one with aborted
    transactions and records, one with null records), and the partition headers it must scan to."""
    response = response_type(1, version)
    topic_type = nested(response, "responses")
    data_type = nested(topic_type, "partitions")
    txn_type = nested(data_type, "aborted_transactions")
    expected: list[ScannedPartition] = []
    topics = []
    for t, (name, topic_id) in enumerate(zip(("orders", "ünïcode"), TOPIC_IDS, strict=True)):
        key = topic_id if version >= 13 else name
        parts = []
        for index in range(2 - t):
            records = bytes(range(256)) * record_copies if index == 0 else None
            code = error if t == 1 else ErrorCode.none
            values = dict(partition_index=i32(index), error_code=code, high_watermark=i64(1000 + index),
                          last_stable_offset=i64(900 + index), log_start_offset=i64(100 + index),
                          aborted_transactions=(build(txn_type, producer_id=i64(5), first_offset=i64(950)),)
                          if index == 0 else None, preferred_read_replica=i32(-1), records=records)  # fmt: skip
            if diverging and version >= 12:
                epoch_type = nested(data_type, "diverging_epoch")
                values["diverging_epoch"] = build(epoch_type, epoch=i32(3), end_offset=i64(77))
            parts.append(build(data_type, **values))
            expected.append(ScannedPartition(key, index, int(code), 1000 + index, 900 + index,
                                             100 + index if version >= 5 else -1, len(records or b"")))  # fmt: skip
        topics.append(build(topic_type, topic=name, topic_id=topic_id, partitions=tuple(parts)))
    values = dict(throttle_time=datetime.timedelta(0), error_code=top_error, session_id=i32(0),
                  responses=tuple(topics))  # fmt: skip
    if endpoints and version >= 16:
        endpoint_type = nested(response, "node_endpoints")
        values["node_endpoints"] = (
            build(endpoint_type, node_id=i32(1), host="broker-one", port=i32(9092), rack=None),
            build(endpoint_type, node_id=i32(2), host="broker-two", port=i32(9092), rack="r2"),
        )
    frame = response_frame(42, 1, version, build(response, **values))[4:]
    return frame, expected
