"""The crash soak: ``tiering sidecar run`` killed by SIGKILL at many distinct points, restarted each time.

Segments of 12 MiB go up in 5 MiB parts (S3's smallest) at a capped rate, with local retention on and a
planted orphan object. Every life of the sidecar runs with every crash point not hit yet armed
(``TIERING_CRASH_AT``, ``tiering_core.crash_points``), so it dies at the first one it reaches and the next
life gets further: between parts, before and after each object and record of a copy, after a metadata
record is written, around local retention's delete_records, in the sweep (a deletion half done, orphans,
stale uploads) and while a metadata snapshot is written. A point is a place and its hit in that life
(``copy.part:4``: the fourth part read since the start). The phases differ in what is produced for the
sidecar: two segments waiting at the start of a life while copy points are armed, none for the sweep's (so
a life gets there at once), one and two more during the life for local retention's later ticks. Then one
life runs to the end, and everything produced must be read back exactly once, byte for byte, from the
remote copies and the broker's disk, with nothing left over in the store.
"""

from __future__ import annotations

import itertools
import os
import random
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, Message, Producer
from prometheus_client.parser import text_string_to_metric_families

from deploy.stack import Endpoints
from metadata.snapshot import SUFFIX
from segment_fsm import SegmentState
from tests.conftest import create_topic
from tests.integration.test_sidecar_crash import start_sidecar
from tests.integration.test_sidecar_policies import cli
from tests.sidecar_harness import decoded_offsets, local_offsets, settings, wait_for, write_config
from tiering.sidecar.context import SidecarContext
from tiering_core.crash_points import POINTS
from tiering_core.formats import list_segments
from tiering_core.objects import SegmentRef, partition_prefix

pytestmark = [pytest.mark.integration, pytest.mark.slow]
SEGMENT = 12 << 20
PART = 5 << 20
# The hits of each point armed. A copy dies at most two segments into a life; the sweep's hits need that many
# stale copies (or uploads) left by earlier lives at once; local retention runs once per tick with new copies.
HITS = {
    "copy.started": 2, "copy.part": 6, "copy.log_uploaded": 2, "copy.indexes_uploaded": 2,
    "copy.manifest_written": 2, "copy.finished": 2, "metadata.appended": 6,
    "local_retention.recorded": 3, "local_retention.deleted": 3,
    "delete.started": 3, "delete.objects_deleted": 3, "sweep.orphans": 1, "sweep.upload_abort": 3,
    "snapshot.written": 6, "snapshot.local": 6, "snapshot.remote": 6,
}  # fmt: skip
# (phase, its points, rolled segments waiting for the sidecar when a life starts, chunks produced during the
# life while fewer wait), in order; snapshot points fire in any
PHASES = [
    ("copy", ("copy.", "metadata."), 2, 0),
    ("sweep", ("delete.", "sweep."), 0, 0),
    ("local retention", ("local_retention.",), 1, 6),
    ("snapshot", ("snapshot.",), 1, 6),
]
CHUNK = SEGMENT // 2 // 8192  # records, about half a segment
CATEGORIES = {  # what the soak must reach, by point
    "copy": ("copy.started", "copy.log_uploaded", "copy.indexes_uploaded"),
    "between parts": ("copy.part",),
    "finish": ("copy.manifest_written", "metadata.appended", "copy.finished"),
    "retention": ("local_retention.recorded", "local_retention.deleted"),
    "sweep": ("delete.started", "delete.objects_deleted", "sweep.orphans", "sweep.upload_abort"),
    "snapshot": ("snapshot.written", "snapshot.local", "snapshot.remote"),
}
MIN_POINTS = 50
LIFE_SECONDS = 30  # a life that reaches no armed point in this long: its phase's points left are out of reach


def record(n: int) -> tuple[bytes, bytes, list[tuple[str, bytes | None]]]:
    """The n-th record produced: key, incompressible value of 4-12 KiB, and headers on some."""
    value = random.Random(n).randbytes(4096 + (n * 7919) % 8192)
    headers = [("n", str(n).encode()), ("none", None)] if n % 7 == 0 else []
    return f"{n:08d}".encode(), value, headers


