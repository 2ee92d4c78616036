"""The broker's Fetch request written over the client's bytes is byte for byte what kio encodes for it, at every
version the proxy handles; a request whose layout changes (a fetch session's forgotten topics) is left to kio."""

from __future__ import annotations

import dataclasses
import datetime
import uuid

import pytest
from kio.static.primitive import i32, i64

from reader.proxy.fetch_request import patched_fetch_request
from reader.proxy.protocol import (
    ProtocolError,
    build,
    nested,
    new_request,
    read_request_head,
    request_frame,
    request_type,
)

VERSIONS = range(4, 19)


def _request(version: int, forgotten: bool = False) -> tuple[bytes, object]:
    request = request_type(1, version)
    topic_type = nested(request, "topics")
    part_type = nested(topic_type, "partitions")
    topics = tuple(
        build(topic_type, topic=name, topic_id=uuid.UUID(int=n + 1), partitions=tuple(
            build(part_type, partition=i32(p), current_leader_epoch=i32(4), fetch_offset=i64(1000 * p + n),
                  last_fetched_epoch=i32(3), log_start_offset=i64(-1), partition_max_bytes=i32(1 << 20),
                  replica_directory_id=uuid.UUID(int=0))
            for p in range(3)))
        for n, name in enumerate(("orders", "ünïcode-topic"))
    )  # fmt: skip
    values = dict(replica_id=i32(-1), max_wait=datetime.timedelta(milliseconds=500), min_bytes=i32(1),
                  max_bytes=i32(50 << 20), isolation_level=1, session_id=i32(77), session_epoch=i32(5), topics=topics,
                  forgotten_topics_data=(), rack_id="rack-a", cluster_id=None)  # fmt: skip
    if forgotten and version >= 7:
        forgotten_type = nested(request, "forgotten_topics_data")
        values["forgotten_topics_data"] = (build(forgotten_type, topic="gone", topic_id=uuid.UUID(int=9),
                                                 partitions=(i32(0),)),)  # fmt: skip
    body = build(request, **values)
    return new_request(1, version, 12, "client-1", body), body


def _as_planned(version: int, body) -> object:  # type: ignore[no-untyped-def]
    """What FetchPlan.make changes: probes, a hole moved, sessionless, no wait, a smaller max_bytes."""
    topics = []
    for t in body.topics:
        parts = []
        for p in t.partitions:
            if p.partition == 1:  # a probe
                changes = {"fetch_offset": i64(123456789), "partition_max_bytes": i32(0)}
                if version >= 12:
                    changes["last_fetched_epoch"] = i32(-1)
                p = dataclasses.replace(p, **changes)
            elif p.partition == 2:  # a hole moved to the log start
                p = dataclasses.replace(p, fetch_offset=i64(5000))
            parts.append(p)
        topics.append(dataclasses.replace(t, partitions=tuple(parts)))
    changes = {"topics": tuple(topics), "max_wait": datetime.timedelta(0), "max_bytes": i32(1 << 20)}
    if version >= 7:
        changes.update(session_id=i32(0), session_epoch=i32(-1), forgotten_topics_data=())
    return dataclasses.replace(body, **changes)


@pytest.mark.parametrize("version", VERSIONS)
def test_the_patched_request_is_what_kio_encodes(version: int) -> None:
    frame, body = _request(version)
    head = read_request_head(frame)
    upstream = _as_planned(version, body)
    patched = patched_fetch_request(frame, head.body, version, upstream)
    assert patched == request_frame(head, frame, upstream)
    assert patched_fetch_request(frame, head.body, version, body) == frame  # nothing changed: the same bytes


@pytest.mark.parametrize("version", range(7, 19))
def test_a_request_with_forgotten_topics_is_left_to_kio(version: int) -> None:
    frame, body = _request(version, forgotten=True)
    head = read_request_head(frame)
    assert patched_fetch_request(frame, head.body, version, _as_planned(version, body)) is None


def test_a_topic_left_out_is_left_to_kio_and_a_short_frame_is_a_protocol_error() -> None:
    frame, body = _request(13)
    head = read_request_head(frame)
    fewer = dataclasses.replace(body, topics=body.topics[:1])
    assert patched_fetch_request(frame, head.body, 13, fewer) is None
    with pytest.raises(ProtocolError):
        patched_fetch_request(frame[: head.body + 30], head.body, 13, body)
