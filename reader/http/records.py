"""Decoded records as JSON: the response models (they are the OpenAPI schema) and the conversion.

A record is what a Kafka consumer hands an application: offset, timestamp and its type, key, value,
headers (a list: Kafka allows repeated keys) and the batch's partition leader epoch (null when the
producer's broker did not set one). Control records are never delivered, as by a consumer. Bytes are
base64 unless the request asks for ``encoding=utf-8``; a key or value that is not UTF-8 then fails the
request with a message naming the offset (never a lossy substitution).
"""

from __future__ import annotations

import base64
from typing import Literal

from pydantic import BaseModel, Field

from reader.http.service import Page
from tiering_core.formats import decode_batch

Encoding = Literal["base64", "utf-8"]


class RecordHeader(BaseModel):
    key: str
    value: str | None


class JsonRecord(BaseModel):
    offset: int
    timestamp: int = Field(description="Milliseconds since the epoch.")
    timestamp_type: Literal["CreateTime", "LogAppendTime"]
    key: str | None
    value: str | None
    headers: list[RecordHeader]
    leader_epoch: int | None = Field(description="The partition leader epoch of the record's batch, if known.")


class RecordsPage(BaseModel):
    topic: str
    partition: int
    offset: int = Field(description="The offset asked for.")
    next_offset: int = Field(description="Where the next request continues (ask again from here).")
    remote_start_offset: int | None = Field(description="The partition's first offset in remote storage.")
    remote_end_offset: int | None = Field(
        description="The last offset in remote storage; the broker serves what follows."
    )
    last_stable_offset: int | None = Field(
        description="read_committed only: the page stopped at this transaction, whose outcome is not in "
        "remote storage yet (read it from the broker, or ask again later)."
    )
    isolation_level: Literal["read_uncommitted", "read_committed"]
    encoding: Encoding
    records: list[JsonRecord]


class NotUtf8(ValueError):
    """A key, value or header value is not valid UTF-8 and ``encoding=utf-8`` was asked for."""

    def __init__(self, offset: int, field: str) -> None:
        self.offset = offset
        super().__init__(f"the {field} of the record at offset {offset} is not valid UTF-8; ask with encoding=base64")


def _encoder(encoding: Encoding):
    if encoding == "base64":
        return lambda b, offset, field: None if b is None else base64.b64encode(b).decode("ascii")

    def utf8(b: bytes | None, offset: int, field: str) -> str | None:
        if b is None:
            return None
        try:
            return b.decode("utf-8")
        except UnicodeDecodeError:
            raise NotUtf8(offset, field) from None

    return utf8


def page_records(page: Page, encoding: Encoding, max_records: int, max_bytes: int) -> tuple[list[dict], int]:
    """The page's records from ``page.offset`` on as JSON-ready dicts, and the offset to continue at.

    Stops after ``max_records`` records or once the keys, values and headers reach ``max_bytes``
    (at least one record), so a response is bounded even when the batches were compressed.
    """
    encode = _encoder(encoding)
    out: list[dict] = []
    size = 0
    for h in page.headers:
        if h.is_control:
            continue
        epoch = h.partition_leader_epoch if h.partition_leader_epoch >= 0 else None
        ts_type = h.timestamp_type
        for r in decode_batch(page.key, page.data, h, verify_crc=False).records:  # CRCs checked by the fetch
            if r.offset < page.offset:
                continue
            if out and (len(out) >= max_records or size >= max_bytes):
                return out, r.offset
            headers = [{"key": k, "value": encode(v, r.offset, f"header {k!r}")} for k, v in r.headers]
            out.append({
                "offset": r.offset, "timestamp": r.timestamp, "timestamp_type": ts_type,
                "key": encode(r.key, r.offset, "key"), "value": encode(r.value, r.offset, "value"),
                "headers": headers, "leader_epoch": epoch,
            })  # fmt: skip
            size += len(r.key or b"") + len(r.value or b"") + sum(len(k) + len(v or b"") for k, v in r.headers)
    return out, page.next_offset