class Workload:
    """Produces records: ``fill`` until ``wanted`` rolled segments wait for a copy, and in the background up to
    ``budget`` chunks more while fewer wait."""

    def __init__(self, bootstrap: str, topic: str, partition_dir: Path, remote_end: Callable[[], int | None]) -> None:
        self.topic = topic
        self.partition_dir = partition_dir
        self.remote_end = remote_end
        self.wanted = 0
        self.budget = 0
        self.lock = threading.Lock()
        self.produced: dict[int, int] = {}  # offset -> n
        self.errors: list[KafkaError] = []
        self.sent = 0
        common = {"bootstrap.servers": bootstrap, "linger.ms": 20, "acks": "all", "batch.size": 512 << 10,
                  "enable.idempotence": True}  # fmt: skip
        self.producers = [Producer({**common, "compression.type": codec}) for codec in ("none", "zstd")]
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="soak-producer", daemon=True)

    def waiting(self) -> int:
        ry = self.remote_end()
        return sum(1 for s in list_segments(self.partition_dir)[:-1] if ry is None or s.base_offset > ry)

    def fill(self) -> None:
        while self.waiting() < self.wanted:
            self.produce()

    def _run(self) -> None:
        while not self.stopped.wait(0.3):
            if self.budget > 0 and self.waiting() < self.wanted:
                self.budget -= 1
                self.produce()

    def produce(self) -> None:
        """One chunk of records, each codec in turn; every record acknowledged."""
        with self.lock:
            self._produce(self.producers[self.sent // CHUNK % 2])

    def _produce(self, producer: Producer) -> None:
        for n in range(self.sent, self.sent + CHUNK):
            key, value, headers = record(n)

            def delivered(err: KafkaError | None, msg: Message, n: int = n) -> None:
                if err is not None:
                    self.errors.append(err)
                else:
                    self.produced[msg.offset()] = n

            producer.produce(self.topic, key=key, value=value, headers=headers or None, partition=0,
                             on_delivery=delivered)  # fmt: skip
            producer.poll(0)
        assert producer.flush(60) == 0
        self.sent += CHUNK

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(60)
        assert not self.errors, self.errors[:3]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metric(port: int, name: str, topic: str) -> float | None:
    """The sidecar's sample of ``name`` for ``topic``; None before it serves /metrics or sets it."""
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    except urllib.error.URLError:
        return None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels.get("topic") == topic:
                return sample.value
    return None


def test_sigkill_at_every_crash_point_loses_nothing_and_leaves_nothing(stack: Endpoints, tmp_path: Path) -> None:
    began = time.monotonic()
    topic = create_topic(stack.bootstrap, segment_bytes=SEGMENT)
    port = free_port()
    config = write_config(
        stack, tmp_path, upload_bytes_per_second=5_000_000, copy_started_timeout_seconds=2,
        remote_log_manager_incomplete_upload_abort_ms=2000, snapshot_every_records=1, metrics_port=port,
    )  # fmt: skip
    assert settings(config).remote_storage.part_size == PART
    cli("topic", "enable", topic, "--local-retention-bytes", "0", "--config", str(config))
    observer = SidecarContext.build(settings(config), writes_snapshots=False)
    observer.manager.start()
    topic_id = observer.cluster.topics([topic])[topic].topic_id

    def remote_end() -> int | None:
        state = observer.manager.partition_state(topic_id, 0)
        return None if state is None else state.remote_end_offset

    partition_dir = Path(stack.broker(1).log_dir) / f"{topic}-0"
    orphan = f"{partition_prefix(topic, topic_id, 0)}/{0:020d}-{uuid.uuid4().hex}.log"
    observer.store.put_bytes(orphan, b"a copy no metadata knows")
    workload = Workload(stack.bootstrap, topic, partition_dir, remote_end)
    workload.thread.start()
    armed = {f"{point}:{hit}" for point, hits in HITS.items() for hit in range(1, hits + 1)}
    sidecar_points = {p for p in POINTS if not p.startswith("export.")}  # the export's own: its tests arm them
    assert {p.split(":")[0] for p in armed} == sidecar_points
    crash_log, log = tmp_path / "crashes.txt", tmp_path / "sidecar.log"
    hit: list[str] = []
    unreached: list[str] = []
    lives: Counter[str] = Counter()  # per phase
    proc = None
    try:
        while armed:
            phase, points, workload.wanted, chunks = next(p for p in PHASES if any(a.startswith(p[1]) for a in armed))
            workload.budget = 0
            workload.fill()
            workload.budget = chunks
            lives[phase] += 1
            proc = start_sidecar(config, log, TIERING_CRASH_AT=",".join(sorted(armed)),
                                 TIERING_CRASH_LOG=str(crash_log))  # fmt: skip
            try:
                code = proc.wait(LIFE_SECONDS)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
                unreached += sorted(a for a in armed if a.startswith(points))
                armed.difference_update(unreached)
                continue
            assert code == -signal.SIGKILL, f"the sidecar exited with {code}: {log.read_text()[-3000:]}"
            point = crash_log.read_text().splitlines()[-1]
            assert point in armed and len(crash_log.read_text().splitlines()) == len(hit) + 1
            armed.remove(point)
            hit.append(point)
        workload.stop()
        soak_seconds = time.monotonic() - began
        print(f"\ncrash soak: SIGKILL at {len(hit)} distinct crash points in {lives.total()} lives ({dict(lives)}), "
              f"{soak_seconds:.0f} s, {workload.sent} records; not reached: {unreached}")  # fmt: skip

        proc = start_sidecar(config, log)  # the last life, with no crash point
        last_rolled = list_segments(partition_dir)[-1].base_offset - 1

        def settled() -> bool:
            state = observer.manager.partition_state(topic_id, 0)
            counts = state.segment_counts
            keys = observer.store.list_keys("")
            return (
                state is not None and state.remote_end_offset == last_rolled
                and counts["COPY_SEGMENT_STARTED"] == 0 and counts["DELETE_SEGMENT_STARTED"] == 0
                and orphan not in keys and observer.store.incomplete_uploads("") == []
                and observer.cluster.local_offsets([(topic, 0)])[(topic, 0)].lx == last_rolled + 1
            )  # fmt: skip

        wait_for(settled, 300, "the last life to copy, release, sweep and abort everything")
        finished = observer.manager.segments(topic_id, 0, [SegmentState.COPY_SEGMENT_FINISHED])
        stored = sum(observer.store.head(ref(topic, topic_id, s).key("log")) or 0 for s in finished)
        assert stored == sum(s.size for s in finished)
        for name in ("tiering_remote_log_size_bytes", "tiering_remote_stored_bytes"):
            wait_for(lambda name=name: metric(port, name, topic) == stored, 30, f"{name} to equal the bytes stored")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text()[-3000:]
        state = observer.manager.partition_state(topic_id, 0)
        keys = set(observer.store.list_keys(""))
        uploads = observer.store.incomplete_uploads("")
    finally:
        workload.stopped.set()
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        observer.close()

    assert len(hit) >= MIN_POINTS, f"only {len(hit)} crash points were hit: {hit}"
    for category, points in CATEGORIES.items():
        assert any(h.split(":")[0] in points for h in hit), f"no crash point of the {category} was hit: {hit}"
    assert "sweep.upload_abort:1" in hit and "sweep.orphans:1" in hit, "the soak never left what it must sweep"
    assert state.segment_counts["DELETE_SEGMENT_FINISHED"] >= 1
    assert state.segment_counts["COPY_SEGMENT_STARTED"] == state.segment_counts["DELETE_SEGMENT_STARTED"] == 0
    assert uploads == [], "incomplete multipart uploads remain"
    copies = {k for s in finished for k in ref(topic, topic_id, s).object_keys()}
    snapshots = {k for k in keys if k.startswith("metadata-snapshots/") and k.endswith(SUFFIX)}
    assert keys - snapshots == copies, "orphan objects remain (or a finished copy lost an object)"

    # every offset produced, read back exactly once: the finished copies, then the broker's disk above them
    assert finished[0].base_offset == 0
    assert all(a.end_offset + 1 == b.base_offset for a, b in itertools.pairwise(finished)), "copies overlap or skip"
    read: dict[int, tuple] = {}
    for seg in finished:
        key = ref(topic, topic_id, seg).key("log")
        records = decoded_offsets(observer.store.get_bytes(key), key)
        assert sorted(records) == list(range(seg.base_offset, seg.end_offset + 1)), f"{key} misses offsets"
        read.update(records)
    local = local_offsets(partition_dir, last_rolled + 1)
    assert not local.keys() & read.keys()
    read.update(local)
    assert sorted(read) == sorted(workload.produced) == list(range(len(workload.produced))), "offsets differ"
    for offset, n in workload.produced.items():
        key, value, headers = record(n)
        assert read[offset] == (key, value, headers, False), f"offset {offset} differs from record {n}"


def ref(topic: str, topic_id: str, seg: object) -> SegmentRef:
    return SegmentRef(topic, topic_id, 0, seg.base_offset, uuid.UUID(bytes=seg.segment_id))
