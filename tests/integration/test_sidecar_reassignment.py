"""Partition reassignment on three brokers, one sidecar each, while a producer writes: a tiered partition moves
to another broker (kafka-reassign-partitions), its replicas expand to three, then shrink to one on a third broker.

Each new leader's sidecar continues from the remote end with no gap, no duplicate copy is left, no object
that no finished copy owns, no copy half done and no multipart upload pending; followers delete locally what
the leader's sidecar released; readers started before the moves (TieredConsumer, a consumer through the access
layer) and after them (TieredConsumer, the HTTP fetch service, the access layer) read every produced offset
once, byte for byte. And the smoke test of ``tiering bench reassign``."""

from __future__ import annotations

import itertools
import json
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from deploy.stack import Endpoints
from reader import TieredConsumer, load_reader_settings
from segment_fsm import SegmentState
from tests.integration.test_reader_http import decode_independently, start_service
from tests.integration.test_sidecar_policies import cli
from tests.proxy_harness import check_exact, proxy_bootstrap, proxy_for, read_all
from tests.sidecar_harness import settings, sidecars_running, wait_for, write_config
from tiering.bench.reassign import reassign
from tiering.cli.main import main
from tiering.sidecar.context import SidecarContext
from tiering_core.formats import list_segments
from tiering_core.kafka_cluster import KafkaClusterError, LocalOffsets
from tiering_core.objects import SegmentRef
from tiering_core.produce import produce_waiting

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SEGMENT = 64 * 1024
LOCAL_RETENTION = 4 * SEGMENT
Record = tuple[bytes, bytes]


