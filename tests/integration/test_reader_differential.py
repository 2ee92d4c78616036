"""The remote readers held to each other and to Kafka's own consumer on the same copies.

Three read paths serve tiered data: the TieredConsumer's stream (``PartitionStream``, decoded records), the
cursors the access layer and the HTTP service serve batches from (``CursorCache``, whole batches and their
aborted transactions, filtered by the client), and the Spark source's slices (``plan_slices`` / ``read_slices``,
Arrow rows). All three run on the read core; the stream and the cursors are read over either catalog (the
metadata WAL's, the object listing's), the slices over the listing's, as an executor reads them. They share
the copy choice and the abort rule; this test reads one topic through all of them and
compares each record, byte for byte, with what librdkafka read from the broker before the segments left its
disk, read_committed and read_uncommitted. The topic is written to make transactions hard: three
transactional producers interleave their batches with a plain producer's, transactions commit or abort in a
seeded order and span several segments, so an aborted transaction's records, its ABORT marker and the
transaction index entry that names it sit in different copies. The copies are then shaped as leader changes
and lost uploads leave them (``_overlap_and_hole``): a later leader's copy that begins inside one copy and
ends inside the next, and a copy missing in the middle.
"""

from __future__ import annotations

import random
import struct
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from confluent_kafka import Consumer, Producer, TopicPartition

from deploy.spark_jars import spark_jars
from deploy.stack import Endpoints
from metadata.records import SegmentRecord
from reader import NotInRemote, PartitionStream, RemoteReader, load_reader_settings
from reader.cursor import CursorCache
from reader.listing import ListingCatalog, RemotePartition, list_remote_partitions
from reader.spark.jvm_source import jvm_enabled, plan_json, read_plan
from reader.spark.planning import PartitionRange, plan_reader, plan_slices
from reader.spark.session import export_session
from reader.spark.slices import SegmentSlice, pack_slices, read_slices, slice_reader
from segment_fsm import SegmentState
from tests.conftest import create_topic
from tests.kafka_consumer_model import consumer_kept
from tests.reader_harness import running_sidecar
from tests.sidecar_harness import wait_for, write_config
from tiering.cli.main import main
from tiering.copier import LocalSegment
from tiering.sidecar.context import SidecarContext
from tiering_core.formats import list_segments, parse_txn_index
from tiering_core.formats.batch import scan_headers
from tiering_core.formats.layout import SegmentFiles
from tiering_core.objects import SegmentRef
from tiering_core.stores.base import RemoteStore
from tiering_core.stores.factory import open_store

pytestmark = pytest.mark.integration

SEGMENT = 64 * 1024
Record = tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]


def _interleaved_transactions(bootstrap: str, topic: str, seed: int) -> None:
    """Batches of three transactional producers and a plain one, interleaved (a flush after each produce puts
    each in a batch of its own, in this order); each transaction holds 20-120 records of 200-600 bytes (its
    records span segments of 64 KiB) and commits or aborts by the seed."""
    rng = random.Random(seed)
    plain = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "enable.idempotence": True})
    txns = []
    for p in range(3):
        producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{topic}-{p}", "linger.ms": 0,
                             "compression.type": ["none", "lz4", "zstd"][p]})  # fmt: skip
        producer.init_transactions(60)
        txns.append({"producer": producer, "left": 0})
    for n in range(1200):
        who = rng.randrange(4)
        value = f"{n}|{rng.randbytes(rng.randrange(100, 300)).hex()}".encode()  # random: compression keeps its size
        headers = [("n", str(n).encode()), ("null", None)] if n % 3 == 0 else None
        if who == 3:
            plain.produce(topic, key=f"plain-{n}".encode(), value=value, headers=headers, partition=0)
            plain.flush(60)
        else:
            t = txns[who]
            if t["left"] == 0:
                t["producer"].begin_transaction()
                t["left"] = rng.randrange(20, 120)
            t["producer"].produce(topic, key=f"txn-{who}-{n}".encode(), value=value, headers=headers, partition=0)
            t["producer"].flush(60)
            t["left"] -= 1
            if t["left"] == 0:
                _finish(t["producer"], rng.random() < 0.5)
    for t in txns:
        if t["left"]:
            _finish(t["producer"], rng.random() < 0.5)


