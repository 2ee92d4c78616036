"""Shared pieces of the reader's integration tests: a topic tiered by a real sidecar, read back."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from click.testing import CliRunner

from deploy.stack import Endpoints
from reader import ReaderSettings, load_reader_settings
from tests.conftest import create_topic
from tests.sidecar_harness import Produced, produce_mixed, settings, wait_for, write_config
from tiering.cli.main import main
from tiering.sidecar.context import SidecarContext
from tiering.sidecar.runner import Sidecar

SEGMENT = 64 * 1024
LOCAL_RETENTION = 256 * 1024


@dataclass
class TieredTopic:
    """A topic whose older segments the sidecar uploaded and the broker deleted (log start > 0)."""

    topic: str
    config: Path
    produced: Produced
    ctx: SidecarContext
    sidecar: Sidecar
    by_partition: dict[int, Produced]

    def end_offset(self, partition: int = 0) -> int:
        return self.ctx.cluster.local_offsets([(self.topic, partition)])[(self.topic, partition)].lz

    def reader_settings(self, **overrides: object) -> ReaderSettings:
        return load_reader_settings(self.config, **overrides)

    def log_start(self, partition: int = 0) -> int:
        return self.ctx.cluster.local_offsets([(self.topic, partition)])[(self.topic, partition)].lx

    def remote_end(self, partition: int = 0) -> int | None:
        topic_id = self.ctx.cluster.topics([self.topic])[self.topic].topic_id
        state = self.ctx.manager.partition_state(topic_id, partition)
        return None if state is None else state.remote_end_offset


def expected(produced: Produced, read_committed: bool) -> dict[int, tuple]:
    """What a consumer must deliver: every produced record, without the aborted transaction under
    read_committed (produce_mixed's aborted records have keys ``txn-False-*``)."""
    return {o: r for o, r in produced.items() if not (read_committed and (r[0] or b"").startswith(b"txn-False-"))}


@contextmanager
def running_sidecar(config: Path) -> Iterator[tuple[SidecarContext, Sidecar]]:
    """A sidecar ticking in a background thread until the block ends."""
    ctx = SidecarContext.build(settings(config))
    sidecar = Sidecar(ctx)
    sidecar.start()
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            sidecar.tick()
            stop.wait(0.5)

    thread = threading.Thread(target=loop, name="test-sidecar", daemon=True)
    thread.start()
    try:
        yield ctx, sidecar
    finally:
        stop.set()
        thread.join(60)
        sidecar.stop()
        sidecar.close()


@contextmanager
def tiered_topic(stack: Endpoints, tmp_path: Path, records: int = 20_000, partitions: int = 1,
                 local_retention: int = LOCAL_RETENTION, segment_bytes: int = SEGMENT,
                 **config: object) -> Iterator[TieredTopic]:  # fmt: skip
    """Produce ``records`` mixed records per partition (every codec, headers, nulls, a committed and an
    aborted transaction) into segments of ``segment_bytes``, tier them with a real sidecar and wait until
    the broker's log start is past 0 everywhere. The sidecar keeps running while the block runs.
    ``produced`` is partition 0's."""
    topic = create_topic(stack.bootstrap, partitions, internal_segment_bytes=segment_bytes)
    batch = min(65536, segment_bytes // 2)  # a batch must fit in a segment
    by_partition = {p: produce_mixed(stack.bootstrap, topic, records, seed=p * records, partition=p, batch_bytes=batch)
                    for p in range(partitions)}  # fmt: skip
    produced = by_partition[0]
    path = write_config(stack, tmp_path, **config)
    result = CliRunner().invoke(
        main, ["topic", "enable", topic, "--local-retention-bytes", str(local_retention), "--config", str(path)]
    )
    assert result.exit_code == 0, result.output
    with running_sidecar(path) as (ctx, sidecar):
        tiered = TieredTopic(topic, path, produced, ctx, sidecar, by_partition)

        wait_for(
            lambda: all(tiered.log_start(p) > 0 for p in range(partitions)),
            300,
            "the sidecar to tier the topic and the broker to delete locally",
        )
        time.sleep(1)
        yield tiered
