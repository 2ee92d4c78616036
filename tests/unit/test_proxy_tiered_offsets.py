"""The broker's offsets as ``TieredView`` caches them (``reader/proxy/tiered.py``): a read on the event loop
(``block=False``) takes only a young cached answer and never asks the cluster."""

from __future__ import annotations

import time
import uuid
from types import SimpleNamespace

import pytest

from reader.errors import WouldBlock
from reader.proxy.tiered import TieredView, TopicKey
from tiering_core.kafka_cluster import LocalOffsets

TOPIC = TopicKey("t", uuid.uuid4())


class Cluster:
    def __init__(self) -> None:
        self.asked: list[list[tuple[str, int]]] = []

    def local_offsets(self, partitions: list[tuple[str, int]]) -> dict[tuple[str, int], LocalOffsets]:
        self.asked.append(list(partitions))
        return {key: LocalOffsets(lx=100, ly=150, lz=160, leader_epoch=0) for key in partitions}


def test_a_read_that_may_not_wait_takes_a_young_cached_answer_and_never_asks_the_cluster() -> None:
    cluster = Cluster()
    view = TieredView(SimpleNamespace(catalog=None), cluster, cache_seconds=0.2, cursors=4,  # type: ignore[arg-type]
                      memory_wait=1.0)  # fmt: skip
    with pytest.raises(WouldBlock):
        view.broker_offsets(TOPIC, 0, block=False)  # nothing cached
    assert cluster.asked == []
    asked = view.broker_offsets(TOPIC, 0)  # may wait: asks
    assert cluster.asked == [[("t", 0)]]
    assert view.broker_offsets(TOPIC, 0, block=False) == asked  # cached and young: no request
    with pytest.raises(WouldBlock):
        view.broker_offsets(TOPIC, 0, fresh=True, block=False)  # asked fresh: it would ask
    with pytest.raises(WouldBlock):
        view.refresh_offsets([(TOPIC, 0), (TOPIC, 1)], block=False)  # one of them not cached
    time.sleep(0.25)
    with pytest.raises(WouldBlock):
        view.broker_offsets(TOPIC, 0, block=False)  # too old now
    assert cluster.asked == [[("t", 0)]]
