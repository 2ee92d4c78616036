"""Data safety of the copy path on the real stack: a copy covers its segment exactly before local data goes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from click.testing import CliRunner
from confluent_kafka import OFFSET_BEGINNING, KafkaError, Message, Producer, TopicPartition

from deploy.kafka import run_kafka_tool
from deploy.stack import Endpoints
from reader import TieredConsumer, load_reader_settings
from segment_fsm import SegmentState
from tests.conftest import create_topic
from tests.export_readers import exported_rows
from tests.sidecar_harness import decoded_offsets, local_offsets, settings, snapshot_segments, wait_for, write_config
from tiering.cli.main import main
from tiering.sidecar.context import SidecarContext
from tiering.sidecar.runner import Sidecar
from tiering_core.formats import VALIDATION_WINDOW, scan_headers
from tiering_core.objects import SegmentRef

pytestmark = pytest.mark.integration
FINISHED = [SegmentState.COPY_SEGMENT_FINISHED]


def cli(*args: str) -> str:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, result.output
    return result.output


@contextmanager
def running(config: Path) -> Iterator[tuple[SidecarContext, Sidecar]]:
    ctx = SidecarContext.build(settings(config))
    sidecar = Sidecar(ctx)
    sidecar.start()
    try:
        yield ctx, sidecar
    finally:
        sidecar.stop()
        sidecar.close()


def produce_one_record_batches(bootstrap: str, topic: str, count: int, value_size: int) -> dict[int, bytes]:
    """``count`` records of ``value_size`` bytes, one per batch (so every batch has the same size);
    returns each acknowledged value by offset."""
    produced: dict[int, bytes] = {}
    producer = Producer({"bootstrap.servers": bootstrap, "batch.num.messages": 1, "linger.ms": 0,
                         "enable.idempotence": True, "compression.type": "none"})  # fmt: skip

    def report(err: object, msg: object) -> None:
        assert err is None, f"delivery failed: {err}"
        produced[msg.offset()] = msg.value()  # type: ignore[attr-defined]

    for i in range(count):
        value = f"{i:010d}|".encode().ljust(value_size, b"v")
        while True:
            try:
                producer.produce(topic, value=value, on_delivery=report)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(120) == 0 and len(produced) == count
    return produced


def test_window_edge_inside_a_zero_prefixed_batch_header_loses_nothing(stack: Endpoints, tmp_path: Path) -> None:
    """Issue 7.1: 1,366-byte batches in a 12 MiB segment put the 8 MiB validation window edge 2 bytes
    into a batch header whose first bytes are zero (a small base offset). The old scan took that for the end
    of data, uploaded 8 MiB, published COPY_SEGMENT_FINISHED for the whole segment, and local retention then
    deleted offsets 6141-9210 that were nowhere else."""
    topic = create_topic(stack.bootstrap, segment_bytes=12 << 20)
    produced = produce_one_record_batches(stack.bootstrap, topic, 9_300, value_size=1296)
    partition_dir = Path(stack.broker(1).log_dir) / f"{topic}-0"
    originals = snapshot_segments(partition_dir, tmp_path / "originals")
    assert list(originals) == [0], "expected one rolled segment"
    original = originals[0]
    edge = 8 << 20  # window edges fall at every multiple of VALIDATION_WINDOW (and of the 5 MiB part size)
    assert len(original) > edge and edge % VALIDATION_WINDOW == 0
    cut = next(h for h in scan_headers("original", original) if h.position < edge < h.position + h.size)
    assert 1 <= edge - cut.position <= 16 and not any(original[cut.position : edge]), (
        "the test data no longer puts a window edge inside a zero-prefixed batch header"
    )
    last_offset = max(decoded_offsets(original, "original"))

    config = write_config(stack, tmp_path)
    cli("topic", "enable", topic, "--local-retention-bytes", "1", "--config", str(config))
    with running(config) as (ctx, sidecar):
        topic_id = ctx.cluster.topics([topic])[topic].topic_id

        def released() -> bool:
            return ctx.cluster.local_offsets([(topic, 0)])[(topic, 0)].lx > last_offset

        wait_for(released, 180, "the segment to be uploaded and released locally", step=sidecar.tick)
        copies = ctx.manager.segments(topic_id, 0, FINISHED)
        lz = ctx.cluster.local_offsets([(topic, 0)])[(topic, 0)].lz

    assert len(copies) == 1 and (copies[0].base_offset, copies[0].end_offset) == (0, last_offset)
    ref = SegmentRef(topic, topic_id, 0, 0, uuid.UUID(bytes=copies[0].segment_id))
    manifest = ctx.copier.manifest(ref)
    assert (manifest.base_offset, manifest.end_offset, manifest.log_size) == (0, last_offset, len(original))
    body = ctx.store.get_bytes(ref.key("log"))
    assert body == original, f"the remote copy holds {len(body)} of the segment's {len(original)} bytes"
    combined = {o: v[1] for o, v in decoded_offsets(body, "remote").items()}
    combined.update({o: v[1] for o, v in local_offsets(partition_dir, last_offset + 1).items()})
    assert sorted(combined) == list(range(lz)), "offsets missing from remote + local"
    assert all(combined[o] == value for o, value in produced.items()), "a record differs from what was produced"


def roll_small_segment(bootstrap: str, topic: str, partition: int) -> None:
    """A small first segment (20 records, no index entry of its own), rolled by a record that does not fit."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for i in range(20):
        producer.produce(topic, value=f"small-{partition}-{i}".encode() * 5, partition=partition)
    assert producer.flush(60) == 0
    producer.produce(topic, value=b"r" * 65_000, partition=partition)
    assert producer.flush(60) == 0