def _finish(producer: Producer, commit: bool) -> None:
    if commit:
        producer.commit_transaction(60)
    else:
        producer.abort_transaction(60)


def _broker_read(bootstrap: str, topic: str, isolation: str, end: int) -> dict[int, Record]:
    """Every record below ``end`` as librdkafka's consumer delivers it from the broker."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"ref-{uuid.uuid4().hex}",
                         "isolation.level": isolation, "enable.auto.commit": False})  # fmt: skip
    consumer.assign([TopicPartition(topic, 0, 0)])
    out: dict[int, Record] = {}
    deadline = time.monotonic() + 120
    try:
        position = 0
        while position < end:
            assert time.monotonic() < deadline, f"the broker's consumer stopped at {position} of {end}"
            for m in consumer.consume(500, 5.0):
                assert m.error() is None, m.error()
                if m.offset() < end:
                    out[m.offset()] = (m.key(), m.value(), list(m.headers() or []))
            position = consumer.position([TopicPartition(topic, 0)])[0].offset
    finally:
        consumer.close()
    return out


@pytest.fixture(scope="module")
def written(stack: Endpoints, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The topic, what the broker's consumer read of it (both isolation levels), tiered until every segment but
    the active one is remote and the broker's log start is past 0; the sidecar keeps running."""
    topic = create_topic(stack.bootstrap, 1, internal_segment_bytes=SEGMENT)
    _interleaved_transactions(stack.bootstrap, topic, seed=27)
    filler = Producer({"bootstrap.servers": stack.bootstrap, "linger.ms": 5, "batch.size": SEGMENT // 2})
    failed: list[object] = []
    for i in range(600):  # rolls past the last marker: every transaction's outcome is in a rolled segment
        filler.produce(topic, key=b"tail", value=f"tail {i} {'y' * 500}".encode(), partition=0,
                       on_delivery=lambda err, _: failed.append(err) if err is not None else None)  # fmt: skip
    assert filler.flush(60) == 0 and not failed, failed[:3]
    consumer = Consumer({"bootstrap.servers": stack.bootstrap, "group.id": "ends"})
    _, end = consumer.get_watermark_offsets(TopicPartition(topic, 0), 30)
    consumer.close()
    reference = {iso: _broker_read(stack.bootstrap, topic, iso, end) for iso in ("read_committed", "read_uncommitted")}
    assert len(reference["read_committed"]) < len(reference["read_uncommitted"]), "no transaction was aborted"
    config = write_config(stack, tmp_path_factory.mktemp("differential"))
    result = CliRunner().invoke(main, ["topic", "enable", topic, "--local-retention-bytes", str(2 * SEGMENT),
                                       "--config", str(config)])  # fmt: skip
    assert result.exit_code == 0, result.output
    with running_sidecar(config) as (ctx, _):
        topic_id = ctx.cluster.topics([topic])[topic].topic_id

        partition_dir = Path(stack.broker(1).log_dir) / f"{topic}-0"

        def tiered() -> bool:
            state = ctx.manager.partition_state(topic_id, 0)
            ry = None if state is None else state.remote_end_offset
            lx = ctx.cluster.local_offsets([(topic, 0)])[(topic, 0)].lx
            return ry is not None and lx > 0 and ry + 1 == list_segments(partition_dir)[-1].base_offset

        wait_for(tiered, 300, "the sidecar to tier every rolled segment and the broker to delete locally")
        remote_end = ctx.manager.partition_state(topic_id, 0).remote_end_offset
        shaped = _overlap_and_hole(ctx, topic, topic_id, tmp_path_factory.mktemp("overlap"))
        yield {"topic": topic, "topic_id": topic_id, "config": config, "reference": reference, "ry": remote_end,
               **shaped}  # fmt: skip


def _overlap_and_hole(ctx: SidecarContext, topic: str, topic_id: str, work: Path) -> dict[str, Any]:
    """Shape the finished copies as leader changes and lost uploads leave them, through the sidecar's own copier
    and metadata records: a copy made under a later leader epoch from the middle of the third copy to the middle
    of the fourth (its own batch boundaries, offset index and the transaction index entries of the markers it
    holds; no producer snapshot, so readers look further for transactions left open), and the second-to-last
    copy deleted (a hole: its offsets are read by no one). Returns the overlapping copy's id and the hole."""
    finished = ctx.manager.segments(topic_id, 0, {SegmentState.COPY_SEGMENT_FINISHED})
    epoch = max(s.leader_epoch for s in finished) + 1  # a later leader: its copy is preferred where they overlap
    refs = [SegmentRef(topic, topic_id, 0, s.base_offset, uuid.UUID(bytes=s.segment_id)) for s in finished]
    (a, ref_a), (b, ref_b) = (finished[2], refs[2]), (finished[3], refs[3])
    logs = [ctx.store.get_bytes(r.key("log")) for r in (ref_a, ref_b)]
    heads = [list(scan_headers(r.key("log"), log)) for r, log in zip((ref_a, ref_b), logs, strict=True)]
    enter, leave = heads[0][len(heads[0]) // 2], heads[1][len(heads[1]) // 2]
    data = logs[0][enter.position :] + logs[1][: leave.position]
    first, last = enter.base_offset, leave.base_offset - 1
    assert a.base_offset < first <= a.end_offset < last < b.end_offset
    partition_dir = work / f"{topic}-0"
    partition_dir.mkdir()
    files = SegmentFiles(partition_dir, first)
    files.log.write_bytes(data)
    index = b"".join(struct.pack(">ii", h.base_offset + h.last_offset_delta - first, h.position)
                     for h in list(scan_headers(str(files.log), data))[1::2])  # fmt: skip
    files.index.write_bytes(index)
    txns = []
    for ref in (ref_a, ref_b):
        copy = ctx.copier.manifest(ref)
        position, length = copy.index_parts["txn"]
        raw = ctx.store.get_bytes(ref.key("indexes"))[position : position + length] if length else b""
        entries = [raw[i : i + 34] for i in range(0, len(raw), 34)]
        txns += [e for e in entries if first <= parse_txn_index(e)[0].last_offset <= last]
    files.txnindex.write_bytes(b"".join(txns))
    overlap = SegmentRef(topic, topic_id, 0, first, uuid.uuid4())

    def record(ref: SegmentRef, state: SegmentState, end: int, size: int, max_ts: int) -> SegmentRecord:
        return SegmentRecord(topic=topic, topic_id=topic_id, partition=0, segment_id=ref.segment_id, state=state,
                             broker_id=1, leader_epoch=epoch, event_time=ctx.now_ms(), base_offset=ref.base_offset,
                             end_offset=end, max_timestamp=max_ts, size=size)  # fmt: skip

    max_ts = max(h.max_timestamp for h in scan_headers(str(files.log), data))
    assert ctx.manager.publish(record(overlap, SegmentState.COPY_SEGMENT_STARTED, last, len(data), max_ts)).accepted
    manifest = ctx.copier.copy(overlap, LocalSegment(files, last + 1), leader_epoch=epoch)
    assert (manifest.end_offset, manifest.log_size) == (last, len(data))
    assert ctx.manager.publish(record(overlap, SegmentState.COPY_SEGMENT_FINISHED, last, len(data), max_ts)).accepted
    gone, gone_ref = finished[-2], refs[-2]
    for state in (SegmentState.DELETE_SEGMENT_STARTED, SegmentState.DELETE_SEGMENT_FINISHED):
        assert ctx.manager.publish(record(gone_ref, state, gone.end_offset, gone.size, gone.max_timestamp)).accepted
        if state == SegmentState.DELETE_SEGMENT_STARTED:
            ctx.copier.delete(gone_ref)
    return {"overlap": overlap.segment_id, "hole": range(gone.base_offset, gone.end_offset + 1)}


def _remote_part(reference: dict[int, Record], ry: int) -> dict[int, Record]:
    return {o: r for o, r in reference.items() if o <= ry}


def _via_stream(reader: RemoteReader, topic: str, read_committed: bool) -> dict[int, Record]:
    """The TieredConsumer's path: records decoded by the stream, filtered by it."""
    stream = PartitionStream(reader, topic, 0, 0, read_committed=read_committed)
    out: dict[int, Record] = {}
    deadline = time.monotonic() + 120
    try:
        while True:
            if time.monotonic() > deadline:
                copies = [reader.locate(topic, 0, c.base_offset) for c in reader.catalog.copies(topic, 0)]
                raise AssertionError(
                    f"the stream stopped at {stream.position} ({stream.blocked_at=}) "
                    f"{[(c.base_offset, c.end_offset, c.open_txns) for c in copies]} "
                    f"{stream.filter.unresolved if stream.filter else None}"
                )
            for batch in stream.read(10.0):
                for r in batch.records:
                    assert r.offset not in out, f"offset {r.offset} delivered twice"
                    out[r.offset] = (r.key, r.value, list(r.headers))
    except NotInRemote:
        return out
    finally:
        stream.close()


def _via_cursors(reader: RemoteReader, topic: str, topic_id: str, read_committed: bool) -> dict[int, Record]:
    """The access layer's and the HTTP service's path: whole batches and their aborted transactions, 256 KiB
    per fetch, filtered as a Kafka client filters them."""
    cursors = CursorCache(reader, 4, memory_wait=30.0)
    out: dict[int, Record] = {}
    offset = 0
    try:
        while True:
            try:
                served = cursors.read(topic, topic_id, 0, offset, 256 * 1024, read_committed)
            except NotInRemote:
                return out
            assert not served.undecided, f"a transaction open at {served.undecided} though every marker is remote"
            kept = consumer_kept(served.key, served.data, served.aborted if read_committed else [])
            got = {r.offset: (r.key, r.value, list(r.headers)) for b in kept for r in b.records if r.offset >= offset}
            assert not set(got) & set(out), "offsets served twice"
            out.update(got)
            assert served.next_offset > offset
            offset = served.next_offset
    finally:
        cursors.close()


def _spark_plan(config: Path, topic: str, topic_id: str, ry: int, overlap: uuid.UUID
                ) -> tuple[RemoteStore, RemotePartition, list[SegmentSlice]]:  # fmt: skip
    """The Spark source's plan (committed records only): the listing's copies, planned into slices of 24 KiB (each
    64 KiB copy split into several, so slices begin and end inside objects)."""
    store = open_store(load_reader_settings(config).remote_storage)
    [rp] = list_remote_partitions(store, [topic])
    assert rp.topic_id == topic_id
    assert any(c.manifest.segment_id == overlap for c in rp.copies), "the walk skips the later leader's copy"
    rng = PartitionRange(topic, topic_id, 0, rp.start, ry, rp.start, ry + 1)
    with plan_reader(store, [rp]) as planner:
        slices = plan_slices(planner, [rp], [rng], 24 * 1024)
    assert sum(s.start > 0 or s.end < s.copy.manifest.log_size for s in slices) > len(rp.copies), "too few splits"
    return store, rp, slices


def _via_spark_slices(config: Path, topic: str, topic_id: str, ry: int, overlap: uuid.UUID) -> dict[int, Record]:
    """The Python Spark source's path: each slice read as an executor reads it, the read core's windows cut at the
    slice's end."""
    store, rp, slices = _spark_plan(config, topic, topic_id, ry, overlap)
    out: dict[int, Record] = {}
    with slice_reader(store, [rp], 64 * 1024) as reader:
        for batch in read_slices(reader, slices):
            for row in batch.to_pylist():
                assert row["offset"] not in out, f"offset {row['offset']} read twice"
                headers = [(h["key"], h["value"]) for h in row["headers"] or []]  # null without headers
                out[row["offset"]] = (row["key"], row["value"], headers)
    return out


def _missing_extra_wrong(name: str, want: dict[int, Record], got: dict[int, Record]) -> None:
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    assert not missing and not extra, f"{name}: missing offsets {missing[:10]}, extra offsets {extra[:10]}"
    wrong = [o for o in want if got[o] != want[o]]
    assert not wrong, f"{name}: offsets {wrong[:10]} differ from what the broker served"


@pytest.mark.parametrize("isolation", ["read_committed", "read_uncommitted"])
def test_every_remote_reader_serves_what_kafkas_consumer_read(written: dict[str, Any], isolation: str) -> None:
    topic, topic_id, ry, hole = written["topic"], written["topic_id"], written["ry"], written["hole"]
    want = {o: r for o, r in _remote_part(written["reference"][isolation], ry).items() if o not in hole}
    committed = isolation == "read_committed"
    settings = load_reader_settings(written["config"], fetch_window_bytes=64 * 1024, prefetch_windows=2)
    with RemoteReader.open(settings, [topic]) as reader:
        rx, _ = reader.catalog.remote_offsets(topic, 0)
        copies = reader.catalog.copies(topic, 0)
        assert rx == 0 and len(copies) >= 8, "too few copies to cross"
        later = next(c for c in copies if uuid.UUID(bytes=c.segment_id) == written["overlap"])
        assert reader.catalog.copy_for_offset(topic, 0, later.base_offset) == later, "the later leader's copy lost"
        assert not any(c.base_offset in hole for c in copies), "the deleted copy is still listed"
        readers = {
            "stream (TieredConsumer)": _via_stream(reader, topic, committed),
            "cursors (access layer, HTTP)": _via_cursors(reader, topic, topic_id, committed),
        }
    store = open_store(settings.remote_storage)
    with RemoteReader(settings, ListingCatalog(list_remote_partitions(store, [topic])), store) as listed:
        readers["stream over the object listing"] = _via_stream(listed, topic, committed)
        readers["cursors over the object listing"] = _via_cursors(listed, topic, topic_id, committed)
    if committed:
        readers["slices (Spark source)"] = _via_spark_slices(written["config"], topic, topic_id, ry, written["overlap"])
    for name, got in readers.items():
        _missing_extra_wrong(name, want, got)


@pytest.mark.slow
def test_the_jvm_spark_reader_serves_what_kafkas_consumer_read(written: dict[str, Any]) -> None:
    """The export's JVM reader (``kafka_tiered_slices``) on the same plan as the Python source's: 24 KiB slices
    packed into tasks of several, across the overlapping copies, the hole and the transactions that span copies.
    Slow: it starts Spark."""
    topic, ry, hole = written["topic"], written["ry"], written["hole"]
    want = {o: r for o, r in _remote_part(written["reference"]["read_committed"], ry).items() if o not in hole}
    store, _, slices = _spark_plan(written["config"], topic, written["topic_id"], ry, written["overlap"])
    packs = pack_slices(slices, 64 * 1024)
    assert len(packs) > 1 and any(len(p.slices) > 1 for p in packs), "too few tasks or slices per task"
    spark = export_session("local[2]", spark_jars(), app_name="differential jvm reader")
    try:
        assert jvm_enabled(spark)
        rows = read_plan(spark, plan_json(packs, store, max_rows=500, max_bytes=1 << 20)).collect()
    finally:
        spark.stop()
    got: dict[int, Record] = {}
    for row in rows:
        assert row.offset not in got, f"offset {row.offset} read twice"
        headers = [(h.key, None if h.value is None else bytes(h.value)) for h in row.headers or []]
        got[row.offset] = (bytes(row.key) if row.key is not None else None,
                           bytes(row.value) if row.value is not None else None, headers)  # fmt: skip
    _missing_extra_wrong("the JVM reader", want, got)