class Writer:
    """Produces records of ~90 bytes at about 40 KB/s (a 64 KiB segment rolls every 2 s) until stopped; keeps
    each acknowledged record by offset."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.produced: dict[int, Record] = {}
        self.errors: list[object] = []
        self.stopped = threading.Event()
        self._producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                                   "linger.ms": 5, "batch.size": 16384})  # fmt: skip
        self._topic = topic
        self._thread = threading.Thread(target=self._run, name="writer", daemon=True)
        self._thread.start()

    def _report(self, err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            self.errors.append(err)
        else:
            self.produced[msg.offset()] = (msg.key(), msg.value())

    def _run(self) -> None:
        n = 0
        try:
            while not self.stopped.is_set():
                for _ in range(50):
                    value = f"record-{n}-".encode() * (1 + n % 9)
                    produce_waiting(self._producer, self._topic, key=str(n).encode(), value=value, partition=0,
                                    on_delivery=self._report)  # fmt: skip
                    n += 1
                self._producer.poll(0.1)
        except Exception as exc:  # reported by stop() and alive()
            self.errors.append(exc)

    def alive(self) -> bool:
        assert not self.errors, f"the writer failed: {self.errors[:3]}"
        return self._thread.is_alive()

    def stop(self) -> dict[int, Record]:
        self.stopped.set()
        self._thread.join(60)
        assert self._producer.flush(120) == 0 and not self.errors, self.errors[:3]
        return self.produced


class Reader:
    """Reads the partition from offset 0 in a thread, ``pause`` seconds after every call (slowly by default, so
    that the moves happen while it is in the remote part), until told the last offset and past it."""

    def __init__(self, name: str, make: Callable[[], Any], topic: str, pause: float = 0.05) -> None:
        self.got: list[tuple[int, Record]] = []
        self.errors: list[object] = []
        self.last: int | None = None
        self.stopping = threading.Event()  # set when the test ends early: the consumer is closed all the same
        self._make, self._topic, self._pause = make, topic, pause
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        consumer = self._make()
        try:
            consumer.assign([TopicPartition(self._topic, 0, 0)])
            while not self.stopping.is_set() and (self.last is None or not self.got or self.got[-1][0] < self.last):
                for m in consumer.consume(200, 0.5):
                    if m.error() is None:
                        self.got.append((m.offset(), (m.key(), m.value())))
                    elif not m.error().retriable():
                        self.errors.append(m.error())
                time.sleep(self._pause)
        finally:
            consumer.close()

    def finish(self, last: int, timeout: float) -> list[tuple[int, Record]]:
        self.last = last
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"{self._thread.name} read up to {self.got[-1][0] if self.got else None}"
        assert not self.errors, self.errors[:3]
        return self.got


def create_on(bootstrap: str, brokers: list[int], **configs: object) -> str:
    name = f"t-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    new = NewTopic(
        name, 1, replica_assignment=[brokers], config={k.replace("_", "."): str(v) for k, v in configs.items()}
    )
    admin.create_topics([new])[name].result(60)
    return name


@pytest.mark.timeout(2400)
def test_move_expand_and_shrink_a_tiered_partition_while_producing(stack3: Endpoints, tmp_path: Path) -> None:
    topic = create_on(stack3.bootstrap, [1], internal_segment_bytes=SEGMENT)
    shared = {"prefix": f"it-{uuid.uuid4().hex[:8]}", "metadata_topic": f"__tiering_metadata_{uuid.uuid4().hex[:8]}"}
    configs = {b.id: write_config(stack3, tmp_path, broker=b.id, etcd_url=stack3.etcd.url, **shared)
               for b in stack3.brokers}  # fmt: skip
    cli("topic", "enable", topic, "--local-retention-bytes", str(LOCAL_RETENTION), "--config", str(configs[1]))
    dirs = {b.id: Path(b.log_dir) / f"{topic}-0" for b in stack3.brokers}
    writer = Writer(stack3.bootstrap, topic)
    readers: list[Reader] = []
    observer = SidecarContext.build(settings(configs[1]), writes_snapshots=False)
    observer.manager.start()
    try:
        topic_id = observer.cluster.topics([topic])[topic].topic_id

        def remote_end() -> int:
            state = observer.manager.partition_state(topic_id, 0)
            return -1 if state is None else state.remote_end_offset

        def local(within: float = 60) -> LocalOffsets:
            """Kafka's offsets of the partition; right after a move an answer may come from the old leader
            (NOT_LEADER_FOR_PARTITION, until the client's metadata catches up): asked again."""
            deadline = time.monotonic() + within
            while True:
                try:
                    return observer.cluster.local_offsets([(topic, 0)])[(topic, 0)]
                except KafkaClusterError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.5)

        def uploads_continue(what: str) -> None:
            """The current leader's sidecar uploads past what the partition held when the step ended (on a
            timeout, the sidecars' status says what each was doing)."""
            end = local().lz
            try:
                wait_for(
                    lambda: writer.alive() and remote_end() > end, 180, f"the remote end to pass {end} after {what}"
                )
            except AssertionError as exc:
                status = {b: s.status() for b, s in sidecars.items()}
                raise AssertionError(f"{exc}; remote end {remote_end()}, {local()}; sidecars: {status}") from None

        with sidecars_running(configs) as sidecars, proxy_for(configs[1], stack3.bootstrap) as proxy:
            wait_for(lambda: local().lx > 0, 180,
                     "tiering and local deletion on the first broker")  # fmt: skip
            reader_settings = load_reader_settings(configs[1])
            group = {"enable.auto.commit": False, "auto.offset.reset": "earliest"}
            tiered_reader = Reader("tiered-consumer", lambda: TieredConsumer(
                {"bootstrap.servers": stack3.bootstrap, "group.id": f"r-{uuid.uuid4().hex[:6]}", **group},
                reader_settings), topic)  # fmt: skip
            proxy_reader = Reader("proxy-consumer", lambda: Consumer(
                {"bootstrap.servers": proxy_bootstrap(proxy), "group.id": f"p-{uuid.uuid4().hex[:6]}", **group}
            ), topic)  # fmt: skip
            readers += [tiered_reader, proxy_reader]

            reassign(stack3.bootstrap, {(topic, 0): [2]})  # move: broker 1 -> broker 2
            uploads_continue("the move to broker 2")

            reassign(stack3.bootstrap, {(topic, 0): [2, 3, 1]})  # expand: three replicas, broker 2 leading
            uploads_continue("the expansion")
            released = local().lx
            uploads_continue("the expansion (more)")
            wait_for(lambda: min(list_segments(dirs[b])[0].base_offset for b in (1, 2, 3)) > released, 120,
                     "every replica to delete locally what the leader's sidecar released")  # fmt: skip

            reassign(stack3.bootstrap, {(topic, 0): [3]})  # shrink to one replica, on broker 3
            uploads_continue("the shrink to broker 3")

            produced = writer.stop()
            last = max(produced)
            active = list_segments(dirs[3])[-1].base_offset

            def settled() -> bool:
                state = observer.manager.partition_state(topic_id, 0)
                counts = state.segment_counts
                return (
                    state.remote_end_offset == active - 1
                    and counts["COPY_SEGMENT_STARTED"] == counts["DELETE_SEGMENT_STARTED"] == 0
                    and observer.store.incomplete_uploads("") == []
                )  # fmt: skip

            wait_for(settled, 180, "the last rolled segment to be copied and nothing to be left half done")
            during = {"TieredConsumer": tiered_reader.finish(last, 300), "proxy": proxy_reader.finish(last, 300)}
            leading = {b: (topic_id, 0) in s.tasks for b, s in sidecars.items()}
            after_proxy = read_all(proxy_bootstrap(proxy), topic, {0: last + 1})[0]

        finished = observer.manager.segments(topic_id, 0, [SegmentState.COPY_SEGMENT_FINISHED])
        keys = set(observer.store.list_keys(""))
    finally:
        writer.stopped.set()
        for reader in readers:
            reader.stopping.set()
        observer.close()

    assert leading == {1: False, 2: False, 3: True}, "a sidecar still acts on a partition its broker lost"
    # every copy continues the previous one: no gap, none inside another (no duplicate)
    assert finished[0].base_offset == 0
    previous_end = -1
    for seg in finished:
        assert seg.base_offset <= previous_end + 1, f"gap before the copy at {seg.base_offset} (Ry was {previous_end})"
        assert seg.end_offset > previous_end, f"the copy {seg.base_offset}-{seg.end_offset} repeats offsets only"
        previous_end = seg.end_offset
    assert len({s.leader_epoch for s in finished}) >= 3, "not every leader's sidecar made copies"
    copies = {k for s in finished for k in SegmentRef(topic, topic_id, 0, s.base_offset,
                                                      uuid.UUID(bytes=s.segment_id)).object_keys()}  # fmt: skip
    assert {k for k in keys if not k.startswith("metadata-snapshots/")} == copies, "orphans or lost objects"

    for name, got in during.items():
        offsets = [o for o, _ in got]
        jumps = [(a, b) for a, b in itertools.pairwise(offsets) if b != a + 1]
        assert not jumps, f"{name}, reading while the partition moved, jumped (from, to): {jumps[:5]}"
        check_exact([(o, r) for o, r in got if o <= last], produced)
    check_exact([(m.offset(), (m.key(), m.value())) for m in after_proxy], produced)
    reread = Reader("tiered-consumer-after", lambda: TieredConsumer(
        {"bootstrap.servers": stack3.bootstrap, "group.id": f"a-{uuid.uuid4().hex[:6]}", "enable.auto.commit": False,
         "auto.offset.reset": "earliest"}, load_reader_settings(configs[3])), topic, pause=0)  # fmt: skip
    check_exact(reread.finish(last, 300), produced)
    http_reads_every_remote_offset(configs[3], tmp_path / "http.log", topic, produced, previous_end)