def replace_file(path: Path, data: bytes) -> None:
    """Swap in new contents under the same name (the broker keeps its own mapping of the old file)."""
    tmp = path.with_name(path.name + ".test-tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def test_segment_without_time_index_entries_is_judged_by_its_file_time(stack: Endpoints, tmp_path: Path) -> None:
    """Issue 7.5: a rolled segment whose time index holds no entry (empty, or still the preallocated zeros
    Kafka writes before a roll completes) once gave max_timestamp -1 or 0: the copy expired at once under
    retention.ms and local.retention.ms never released it. Kafka judges such a segment by the file's
    modification time; so does the sidecar, locally and for the remote copy."""
    topic = create_topic(stack.bootstrap, 2, internal_segment_bytes=65536, retention_ms=3600 * 1000)
    dirs = [Path(stack.broker(1).log_dir) / f"{topic}-{p}" for p in (0, 1)]
    for p in (0, 1):
        roll_small_segment(stack.bootstrap, topic, p)
    first = [d / "00000000000000000000" for d in dirs]
    wait_for(lambda: all(f.with_suffix(".timeindex").stat().st_size == 12 for f in first), 30, "the rolls to end")
    originals = [f.with_suffix(".log").read_bytes() for f in first]
    replace_file(first[0].with_suffix(".timeindex"), b"")  # no entry: max_timestamp -1
    replace_file(first[1].with_suffix(".timeindex"), bytes(10485756))  # preallocated zeros: 0
    mtimes = [f.with_suffix(".log").stat().st_mtime_ns // 1_000_000 for f in first]
    record_max = [max(h.max_timestamp for h in scan_headers("original", o)) for o in originals]

    config = write_config(stack, tmp_path)
    cli("topic", "enable", topic, "--local-retention-ms", "1000", "--config", str(config))
    with running(config) as (ctx, sidecar):
        topic_id = ctx.cluster.topics([topic])[topic].topic_id
        ends = [len(decoded_offsets(o, "original")) for o in originals]

        def released() -> bool:
            local = ctx.cluster.local_offsets([(topic, 0), (topic, 1)])
            return all(local[(topic, p)].lx >= ends[p] for p in (0, 1))

        wait_for(released, 90, "local retention by time to release both small segments", step=sidecar.tick)
        for _ in range(3):
            sidecar.tick()
        for p in (0, 1):
            state = ctx.manager.partition_state(topic_id, p)
            assert state is not None and state.segment_counts["DELETE_SEGMENT_STARTED"] == 0
            assert state.segment_counts["DELETE_SEGMENT_FINISHED"] == 0, f"partition {p}: the copy expired at once"
            (copy,) = ctx.manager.segments(topic_id, p, FINISHED)
            assert copy.max_timestamp == mtimes[p], f"partition {p}: not judged by the file's modification time"
            ref = SegmentRef(topic, topic_id, p, 0, uuid.UUID(bytes=copy.segment_id))
            manifest = ctx.copier.manifest(ref)
            assert manifest.max_timestamp == record_max[p]
            assert manifest.leader_epoch == copy.leader_epoch >= 0  # the copying leader's, as the WAL's record
            assert ctx.store.get_bytes(ref.key("log")) == originals[p]


def kafka_delete_records(bootstrap: str, topic: str, partition: int, offset: int, tmp_path: Path) -> str:
    """What an operator runs: Kafka's own kafka-delete-records tool (DeleteRecordsCommand)."""
    spec = tmp_path / "delete-records.json"
    spec.write_text(json.dumps({"partitions": [{"topic": topic, "partition": partition, "offset": offset}],
                                "version": 1}))  # fmt: skip
    done = run_kafka_tool(
        "org.apache.kafka.tools.DeleteRecordsCommand", "--bootstrap-server", bootstrap, "--offset-json-file", str(spec)
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def first_event(consumer: TieredConsumer, timeout: float = 60) -> Message:
    """The first message or error event the consumer delivers."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        message = consumer.poll(1.0)
        if message is not None:
            return message
    raise AssertionError(f"nothing delivered within {timeout:.0f} s")


def test_user_delete_records_deletes_copies_below_it_and_local_retention_never_does(
    stack: Endpoints, tmp_path: Path
) -> None:
    """Issue 7.9: after kafka-delete-records, copies entirely below the new log start offset are deleted
    (KIP-405's rule) through DELETE_SEGMENT_*; the log start offsets our own local retention sets, before
    and after a sidecar restart, delete nothing remote."""
    topic = create_topic(stack.bootstrap, internal_segment_bytes=64 * 1024)
    produced = produce_one_record_batches(stack.bootstrap, topic, 2_500, value_size=300)
    config = write_config(stack, tmp_path)
    cli("topic", "enable", topic, "--local-retention-bytes", str(3 * 64 * 1024), "--config", str(config))

    def lx(ctx: SidecarContext) -> int:
        return ctx.cluster.local_offsets([(topic, 0)])[(topic, 0)].lx

    with running(config) as (ctx, sidecar):
        topic_id = ctx.cluster.topics([topic])[topic].topic_id
        wait_for(lambda: lx(ctx) > 1000, 120, "local retention to release most segments", step=sidecar.tick)
        produced.update(produce_one_record_batches(stack.bootstrap, topic, 1_000, value_size=300))
        start = lx(ctx)
        wait_for(lambda: lx(ctx) > start, 120, "local retention to release more", step=sidecar.tick)
    with running(config) as (ctx, sidecar):  # a restarted sidecar: its state comes from the WAL
        for _ in range(3):
            sidecar.tick()
        state = ctx.manager.partition_state(topic_id, 0)
        copies = ctx.manager.segments(topic_id, 0, FINISHED)
        assert state is not None and state.remote_start_offset == 0, "local retention deleted remote data"
        assert state.segment_counts["DELETE_SEGMENT_FINISHED"] == 0
        assert state.log_starts.local == lx(ctx) and state.log_starts.log_start == -1
        ry = state.remote_end_offset
        assert ry is not None and lx(ctx) <= ry

        # inside the local data that is also remote, and inside a copy (not at its base): that copy straddles it
        holder = ctx.manager.segment_for_offset(topic_id, 0, (lx(ctx) + ry) // 2)
        assert holder is not None
        user_start = max(lx(ctx) + 1, holder.base_offset + 1)
        assert holder.base_offset < user_start <= holder.end_offset
        kafka_delete_records(stack.bootstrap, topic, 0, user_start, tmp_path)
        assert lx(ctx) == user_start

        def applied() -> bool:
            s = ctx.manager.partition_state(topic_id, 0)
            return s is not None and s.log_starts.log_start == user_start and s.segment_counts[
                "DELETE_SEGMENT_STARTED"] == 0 and (s.remote_start_offset or 0) > 0  # fmt: skip

        wait_for(applied, 60, "copies below the user's log start offset to be deleted", step=sidecar.tick)
        kept = ctx.manager.segments(topic_id, 0, FINISHED)
        keys = set(ctx.store.list_keys(f"{topic}-{topic_id}/"))
    row = json.loads(cli("topic", "status", topic, "--json", "--config", str(config)))["partitions"][0]
    assert (row["log_start_offset"], row["Lx"]) == (user_start, user_start)
    gone = [c for c in copies if c.end_offset < user_start]
    stays = [c for c in copies if c.end_offset >= user_start]
    assert gone and stays
    assert any(c.base_offset < user_start for c in stays), "no kept copy straddles the user's log start"
    # Readers see the deletion as the broker does, also inside the copy that still holds deleted records.
    group = {"bootstrap.servers": stack.bootstrap, "enable.auto.commit": False}
    with TieredConsumer({**group, "group.id": f"g-{uuid.uuid4().hex[:6]}", "auto.offset.reset": "earliest"},
                        load_reader_settings(config)) as reader:  # fmt: skip
        reader.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        first = first_event(reader)
        assert first.error() is None and first.offset() == user_start
    with TieredConsumer({**group, "group.id": f"g-{uuid.uuid4().hex[:6]}", "auto.offset.reset": "error"},
                        load_reader_settings(config)) as reader:  # fmt: skip
        reader.assign([TopicPartition(topic, 0, user_start - 1)])
        event = first_event(reader)
        assert event.error() is not None and event.error().code() == KafkaError._AUTO_OFFSET_RESET, event.value()
    assert sorted(c.segment_id for c in kept) == sorted(c.segment_id for c in stays)
    # The Spark export leaves them out too: it starts at the user's log start, inside the straddling copy.
    out = tmp_path / "export"
    done = subprocess.run([sys.executable, "-m", "tiering", "export", topic, "--path", str(out), "--config",
                           str(config), "--master", "local[1]"], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", "")}, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    first, last = json.loads(done.stdout.strip().splitlines()[-1])["ranges"]["0"]
    assert (first, last) == (user_start, max(c.end_offset for c in stays))
    rows = exported_rows(str(out), "parquet", ["offset", "value"])
    assert {r["offset"]: r["value"] for r in rows} == {o: v for o, v in produced.items() if first <= o <= last}
    for c in copies:
        ref = SegmentRef(topic, topic_id, 0, c.base_offset, uuid.UUID(bytes=c.segment_id))
        assert (ref.key("log") in keys) == (c.end_offset >= user_start)
