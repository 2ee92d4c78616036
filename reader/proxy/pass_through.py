"""What the Fetch handler decides about an answer the broker gives alone (no partition served from remote): the
``Gate`` of ``splice.py`` for an answer that goes on as it arrives, and the same rules for one received whole.

The answer goes out as the broker gave it, but for two things, each made in place at the same size:

- OFFSET_OUT_OF_RANGE for an offset the remote copies hold (the broker's log start moved past the client since
  the proxy last saw it): the partition is answered NONE with no records and the broker's offsets asked now
  (``log_start_offset`` the remote start), so the client fetches the same offset again, and the proxy, which
  knows the new log start, serves it from remote. Where the offsets cannot be asked or the topic's id
  confirmed: KAFKA_STORAGE_ERROR, which clients retry.
- Node endpoints (Fetch v16+, KIP-951: the new leader's address with NOT_LEADER_OR_FOLLOWER): rewritten to the
  proxy's addresses and padded to the broker's size with a tagged field no schema names (Kafka's readers skip
  tags they do not know); where the proxy's addresses are longer, the endpoints are left out (padded the
  same way), and the client asks Metadata for the new leader, as before KIP-951.
"""

from __future__ import annotations

import asyncio
import struct
from typing import Any

from kio.schema.errors import ErrorCode

from reader.proxy.fetch import FetchPlan
from reader.proxy.fetch_scan import ScannedFetch, ScannedPartition
from reader.proxy.routing import Router
from reader.proxy.services import ProxyServices
from reader.proxy.tiered import TopicKey
from reader.proxy.turns import FetchTurns
from reader.proxy.wire import ProtocolError, put_uvarint, skip_tagged_fields, string_length, uvarint
from tiering_core.kafka_cluster import KafkaClusterError

_OFFSETS = struct.Struct(">hqq")  # error_code, high_watermark, last_stable_offset
_OFFSETS_V5 = struct.Struct(">hqqq")  # and log_start_offset
_I32 = struct.Struct(">i")
NODE_ENDPOINTS = 0  # FetchResponse's top-level tag (v16+)
PAD_TAG = 10_000  # a tagged field no Kafka schema names (Kafka numbers them upward from 0)


class PassThrough:
    """The decisions about one pass-through Fetch answer (``splice.Gate``, and ``passes`` for a whole one)."""

    def __init__(self, server: ProxyServices, plan: FetchPlan, turns: FetchTurns) -> None:
        self.server, self.plan, self.turns = server, plan, turns

    async def passes(self, scan: ScannedFetch) -> bool:
        """A whole answer goes out as it is unless it has an error or addresses to rewrite (``finish`` then
        parses it); the broker's offsets learned either way."""
        async with self.turns:
            self.plan.observe(scan.partitions, self.server.view)
            if scan.plain:
                self.server.count_passed(len(scan.partitions))
            return scan.plain

    async def passed(self, scan: ScannedFetch) -> None:
        """An answer going out as it arrived: the broker's offsets learned, its partitions counted."""
        async with self.turns:
            self.plan.observe(scan.partitions, self.server.view)
            self.server.count_passed(len(scan.partitions))

    async def partition(self, partition: ScannedPartition) -> bytes | None:
        if partition.error_code != ErrorCode.offset_out_of_range:
            return None  # every other error is the client's as the broker gave it
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.server.remote_pool, self._out_of_range, partition)

    def _out_of_range(self, partition: ScannedPartition) -> bytes | None:
        """Blocking (the catalog, the cluster): run off the event loop."""
        plan, view = self.plan, self.server.view
        target = plan.out_of_range_target(view, partition.topic, partition.partition, {})
        if target is None:
            return None
        if isinstance(target, TopicKey):
            try:
                offsets = view.broker_offsets(target, partition.partition, fresh=True)
                found = view.remote_range(target, partition.partition)
            except KafkaClusterError:
                offsets = None
            if offsets is not None:
                log_start = found[0] if found else offsets.log_start
                return self._fixed(ErrorCode.none, offsets.high_watermark, offsets.last_stable, log_start)
        return self._fixed(ErrorCode.kafka_storage_error, -1, -1, -1)

    def _fixed(self, error: ErrorCode, high: int, stable: int, log_start: int) -> bytes:
        if self.plan.version >= 5:
            return _OFFSETS_V5.pack(int(error), high, stable, log_start)
        return _OFFSETS.pack(int(error), high, stable)

    def tagged(self, section: bytes) -> bytes:
        return rewrite_endpoints(section, self.server.router)


def rewrite_endpoints(section: bytes, router: Router) -> bytes:
    """A FetchResponse's top-level tagged fields with its node endpoints at the proxy's addresses, at the same
    size: padded with ``PAD_TAG``, or without the endpoints where they no longer fit."""
    fields = _tagged_fields(section)
    rewritten = [(tag, _endpoints(data, router) if tag == NODE_ENDPOINTS else data) for tag, data in fields]
    for candidate in (rewritten, [(tag, data) for tag, data in fields if tag != NODE_ENDPOINTS]):
        padded = _padded(candidate, len(section))
        if padded is not None:
            return padded
    raise ProtocolError(f"a Fetch answer's tagged fields ({len(section)} bytes) cannot be rewritten at their size")


def _tagged_fields(section: bytes) -> list[tuple[int, bytes]]:
    count, pos = uvarint(section, 0)
    fields = []
    for _ in range(count):
        tag, pos = uvarint(section, pos)
        size, pos = uvarint(section, pos)
        fields.append((tag, section[pos : pos + size]))
        pos += size
    if pos != len(section):
        raise ProtocolError("a Fetch answer's tagged fields do not end where the answer does")
    return fields


def _endpoints(data: bytes, router: Router) -> bytes:
    """NodeEndpoints (a compact array of node_id, host, port, rack, tagged fields) at the proxy's addresses;
    a node the proxy has no listener for is left out."""
    count, pos = uvarint(data, 0)
    kept: list[bytes] = []
    for _ in range(max(count - 1, 0)):
        (node,) = _I32.unpack_from(data, pos)
        size, pos = string_length(data, pos + 4, True)
        host = data[pos : pos + size].decode()
        (port,) = _I32.unpack_from(data, pos + size)
        rack_at = pos + size + 4
        size, pos = string_length(data, rack_at, True)
        pos = skip_tagged_fields(data, pos + size)
        address = router.address_for(node, host, port)
        if address is None:
            continue
        entry = bytearray(_I32.pack(node))
        encoded = address[0].encode()
        put_uvarint(entry, len(encoded) + 1)
        entry += encoded + _I32.pack(address[1]) + data[rack_at:pos]  # the rack and tagged fields as they came
        kept.append(bytes(entry))
    out = bytearray()
    put_uvarint(out, len(kept) + 1)
    return bytes(out) + b"".join(kept)


def _padded(fields: list[tuple[int, bytes]], size: int) -> bytes | None:
    """``fields`` as a tagged-field section of exactly ``size`` bytes (a ``PAD_TAG`` field added where they are
    shorter); None where no padding makes it."""
    for pad in (None, *range(size)):
        section = _section(fields if pad is None else [*fields, (PAD_TAG, bytes(pad))])
        if len(section) == size:
            return section
        if len(section) > size and pad is not None:
            return None
    return None


def _section(fields: list[tuple[int, Any]]) -> bytes:
    out = bytearray()
    put_uvarint(out, len(fields))
    for tag, data in fields:
        put_uvarint(out, tag)
        put_uvarint(out, len(data))
        out += data
    return bytes(out)
