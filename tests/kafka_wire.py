"""A Kafka-protocol client on a plain socket, for tests that must see exactly what a server answers: no
client library in between to hide an error, retry, or refuse to send a request before it logged in.
Requests and answers are ``kio`` entities (the schemas the access layer itself uses)."""

from __future__ import annotations

import datetime
import socket
import struct
import uuid
from collections.abc import Callable
from typing import Any

from kio.static.primitive import i8, i32, i64

from reader.proxy.protocol import build, nested, new_request, parse, request_type, response_body_start, response_type

FETCH, LIST_OFFSETS, METADATA, SASL_HANDSHAKE, SASL_AUTHENTICATE = 1, 2, 3, 17, 36
_SIZE = struct.Struct(">i")


def read_exactly(sock: socket.socket, n: int) -> bytes:
    """``n`` bytes from a blocking socket (fails where it closes first)."""
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        assert chunk, "the peer closed the connection"
        data += chunk
    return data


class RawKafka:
    """One connection; ``request`` returns the parsed answer, or None when the server closed the connection."""

    def __init__(self, address: str, timeout: float = 30) -> None:
        host, _, port = address.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout)
        self.correlation = 0
        self.received = 0  # bytes of answers read, size prefixes included

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawKafka:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request_frame(self, api_key: int, version: int, fields: dict[str, Any],
                       change: Callable[[bytes], bytes] | None = None) -> bytes:  # fmt: skip
        self.correlation += 1
        frame = new_request(
            api_key, version, self.correlation, "raw-test", build(request_type(api_key, version), **fields)
        )
        if change is not None:  # what a client the project's schemas do not know would send
            frame = change(frame)
        return _SIZE.pack(len(frame)) + frame

    def send(self, api_key: int, version: int, **fields: Any) -> None:
        """Send a request and do not read its answer (a client that pipelines and never reads)."""
        self.sock.sendall(self._request_frame(api_key, version, fields))

    def request(self, api_key: int, version: int, change: Callable[[bytes], bytes] | None = None,
                **fields: Any) -> Any | None:  # fmt: skip
        """Send a request (its frame passed through ``change`` first, if given) and parse its answer."""
        try:
            self.sock.sendall(self._request_frame(api_key, version, fields, change))
            answer = self._frame()
        except (ConnectionError, OSError):
            return None
        if answer is None:
            return None
        assert _SIZE.unpack_from(answer, 0)[0] == self.correlation, "answer to another request"
        return parse(response_type(api_key, version), answer, response_body_start(answer, api_key, version))

    def _frame(self) -> bytes | None:
        head = self._exactly(4)
        if head is None:
            return None
        (size,) = _SIZE.unpack(head)
        return self._exactly(size)

    def _exactly(self, n: int) -> bytes | None:
        chunks, got = [], 0
        while got < n:
            chunk = self.sock.recv(min(n - got, 1 << 20))
            if not chunk:
                return None
            chunks.append(chunk)
            got += len(chunk)
            self.received += len(chunk)
        return b"".join(chunks)

    def sasl_plain(self, user: str, password: str) -> int:
        """SaslHandshake v1 and SaslAuthenticate v2 with PLAIN; the broker's error code (0: logged in)."""
        shake = self.request(SASL_HANDSHAKE, 1, mechanism="PLAIN")
        assert shake is not None and shake.error_code == 0, shake
        token = b"\0" + user.encode() + b"\0" + password.encode()
        answer = self.request(SASL_AUTHENTICATE, 2, auth_bytes=token)
        return -1 if answer is None else int(answer.error_code)

    def metadata(self, topic: str) -> Any | None:
        """Metadata v12 for one topic (its id, leaders)."""
        topic_type = nested(request_type(METADATA, 12), "topics")
        return self.request(METADATA, 12, topics=(build(topic_type, topic_id=None, name=topic),),
                            allow_auto_topic_creation=False, include_topic_authorized_operations=False)  # fmt: skip

    def fetch(self, version: int, topic: str, topic_id: uuid.UUID, partition: int, offset: int,
              max_bytes: int = 1 << 20) -> Any | None:  # fmt: skip
        """One sessionless Fetch of one partition (by name up to v12, by id from v13)."""
        return self.fetch_many(version, topic, topic_id, {partition: offset}, max_bytes, max_bytes)

    def fetch_many(self, version: int, topic: str, topic_id: uuid.UUID, offsets: dict[int, int], max_bytes: int,
                   partition_max_bytes: int = 1 << 20) -> Any | None:  # fmt: skip
        """One sessionless Fetch of several partitions of a topic, in the order of ``offsets``."""
        return self.request(FETCH, version, **fetch_fields(version, topic, topic_id, offsets, max_bytes,
                                                           partition_max_bytes))  # fmt: skip


def fetch_fields(version: int, topic: str, topic_id: uuid.UUID, offsets: dict[int, int], max_bytes: int,
                 partition_max_bytes: int = 1 << 20) -> dict[str, Any]:  # fmt: skip
    """The fields of a sessionless Fetch of several partitions of a topic, in the order of ``offsets``."""
    request = request_type(FETCH, version)
    topic_type = nested(request, "topics")
    part_type = nested(topic_type, "partitions")
    parts = tuple(build(part_type, partition=i32(p), current_leader_epoch=i32(-1), fetch_offset=i64(o),
                        last_fetched_epoch=i32(-1), log_start_offset=i64(-1),
                        partition_max_bytes=i32(partition_max_bytes)) for p, o in offsets.items())  # fmt: skip
    return {"replica_id": i32(-1), "max_wait": datetime.timedelta(milliseconds=100), "min_bytes": i32(1),
            "max_bytes": i32(max_bytes), "isolation_level": i8(0), "session_id": i32(0), "session_epoch": i32(-1),
            "topics": (build(topic_type, topic=topic, topic_id=topic_id, partitions=parts),),
            "forgotten_topics_data": (), "rack_id": ""}  # fmt: skip


def record_bytes(answer: Any) -> int:
    """Bytes of record batches in a Fetch answer, over every partition."""
    return sum(len(p.records or b"") for t in answer.responses for p in t.partitions)


def partition_errors(answer: Any) -> list[int]:
    return [int(p.error_code) for t in answer.responses for p in t.partitions]


def batch_count(records: bytes | None) -> int:
    """Record batches in a partition's records (each: base offset int64, then its length int32)."""
    count, pos, data = 0, 0, records or b""
    while pos + 12 <= len(data):
        pos += 12 + int.from_bytes(data[pos + 8 : pos + 12], "big", signed=True)
        count += 1
    return count


def list_earliest(topic: str, partitions: list[int]) -> dict[str, Any]:
    """ListOffsets v7 EARLIEST (-2) for ``partitions``: the remote start, from the catalog."""
    topic_type = nested(request_type(LIST_OFFSETS, 7), "topics")
    part_type = nested(topic_type, "partitions")
    parts = tuple(build(part_type, partition_index=i32(p), current_leader_epoch=i32(-1), timestamp=i64(-2))
                  for p in partitions)  # fmt: skip
    return {"replica_id": i32(-1), "isolation_level": i8(0),
            "topics": (build(topic_type, name=topic, partitions=parts),)}  # fmt: skip
