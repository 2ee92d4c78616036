"""Spark export on the real stack: tier a topic with the sidecar, export it from S3 to Parquet and Delta,
read it back with Spark and with independent readers (pyarrow, deltalake), record by record."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow.dataset as pads
import pytest
from click.testing import CliRunner
from confluent_kafka import Producer
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from deploy.errors import StackError
from deploy.spark_cluster import start_cluster
from deploy.spark_jars import spark_jars
from deploy.stack import Endpoints
from reader.spark.export import ExportRequest, run_export
from reader.spark.options import store_options
from reader.spark.session import export_session
from tests.conftest import create_topic
from tests.sidecar_harness import Produced, produce_mixed, settings, wait_for, write_config
from tiering.cli.main import main
from tiering.config import SidecarSettings
from tiering.sidecar.context import SidecarContext
from tiering.sidecar.runner import Sidecar
from tiering_core.kafka_cluster import KafkaCluster
from tiering_core.stores.factory import open_store

pytestmark = pytest.mark.integration


@dataclass
class Tiered:
    topic: str
    config: Path
    settings: SidecarSettings
    produced: Produced  # offset -> (key, value, headers), aborted ones included

    def committed(self, upto: int, start: int = 0) -> dict[int, str]:
        """Digest of every committed record in ``[start, upto]``."""
        return {
            o: digest(o, k, v, h)
            for o, (k, v, h) in self.produced.items()
            if start <= o <= upto and not (k or b"").startswith(b"txn-False")
        }

    def aborted(self) -> set[int]:
        return {o for o, (k, _, _) in self.produced.items() if (k or b"").startswith(b"txn-False")}


def digest(offset: int, key: bytes | None, value: bytes | None, headers: list) -> str:
    h = hashlib.sha256(repr((offset, key, value, [(k, v) for k, v in headers])).encode())
    return h.hexdigest()


def produce_json_filler(bootstrap: str, topic: str, count: int, seed: int, produced: Produced) -> None:
    """JSON values (the non-JSON ones come from produce_mixed); enough to roll the segments before them."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.size": 65536})
    for i in range(count):
        record = (f"j-{seed + i}".encode(), json.dumps({"n": seed + i, "name": f"item-{i % 50}"}).encode(), [])

        def report(err: object, msg: object, record: tuple = record) -> None:
            assert err is None, err
            produced[msg.offset()] = record  # type: ignore[attr-defined]

        while True:
            try:
                producer.produce(topic, key=record[0], value=record[1], on_delivery=report)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(60) == 0


def tier_everything_rolled(config: Path, topic: str) -> None:
    """Run the sidecar until every rolled segment of the topic has its remote copy."""
    ctx = SidecarContext.build(settings(config))
    sidecar = Sidecar(ctx)
    sidecar.start()
    try:
        topic_id = ctx.cluster.topics([topic])[topic].topic_id

        def caught_up() -> bool:
            task = sidecar.tasks.get((topic_id, 0))
            return task is not None and task.status.copy_lag_segments == 0 and task.status.last_error is None

        wait_for(caught_up, 240, "the rolled segments to be copied", step=sidecar.tick)
    finally:
        sidecar.stop()
        sidecar.close()


@pytest.fixture(scope="module")
def tiered(stack: Endpoints, tmp_path_factory: pytest.TempPathFactory) -> Tiered:
    topic = create_topic(stack.bootstrap, internal_segment_bytes=128 * 1024)
    produced = produce_mixed(stack.bootstrap, topic, 15_000)
    produce_json_filler(stack.bootstrap, topic, 4_000, 0, produced)
    config = write_config(stack, tmp_path_factory.mktemp("export-sidecar"))
    enabled = CliRunner().invoke(main, ["topic", "enable", topic, "--local-retention-bytes", str(1 << 20),
                                        "--config", str(config)])  # fmt: skip
    assert enabled.exit_code == 0, enabled.output
    tier_everything_rolled(config, topic)
    return Tiered(topic, config, settings(config), produced)


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    session = export_session("local[2]", spark_jars(), app_name="export tests")
    yield session
    session.stop()


