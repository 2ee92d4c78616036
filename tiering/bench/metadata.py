"""``tiering bench metadata``: WAL replay, snapshots and recovery at a million segments.

In one run, on the real broker: a metadata history of ``--segments`` segment copies (each
COPY_SEGMENT_STARTED then COPY_SEGMENT_FINISHED, spread over many partitions) is written to a fresh
WAL topic; a snapshot is taken after most of it and the rest becomes the WAL tail. Then:

- full replay from offset 0 (what Kafka's own topic-based metadata manager does on every start);
- recovery from the snapshot plus the tail (what we do), the median of three runs;
- snapshot write and load seconds, and resident bytes per segment (measured in a child process
  that loads the snapshot, so nothing else in this process is counted).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import click

from deploy.bench_stack import bench_stack, stack_dir_option
from metadata import MetadataManager, MetadataWal, SegmentRecord
from metadata.records import EPOCH_ENTRY, unparse
from metadata.snapshot import load_snapshot
from segment_fsm import SegmentState
from tiering_core.kafka_logs import admin_client
from tiering_core.logs import get_logger

log = get_logger(__name__)

STARTED = int(SegmentState.COPY_SEGMENT_STARTED)
FINISHED = int(SegmentState.COPY_SEGMENT_FINISHED)
_RSS_PROBE = """
import gc, sys, psutil
from pathlib import Path
from metadata.snapshot import load_snapshot
gc.collect()
before = psutil.Process().memory_info().rss
state = load_snapshot(Path(sys.argv[1])).state
gc.collect()
after = psutil.Process().memory_info().rss
print(after - before, state.segment_count())
"""


def _history(wal: MetadataWal, first: int, count: int, partitions: int) -> int:
    """Write ``count`` segments' STARTED + FINISHED records; returns the number of records.

    Payloads are built from raw fields (``unparse``), the bulk-writer path: building a pydantic
    model per record would make the benchmark's setup, not the WAL, the slow part.
    """
    topic_id = bytes(16)
    for i in range(first, first + count):
        partition = i % partitions
        wal_partition = wal.partition_of(topic_id, partition)
        base = (i // partitions) * 1000
        sid = (i + 1).to_bytes(16, "big")
        epochs = EPOCH_ENTRY.pack(1, base)
        for state in (STARTED, FINISHED):
            fields = (1, 1, 0, i, topic_id, partition, sid, state, base, base + 999, i, i, 1 << 20, "bench", epochs)
            wal.produce_async(wal_partition, unparse(SegmentRecord.TYPE, fields))
    wal.flush()
    return 2 * count


def _timed_recovery(bootstrap: str, topic: str, snapshot_dir: Path) -> tuple[float, MetadataManager]:
    manager = MetadataManager(MetadataWal(bootstrap, topic=topic), snapshot_dir)
    start = time.perf_counter()
    manager.start(follow=False)
    seconds = time.perf_counter() - start
    manager.wal.close()
    return seconds, manager


def _delete_topic(bootstrap: str, topic: str) -> None:
    admin = admin_client({"bootstrap.servers": bootstrap})
    try:
        admin.delete_topics([topic])[topic].result(60)
    except Exception as exc:  # never hide the benchmark's own error behind a cleanup failure
        log.warning("deleting the benchmark's WAL topic failed", topic=topic, error=str(exc))


def _measure(bootstrap: str, topic: str, tmp: Path, segments: int, partitions: int, tail: int) -> list[dict]:
    """Write the history, take the snapshot, time both recoveries; the JSON lines, summary last."""
    wal = MetadataWal(bootstrap, topic=topic)
    wal.ensure_topic()
    t0 = time.perf_counter()
    records = _history(wal, 0, segments - tail, partitions)
    write_s = time.perf_counter() - t0
    _, before = _timed_recovery(bootstrap, topic, tmp / "unused")
    t0 = time.perf_counter()
    snapshot = before.snapshot_now()
    snapshot_write_s = time.perf_counter() - t0
    records += _history(wal, segments - tail, tail, partitions)
    wal.close()

    t0 = time.perf_counter()
    load_snapshot(snapshot)
    snapshot_load_s = time.perf_counter() - t0
    full_s, full = _timed_recovery(bootstrap, topic, tmp / "empty")
    runs = [_timed_recovery(bootstrap, topic, snapshot.parent) for _ in range(3)]
    snap_s = statistics.median(seconds for seconds, _ in runs)  # short runs are noisier: median of 3
    recovered = runs[-1][1]
    if full.state.digest() != recovered.state.digest():
        raise click.ClickException("snapshot recovery and full replay disagree")
    probe = subprocess.run(
        [sys.executable, "-c", _RSS_PROBE, str(snapshot)], capture_output=True, text=True, check=True
    )
    rss_delta, loaded_segments = (int(x) for x in probe.stdout.split())
    return [
        {"measure": "history", "segments": segments, "records": records, "partitions": partitions,
         "tail_records": 2 * tail, "write_s": round(write_s, 3)},
        {"measure": "full_replay", "seconds": round(full_s, 3), "records_s": round(records / full_s)},
        {"measure": "snapshot_recovery", "seconds": round(snap_s, 3), "runs_s": [round(r[0], 3) for r in runs],
         "source": recovered.recovered_from},
        {"measure": "snapshot", "bytes": snapshot.stat().st_size, "write_s": round(snapshot_write_s, 3),
         "load_s": round(snapshot_load_s, 3)},
        {"measure": "memory", "segments_loaded": loaded_segments, "rss_delta_bytes": rss_delta},
        {"ratio": round(full_s / snap_s, 2), "bytes_per_segment": round(rss_delta / loaded_segments, 1),
         "replay_records_s": round(records / full_s), "full_replay_s": round(full_s, 3),
         "snapshot_recovery_s": round(snap_s, 3), "snapshot_write_s": round(snapshot_write_s, 3),
         "snapshot_load_s": round(snapshot_load_s, 3)},
    ]  # fmt: skip


@click.command()
@click.option(
    "--segments",
    type=click.IntRange(1000, 10_000_000),
    default=1_000_000,
    show_default=True,
    help="Segment copies in the history (two WAL records each).",
)
@click.option(
    "--partitions",
    type=click.IntRange(1, 100_000),
    default=1000,
    show_default=True,
    help="User partitions the segments are spread over.",
)
@click.option(
    "--tail-percent",
    type=click.FloatRange(0, 50),
    default=1.0,
    show_default=True,
    help="Share of the history written after the snapshot (replayed from the WAL on recovery).",
)
@stack_dir_option
def metadata(segments: int, partitions: int, tail_percent: float, stack_dir: Path | None) -> None:
    """Metadata recovery: snapshot + WAL tail beside a full WAL replay, at a million segments.

    The last line is a JSON object with `ratio` (full-replay seconds / snapshot-recovery seconds),
    `bytes_per_segment` and `replay_records_s`. Targets: ratio >= 20, <= 500 bytes per segment,
    replay >= 100k records/s.
    """
    tail = int(segments * tail_percent / 100)
    with bench_stack(stack_dir) as endpoints, tempfile.TemporaryDirectory(prefix="tiering-bench-md-") as tmp:
        topic = f"__tiering_metadata_bench_{uuid.uuid4().hex[:8]}"
        try:
            lines = _measure(endpoints.bootstrap, topic, Path(tmp), segments, partitions, tail)
        finally:  # a reused stack keeps running: do not leave a million records behind
            _delete_topic(endpoints.bootstrap, topic)
    for line in lines:
        click.echo(json.dumps(line))
