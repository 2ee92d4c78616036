"""A small, test-only encoder of Kafka record batches v2 (for unit tests and fuzzing).

Independent from the decoder under test: it writes varints and the header field by field.
"""

from __future__ import annotations

import gzip
import struct

import cramjam
import crc32c
import lz4.frame


def zigzag_varint(n: int) -> bytes:
    u = (n << 1) ^ (n >> 63)
    out = bytearray()
    while True:
        if u < 0x80:
            out.append(u)
            return bytes(out)
        out.append((u & 0x7F) | 0x80)
        u >>= 7


def encode_record(
    offset_delta: int,
    ts_delta: int,
    key: bytes | None,
    value: bytes | None,
    headers: list[tuple[str, bytes | None]],
) -> bytes:
    body = bytearray(b"\x00")
    body += zigzag_varint(ts_delta) + zigzag_varint(offset_delta)
    for blob in (key, value):
        body += zigzag_varint(-1) if blob is None else zigzag_varint(len(blob)) + blob
    body += zigzag_varint(len(headers))
    for hk, hv in headers:
        k = hk.encode()
        body += zigzag_varint(len(k)) + k
        body += zigzag_varint(-1) if hv is None else zigzag_varint(len(hv)) + hv
    return zigzag_varint(len(body)) + bytes(body)


def compress(codec: int, data: bytes) -> bytes:
    if codec == 0:
        return data
    if codec == 1:
        return gzip.compress(data)
    if codec == 2:  # snappy-java stream framing, one block
        block = bytes(cramjam.snappy.compress_raw(data))
        return b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1) + struct.pack(">i", len(block)) + block
    if codec == 3:  # independent blocks, as Kafka's producers write them (Kafka's Java consumer refuses linked ones)
        return lz4.frame.compress(data, block_linked=False)
    if codec == 4:
        return bytes(cramjam.zstd.compress(data))
    raise ValueError(codec)


def encode_batch(
    base_offset: int,
    records: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]],
    *,
    base_timestamp: int = 1_700_000_000_000,
    codec: int = 0,
    attributes_extra: int = 0,
    leader_epoch: int = 0,
    producer_id: int = -1,
) -> bytes:
    raw = b"".join(encode_record(i, i, k, v, h) for i, (k, v, h) in enumerate(records))
    payload = compress(codec, raw)
    attributes = codec | attributes_extra
    last_delta = max(len(records) - 1, 0)
    after_crc = (
        struct.pack(
            ">hiqqqhii",
            attributes,
            last_delta,
            base_timestamp,
            base_timestamp + last_delta,
            producer_id,
            -1 if producer_id < 0 else 0,
            -1,
            len(records),
        )
        + payload
    )
    crc = crc32c.crc32c(after_crc)
    length = 4 + 1 + 4 + len(after_crc)
    return struct.pack(">qiibI", base_offset, length, leader_epoch, 2, crc) + after_crc


def sample_records(n: int, seed: int = 0) -> list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]]:
    out = []
    for i in range(n):
        key = None if (i + seed) % 4 == 0 else f"key-{seed}-{i}".encode()
        value = None if (i + seed) % 9 == 0 else bytes((i * 7 + j) % 256 for j in range(i % 300))
        headers = [("h1", b"x" * (i % 3)), ("h2", None)] if i % 2 else []
        out.append((key, value, headers))
    return out