def spark_digests(spark: SparkSession, path: str, fmt: str) -> dict[int, str]:
    df = (spark.read.format("delta").load(path) if fmt == "delta" else spark.read.parquet(path)).select(
        "offset", "key", "value", "headers"
    )
    return {r.offset: digest(r.offset, r.key, r.value, [(h.key, h.value) for h in r.headers]) for r in df.collect()}


def independent_digests(path: str, fmt: str) -> dict[int, str]:
    table = (
        DeltaTable(path).to_pyarrow_table()
        if fmt == "delta"
        else pads.dataset(path, format="parquet", partitioning="hive").to_table()
    )
    rows = table.select(["offset", "key", "value", "headers"]).to_pylist()
    out = {r["offset"]: digest(r["offset"], r["key"], r["value"], [(h["key"], h["value"]) for h in r["headers"]])
           for r in rows}  # fmt: skip
    assert len(out) == len(rows), "an offset was exported twice"
    return out


def request(tiered: Tiered, fmt: str, path: Path, **kw: object) -> ExportRequest:
    return ExportRequest(topic=tiered.topic, format=fmt, path=str(path), store=tiered.settings.remote_storage, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("fmt", ["parquet", "delta"])
def test_export_matches_what_was_produced_without_aborted_records(
    tiered: Tiered, spark: SparkSession, tmp_path: Path, fmt: str
) -> None:
    result = run_export(spark, request(tiered, fmt, tmp_path / fmt))
    assert result.committed
    (rng,) = result.ranges
    assert rng.first == 0
    aborted = tiered.aborted()
    assert aborted and max(aborted) < rng.last, "the aborted transaction is not inside the tiered range"
    expected = tiered.committed(rng.last)
    assert result.rows == len(expected)
    assert spark_digests(spark, str(tmp_path / fmt), fmt) == expected
    assert independent_digests(str(tmp_path / fmt), fmt) == expected


@pytest.mark.parametrize("fmt", ["parquet", "delta"])
def test_incremental_runs_add_only_new_records_exactly_once(
    tiered: Tiered, spark: SparkSession, stack: Endpoints, tmp_path: Path, fmt: str
) -> None:
    path = tmp_path / fmt
    first = run_export(spark, request(tiered, fmt, path, incremental=True))
    assert first.committed
    seed = 1_000_000 + (0 if fmt == "parquet" else 10_000)
    tiered.produced.update(produce_mixed(stack.bootstrap, tiered.topic, 2_000, seed=seed))
    produce_json_filler(stack.bootstrap, tiered.topic, 3_000, seed, tiered.produced)
    tier_everything_rolled(tiered.config, tiered.topic)

    second = run_export(spark, request(tiered, fmt, path, incremental=True))
    (r1,), (r2,) = first.ranges, [r for r in second.ranges if r.last >= r.first]
    assert r2.first == r1.last + 1 and r2.last > r1.last
    assert second.committed and second.rows == len(tiered.committed(r2.last, r2.first))
    assert independent_digests(str(path), fmt) == tiered.committed(r2.last)

    again = run_export(spark, request(tiered, fmt, path, incremental=True))
    assert not again.committed and again.rows == 0
    assert independent_digests(str(path), fmt) == tiered.committed(r2.last)
    if fmt == "delta":
        assert len(DeltaTable(str(path)).history()) == 2
    else:
        assert len(list((path / "_kafka_tiered" / tiered.topic).glob("*.json"))) == 2


def test_same_ranges_exported_twice_commit_once_in_delta(tiered: Tiered, spark: SparkSession, tmp_path: Path) -> None:
    """Delta's idempotent write keyed by the offset ranges: a repeated (or concurrent) run of the same
    ranges commits nothing, even without --incremental."""
    path = tmp_path / "delta"
    once = run_export(spark, request(tiered, "delta", path, ending={0: 3000}))
    twice = run_export(spark, request(tiered, "delta", path, ending={0: 3000}))
    assert once.committed and not twice.committed
    assert independent_digests(str(path), "delta") == tiered.committed(2999)


def test_json_values_become_columns_and_other_values_go_to_corrupt(
    tiered: Tiered, spark: SparkSession, tmp_path: Path
) -> None:
    result = run_export(spark, request(tiered, "parquet", tmp_path / "json", value_format="json"))
    table = pads.dataset(str(tmp_path / "json"), format="parquet", partitioning="hive").to_table()
    rows = {r["offset"]: r for r in table.select(["offset", "value", "n", "name", "_corrupt"]).to_pylist()}
    assert len(rows) == result.rows
    json_rows = [o for o, (k, _, _) in tiered.produced.items() if o in rows and (k or b"").startswith(b"j-")]
    assert json_rows
    for offset in json_rows:
        doc = json.loads(tiered.produced[offset][1])
        assert (rows[offset]["n"], rows[offset]["name"], rows[offset]["_corrupt"]) == (doc["n"], doc["name"], None)
    others = [o for o, (_, v, _) in tiered.produced.items() if o in rows and v and not v.startswith(b"{")]
    delta = run_export(spark, request(tiered, "delta", tmp_path / "json-delta", value_format="json"))
    assert delta.rows == result.rows
    columns = DeltaTable(str(tmp_path / "json-delta")).to_pyarrow_table(columns=["offset", "n", "_corrupt"])
    assert columns.num_rows == result.rows and columns.column("n").null_count == len(rows) - len(json_rows)
    assert others
    for offset in others:
        assert rows[offset]["_corrupt"] == tiered.produced[offset][1].decode()
        assert rows[offset]["value"] == tiered.produced[offset][1]


def test_timestamps_select_the_offsets_kafka_would(tiered: Tiered, spark: SparkSession, tmp_path: Path) -> None:
    """--from/--to times: from the earliest offset whose timestamp is >= the start (ListOffsets by time),
    up to before the earliest offset whose timestamp is >= the end."""
    base = run_export(spark, request(tiered, "parquet", tmp_path / "all", ending={0: 6000}))
    table = pads.dataset(str(tmp_path / "all"), format="parquet", partitioning="hive").to_table()
    rows = sorted((r["offset"], int(r["timestamp"].timestamp() * 1000)) for r in table.to_pylist())
    assert base.rows == len(rows)
    start_ts, end_ts = rows[len(rows) // 3][1], rows[2 * len(rows) // 3][1]
    first = min(o for o, ts in rows if ts >= start_ts)
    stop = min(o for o, ts in rows if ts >= end_ts)
    timed = run_export(spark, request(tiered, "parquet", tmp_path / "timed", ending={0: 6000},
                                      starting_timestamp=start_ts, ending_timestamp=end_ts))  # fmt: skip
    (rng,) = timed.ranges
    assert (rng.first, rng.last) == (first, stop - 1)
    assert timed.rows == len(tiered.committed(stop - 1, first))


def test_local_tail_from_the_broker_makes_the_export_cover_the_whole_topic(
    tiered: Tiered, spark: SparkSession, stack: Endpoints, tmp_path: Path
) -> None:
    path = tmp_path / "whole"
    result = run_export(spark, request(tiered, "parquet", path, local_tail_bootstrap=stack.bootstrap))
    (rng,) = result.ranges
    local = KafkaCluster(stack.bootstrap).local_offsets([(tiered.topic, 0)])[(tiered.topic, 0)]
    assert rng.last == local.ly - 1 > rng.stable_end, "the broker's untiered tail was not read"
    assert max(tiered.produced) == rng.last or max(tiered.produced) < rng.last  # a marker can be last
    assert independent_digests(str(path), "parquet") == tiered.committed(rng.last)
    again = run_export(spark, request(tiered, "parquet", path, incremental=True, local_tail_bootstrap=stack.bootstrap))
    assert not again.committed and again.rows == 0


def _first_log_key(tiered: Tiered) -> str:
    store = open_store(tiered.settings.remote_storage)
    keys = sorted(
        k for k in store.list_keys(f"{tiered.settings.remote_storage.prefix}/{tiered.topic}-") if k.endswith(".log")
    )
    return keys[len(keys) // 2]


@pytest.mark.parametrize("damage", ["missing", "corrupt"])
def test_bad_segment_fails_naming_the_key_and_commits_nothing(
    tiered: Tiered, spark: SparkSession, tmp_path: Path, damage: str
) -> None:
    store = open_store(tiered.settings.remote_storage)
    key = _first_log_key(tiered)
    original = store.get_bytes(key)
    good = run_export(spark, request(tiered, "delta", tmp_path / "delta", ending={0: 10}))
    assert good.committed
    try:
        if damage == "missing":
            store.delete([key])
        else:
            broken = bytearray(original)
            broken[-1] ^= 0x55  # inside the last batch's records: its CRC-32C no longer matches
            store.put_bytes(key, bytes(broken))
        for fmt in ("parquet", "delta"):
            with pytest.raises(Exception, match=key) as failure:
                run_export(spark, request(tiered, fmt, tmp_path / fmt, incremental=True))
            assert ("not found" if damage == "missing" else "CRC-32C mismatch") in str(failure.value)
    finally:
        store.put_bytes(key, original)
    assert len(DeltaTable(str(tmp_path / "delta")).history()) == 1, "a partial Delta commit"
    parquet = tmp_path / "parquet"
    assert not list(parquet.glob("_kafka_tiered/**/*.json")), "a Parquet commit marker for a failed run"
    assert not list(parquet.glob("partition=*/**/*.parquet")), "data files of a failed run"


def test_unknown_topic_and_bad_options_fail_before_any_spark_work(
    tiered: Tiered, spark: SparkSession, tmp_path: Path
) -> None:
    env = {**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    cmd = [sys.executable, "-m", "tiering", "export", "no-such-topic", "--path", str(tmp_path / "x"),
           "--config", str(tiered.config)]  # fmt: skip
    started = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120, check=False)
    assert out.returncode != 0
    assert "topic 'no-such-topic' has no remote copy" in out.stderr
    assert "SparkContext" not in out.stderr and "log4j" not in out.stderr, "Spark started for a bad request"
    assert not (tmp_path / "x").exists()
    bad = subprocess.run([*cmd[:4], tiered.topic, *cmd[5:], "--from", "soon"], capture_output=True, text=True,
                         env=env, timeout=120, check=False)  # fmt: skip
    assert bad.returncode == 2 and "'soon' is not an offset" in bad.stderr and "log4j" not in bad.stderr
    assert time.monotonic() - started < 120

    tracker = spark.sparkContext.statusTracker()
    jobs_before = set(tracker.getJobIdsForGroup(None))

    def reader():  # DataFrameReader.option changes the reader in place: a new one each time
        return spark.read.format("kafka_tiered").options(**store_options(tiered.settings.remote_storage))

    with pytest.raises(Exception, match="unknown option"):
        reader().option("subscribe", tiered.topic).option("startingOffset", "0").load().count()
    with pytest.raises(Exception, match="not valid JSON"):
        reader().option("subscribe", tiered.topic).option("endingOffsets", "{oops").load().count()
    with pytest.raises(Exception, match="has no remote copy"):
        reader().option("subscribe", "nope").load().count()
    assert set(tracker.getJobIdsForGroup(None)) == jobs_before


def test_standalone_cluster_export_gives_the_same_rows_as_local(
    tiered: Tiered, spark: SparkSession, tmp_path: Path
) -> None:
    try:
        cluster = start_cluster(tmp_path / "cluster", cores=2, memory="2g")
    except StackError as exc:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"the Spark standalone cluster could not start: {exc}", pytrace=False)
        pytest.skip(f"the Spark standalone cluster could not start: {exc}")
    try:
        cmd = [sys.executable, "-m", "tiering", "export", tiered.topic, "--path", str(tmp_path / "cluster-out"),
               "--to", "0:5000", "--master", cluster.master_url, "--conf", "spark.executor.memory=1g",
               "--conf", "spark.cores.max=2", "--config", str(tiered.config)]  # fmt: skip
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False,
                             env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"})  # fmt: skip
        assert out.returncode == 0, out.stderr[-3000:]
        summary = json.loads(out.stdout.strip().splitlines()[-1])
        executors = list(cluster.work_dir.glob("app-*/*/stderr"))
        assert executors, "no executor ran on the worker"
    finally:
        cluster.stop()
    local = run_export(spark, request(tiered, "parquet", tmp_path / "local-out", ending={0: 5000}))
    assert summary["rows"] == local.rows == len(tiered.committed(4999))
    assert independent_digests(str(tmp_path / "cluster-out"), "parquet") == independent_digests(
        str(tmp_path / "local-out"), "parquet"
    )