def http_reads_every_remote_offset(config: Path, log: Path, topic: str, produced: dict[int, Record], ry: int) -> None:
    """The HTTP fetch service serves every offset up to the remote end once, as produced, then 416."""
    service = start_service(config, log)
    try:
        bodies, offset = [], 0
        while (r := service.get(f"/v1/topics/{topic}/partitions/0/batches", offset=offset, max_bytes=200_000)) \
                .status_code == 200:  # fmt: skip
            bodies.append(r.content)
            offset = int(r.headers["Kafka-Next-Offset"])
        assert r.status_code == 416 and r.json()["offset"] == ry + 1, r.text
    finally:
        service.stop()
    decoded = decode_independently(bodies)
    assert sorted(decoded) == list(range(ry + 1)), "offsets missing or extra"
    assert all(decoded[o][:2] == produced[o] for o in decoded), "a record differs from what was produced"


def test_bench_reassign_prints_both_sides_and_a_json_summary_last(stack3: Endpoints) -> None:
    result = CliRunner().invoke(main, ["bench", "reassign", "--stack-dir", stack3.stack_dir, "--size-mb", "16"],
                                catch_exceptions=False)  # fmt: skip
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.output.splitlines() if line.startswith("{")]
    assert [line.get("side") for line in lines[:2]] == ["untiered", "tiered"]
    summary = lines[-1]
    assert summary["untiered_bytes_moved"] >= 16 << 20, "the untiered move did not copy the whole partition"
    assert summary["tiered_bytes_moved"] < summary["untiered_bytes_moved"] / 10, "the tiered move copied remote data"
    assert {"ratio", "bytes_ratio", "local_share"} <= summary.keys()
