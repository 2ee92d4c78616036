"""The JVM reader (``kafka_tiered_slices``, ``reader/spark/jvm/``) on bytes made here, in a local Spark session
with no stack: the same rows as the Python source's decoder for every codec, aborted transactions, control
batches, headers and log-append time, and each kind of damage failing the task with the key and byte named.
Slow: it starts a JVM."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from deploy.spark_jars import spark_jars
from reader.spark.jvm_source import jvm_enabled, plan_json, read_plan
from reader.spark.session import export_session
from reader.spark.slices import SegmentSlice, SlicePack, decode_slice
from tests.decoders import KEY, slice_over, windows_of
from tests.kafka_encoder import encode_batch, sample_records
from tests.unit.test_spark_reader import _expected, _rows, _segment
from tiering_core.formats import iter_batches, scan_headers
from tiering_core.stores.filesystem import FileSystemStore

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    session = export_session("local[1]", spark_jars(), app_name="jvm reader tests")
    assert jvm_enabled(session), "the JVM reader's jar was not built"
    yield session
    session.stop()


@pytest.fixture
def store(tmp_path: Path) -> FileSystemStore:
    return FileSystemStore(tmp_path / "remote")


def _jvm(spark: SparkSession, store: FileSystemStore, *parts: SegmentSlice, max_rows: int = 100) -> dict[int, tuple]:
    """The rows the JVM reader gives for one task of ``parts``, as ``test_spark_reader._rows`` gives a decoder's
    (Spark's binary values come as bytearray, equal to the bytes they hold)."""
    plan = plan_json([SlicePack(parts)], store, max_rows=max_rows, max_bytes=16 << 20)
    out: dict[int, tuple] = {}
    for r in read_plan(spark, plan).collect():
        assert r.offset not in out, f"offset {r.offset} read twice"
        headers = None if r.headers is None else [(h.key, h.value) for h in r.headers]
        out[r.offset] = (r.key, r.value, headers, round(r.timestamp.timestamp() * 1000))
        assert (r.topic, r.partition, r.timestampType) == ("t", 3, 0)
    return out


def test_every_codec_with_aborted_transactions_and_markers_as_the_python_decoder(
    spark: SparkSession, store: FileSystemStore
) -> None:
    data, dropped = _segment()
    store.put_bytes(KEY, data)
    whole = slice_over(data, 0, 10_000, ((77, 750, 760),))
    expected = _expected(data, dropped)
    assert _jvm(spark, store, whole) == _rows(list(decode_slice(whole, windows_of(data, 1 << 20)))) == expected
    starts = [h.position for h in scan_headers("x", data)]
    halves = [  # one task, the object in two slices cut at a batch inside it, offsets 140-460 kept
        SegmentSlice("t", 3, whole.copy, a, b, 140, 460, whole.aborted)
        for a, b in ((0, starts[3]), (starts[3], len(data)))
    ]
    got = _jvm(spark, store, *halves, max_rows=7)
    assert sorted(got) == list(range(140, 461))
    assert got == {o: v for o, v in expected.items() if 140 <= o <= 460}


def test_log_append_time_gives_the_batch_time_and_its_type(spark: SparkSession, store: FileSystemStore) -> None:
    data = encode_batch(0, sample_records(20, seed=5), attributes_extra=0x08, codec=3)
    store.put_bytes(KEY, data)
    [batch] = list(iter_batches("x", data))
    rows = read_plan(spark, plan_json([SlicePack((slice_over(data),))], store, max_rows=100, max_bytes=1 << 20))
    got = {(r.timestampType, round(r.timestamp.timestamp() * 1000)) for r in rows.collect()}
    assert got == {(1, batch.header.max_timestamp)}


def test_damage_fails_the_task_naming_the_key_and_the_byte(spark: SparkSession, store: FileSystemStore) -> None:
    data, _ = _segment()
    part = slice_over(data, 0, 10_000)
    corrupt = bytearray(data)
    corrupt[len(data) // 2] ^= 0xFF
    cases = [
        (bytes(corrupt), part, rf"remote object {KEY} at byte \d+: (CRC-32C mismatch|malformed)"),
        (data + b"\x00" * 10, part, f"remote object {KEY} at byte {len(data)}: object has {len(data) + 10} bytes, "
                                    f"the manifest says {len(data)}"),
        (data[:-100], part, f"object has {len(data) - 100} bytes, the manifest says {len(data)}"),
    ]  # fmt: skip
    moved = bytearray(data)
    moved[6] ^= 0x40  # the first batch's base offset: not covered by its CRC
    cases.append((bytes(moved), slice_over(bytes(moved), 0, 10_000, copy_offsets=(0, 1000)),
                  f"remote object {KEY} at byte 0: batch offsets 16384-"))  # fmt: skip
    for content, sliced, message in cases:
        store.put_bytes(KEY, content)
        with pytest.raises(Exception, match=message):
            _jvm(spark, store, sliced)
    store.delete([KEY])
    with pytest.raises(Exception, match=f"remote object missing: {KEY}"):
        _jvm(spark, store, part)
