"""Fencing of writers: leader epochs from Kafka and lease tokens from etcd.

Each transition carries the writer's broker id, the partition's leader epoch when it was written,
and a fencing token (the create revision of the writer's etcd lease key, 0 without etcd). A
partition remembers the highest epoch and token it has accepted; a record below either is from a
writer that has been replaced, and is rejected. Equal values are accepted (same writer, retries).
"""

from __future__ import annotations

from typing import NamedTuple


class Fence(NamedTuple):
    leader_epoch: int
    token: int


def fence_rejection(seen: Fence, record: Fence, broker_id: int) -> str | None:
    """None when ``record`` may be applied to a partition that has seen ``seen``, else why not."""
    if record.leader_epoch < seen.leader_epoch:
        return f"fenced: broker {broker_id} wrote with leader epoch {record.leader_epoch} < {seen.leader_epoch}"
    if record.token < seen.token:
        return f"fenced: broker {broker_id} wrote with lease token {record.token} < {seen.token}"
    return None


def advance(seen: Fence, record: Fence) -> Fence:
    """The partition's fence after accepting ``record``."""
    return Fence(max(seen.leader_epoch, record.leader_epoch), max(seen.token, record.token))
