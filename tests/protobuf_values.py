"""Protobuf test values written by Google's own tools, not ours: the schemas compiled by ``protoc`` (grpcio-tools)
and the messages built, encoded and read back from JSON by Google's protobuf runtime; the registry's framing
written here from Confluent's description (magic byte 0, the schema id, the message indexes as zigzag
varints, ``[0]`` as a single 0)."""

from __future__ import annotations

import datetime
import os
import struct
import tempfile
from pathlib import Path
from typing import Any

import grpc_tools
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from grpc_tools import protoc

COMMON = """syntax = "proto3";
package shop.common;
message Money { string currency = 1; sint64 cents = 2; }
"""

ORDER_V1 = """syntax = "proto3";
package shop;
import "google/protobuf/timestamp.proto";
import "google/protobuf/wrappers.proto";
import "common.proto";

message Note { string text = 1; }

message Order {
  int64 id = 1;
  string customer = 2;
  double amount = 3;
  bool paid = 4;
  bytes blob = 5;
  enum Status { NEW = 0; PAID = 1; SHIPPED = 2; }
  Status status = 6;
  repeated string tags = 7;
  map<string, int32> counts = 8;
  google.protobuf.Timestamp at = 9;
  optional string note = 10;
  Item item = 11;
  oneof payment { string card = 12; int32 cash = 13; }
  google.protobuf.Int64Value maybe = 14;
  shop.common.Money price = 15;
  float ratio = 16;
  uint64 big = 17;
  message Item { string sku = 1; uint32 qty = 2; }
}
"""
# version 2 adds a field; its records hold it, version 1's give null
ORDER_V2 = ORDER_V1.replace("  message Item {", "  string channel = 18;\n  message Item {")
ORDER_INDEXES = [1]  # Order is the file's second message type
NOTE_INDEXES = [0]


def compile_proto(files: dict[str, str]) -> descriptor_pool.DescriptorPool:
    """``files`` (name -> .proto text; the last is the main one) compiled by protoc, with the well-known types."""
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in files.items():
            Path(tmp, name).write_text(text)
        out = Path(tmp, "set.pb")
        well_known = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
        code = protoc.main(["protoc", f"-I{tmp}", f"-I{well_known}", "--include_imports",
                            f"--descriptor_set_out={out}", list(files)[-1]])  # fmt: skip
        assert code == 0, f"protoc failed on {list(files)[-1]}"
        descriptors = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    pool = descriptor_pool.DescriptorPool()
    for file in descriptors.file:
        pool.Add(file)
    return pool


def message_class(pool: descriptor_pool.DescriptorPool, name: str) -> Any:
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(name))


def framed(schema_id: int, indexes: list[int], message: Any) -> bytes:
    head = struct.pack(">bi", 0, schema_id)
    path = [0] if indexes == [0] else [len(indexes), *indexes]
    return head + b"".join(_zigzag(i) for i in path) + message.SerializeToString()


def _zigzag(n: int) -> bytes:
    value, out = (n << 1) ^ (n >> 63), bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def order(cls: Any, n: int, version: int) -> Any:
    """Order ``n``: every kind of field, some left unset."""
    o = cls(id=n * 1_000_003 - 2**40, customer=f"c-{n % 17}" if n % 7 else "", amount=n / 100, paid=n % 2 == 0,
            blob=bytes([n % 256, 0, 255]) if n % 5 else b"", status=n % 3, tags=[f"t{i}" for i in range(n % 3)],
            ratio=n / 8, big=2**63 - n if n % 4 == 0 else n)  # fmt: skip
    for i in range(n % 3):
        o.counts[f"k{i}"] = n * i - 5
    if n % 6:
        o.at.FromDatetime(datetime.datetime(2026, 1, 1) + datetime.timedelta(seconds=n, microseconds=n % 1000 * 7))
    if n % 2:
        o.note = f"note {n}"
    if n % 3:
        o.item.sku, o.item.qty = f"sku-{n}", n % 50
    if n % 4 == 1:
        o.card = f"card-{n}"
    elif n % 4 == 2:
        o.cash = n
    if n % 5 == 0:
        o.maybe.value = -n
    if n % 8:
        o.price.currency, o.price.cents = "EUR", -n * 3
    if version == 2:
        o.channel = ["web", "app", ""][n % 3]
    return o
