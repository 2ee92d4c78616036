"""Spark export on the real stack: tier a topic with the sidecar, export it from S3 to Parquet and Delta,
read it back with Spark and with independent readers (deltalake, pyarrow.parquet, DuckDB), record by record."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from deltalake import DeltaTable
from pyspark.sql import DataFrame, SparkSession

from deploy.errors import StackError
from deploy.spark_cluster import start_cluster
from deploy.spark_jars import spark_jars
from deploy.stack import Endpoints
from reader.listing import list_remote_partitions
from reader.spark.export import NOT_JSON, NOT_UTF8, ExportRequest, run_export
from reader.spark.jvm_source import jvm_enabled, load
from reader.spark.options import store_options
from reader.spark.session import export_session
from tests.conftest import create_topic
from tests.export_readers import exported_rows
from tests.s3_fault_proxy import RESET, SLOW_DOWN, S3FaultProxy
from tests.sidecar_harness import Produced, produce_mixed, settings, wait_for, write_config
from tiering.cli.main import main
from tiering.config import SidecarSettings
from tiering.sidecar.context import SidecarContext
from tiering.sidecar.runner import Sidecar
from tiering_core.kafka_cluster import KafkaCluster
from tiering_core.stores.factory import open_store

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@dataclass
class Tiered:
    topic: str
    config: Path
    settings: SidecarSettings
    produced: Produced  # offset -> (key, value, headers), aborted ones included

    def committed(self, upto: int, start: int = 0) -> dict[int, str]:
        """Digest of every committed record in ``[start, upto]``."""
        return {
            o: digest(o, k, v, list(h) or None)
            for o, (k, v, h) in self.produced.items()
            if start <= o <= upto and not (k or b"").startswith(b"txn-False")
        }

    def aborted(self) -> set[int]:
        return {o for o, (k, _, _) in self.produced.items() if (k or b"").startswith(b"txn-False")}


def digest(offset: int, key: bytes | None, value: bytes | None, headers: list | None) -> str:
    """``headers``: a record's (key, value) pairs, None for a record without any (null: as Spark's Kafka source
    gives those, the export must, so an empty list digests apart from None)."""
    h = hashlib.sha256(repr((offset, key, value, headers)).encode())
    return h.hexdigest()


def header_pairs(headers: list | None) -> list | None:
    """An exported headers value (a list of key/value structs, or null) as ``digest`` takes it."""
    return None if headers is None else [(h["key"], h["value"]) for h in headers]


def filler_value(n: int, i: int) -> bytes:
    """Half JSON objects, half binary values that are not UTF-8 (some of them starting like a JSON object)."""
    if i % 2 == 0:
        names = {"offset": -n, "_corrupt": f"c{n}", "_malformed": f"m{n}"}  # like columns of the export's own
        return json.dumps({"n": n, "name": f"item-{i % 50}", **names}).encode()
    noise = hashlib.sha256(str(n).encode()).digest()
    return b'{"n": "\xff' + noise if i % 4 == 1 else b"\x86" + noise


def value_kind(value: bytes | None) -> str:
    """none, binary (not UTF-8), json (an object) or text."""
    if value is None:
        return "none"
    try:
        doc = json.loads(value.decode())
    except UnicodeDecodeError:
        return "binary"
    except ValueError:
        return "text"
    return "json" if isinstance(doc, dict) else "text"


def produce_json_filler(bootstrap: str, topic: str, count: int, seed: int, produced: Produced) -> None:
    """JSON and binary values (the text ones come from produce_mixed); enough to roll the segments before them."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.size": 65536})
    for i in range(count):
        record = (f"j-{seed + i}".encode(), filler_value(seed + i, i), [])

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


def enable_and_tier(config: Path, topic: str) -> None:
    """Enable tiering of ``topic`` (1 MiB of local retention); run the sidecar until its rolled segments are copied."""
    enabled = CliRunner().invoke(main, ["topic", "enable", topic, "--local-retention-bytes", str(1 << 20),
                                        "--config", str(config)])  # fmt: skip
    assert enabled.exit_code == 0, enabled.output
    tier_everything_rolled(config, topic)


def cli_export(topic: str, fmt: str, path: Path, config: Path, *options: str) -> dict[str, Any]:
    """``tiering export`` in a process of its own (``local[2]``); its JSON summary."""
    run = subprocess.run(
        [sys.executable, "-m", "tiering", "export", topic, "--format", fmt, "--path", str(path), *options,
         "--master", "local[2]", "--config", str(config)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def registry_storage_topic(bootstrap: str, records: list[tuple[bytes | None, bytes | None]]) -> str:
    """A new compacted topic holding ``records`` as a schema registry's storage topic (``_schemas``) does."""
    name = f"_schemas-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, 1, 1, config={"cleanup.policy": "compact"})])[name].result(60)
    producer = Producer({"bootstrap.servers": bootstrap})
    for key, value in records:
        producer.produce(name, key=key, value=value)
    assert producer.flush(30) == 0
    return name


def local_spark(app_name: str) -> Iterator[SparkSession]:
    """A module's Spark session (``local[2]``, the export's jars), stopped after its tests."""
    session = export_session("local[2]", spark_jars(), app_name=app_name)
    yield session
    session.stop()


@pytest.fixture(scope="module")
def tiered(stack: Endpoints, tmp_path_factory: pytest.TempPathFactory) -> Tiered:
    topic = create_topic(stack.bootstrap, internal_segment_bytes=128 * 1024)
    produced = produce_mixed(stack.bootstrap, topic, 15_000)
    produce_json_filler(stack.bootstrap, topic, 4_000, 0, produced)
    config = write_config(stack, tmp_path_factory.mktemp("export-sidecar"))
    enable_and_tier(config, topic)
    return Tiered(topic, config, settings(config), produced)


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    yield from local_spark("export tests")


def spark_digests(spark: SparkSession, path: str, fmt: str) -> dict[int, str]:
    df = (spark.read.format("delta").load(path) if fmt == "delta" else spark.read.parquet(path)).select(
        "offset", "key", "value", "headers"
    )
    return {r.offset: digest(r.offset, r.key, r.value, header_pairs(r.headers)) for r in df.collect()}


def independent_digests(path: str, fmt: str) -> dict[int, str]:
    """Digests of the exported records as deltalake, pyarrow.parquet and DuckDB read them (all alike)."""
    rows = exported_rows(path, fmt, ["offset", "key", "value", "headers"])
    out = {r["offset"]: digest(r["offset"], r["key"], r["value"], header_pairs(r["headers"])) for r in rows}
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


def test_export_from_a_throttling_store_is_retried_and_skips_nothing(
    tiered: Tiered, spark: SparkSession, stack: Endpoints, tmp_path: Path
) -> None:
    """Every distinct GET's answer cut mid-body then 503 SlowDown, every listing 503 SlowDown, on the driver and on
    the executors: the driver's store retries them (max_attempts 2 in the tests: the GET is made again after the cut
    body, botocore retries the 503), the JVM reader's tasks ask for the window again, and the export is every
    committed record, once."""
    with S3FaultProxy(stack.s3.endpoint_url) as proxy:
        store = tiered.settings.remote_storage.model_copy(update={"endpoint_url": proxy.endpoint_url})
        proxy.throttle("GetObject", RESET, SLOW_DOWN)
        proxy.throttle("ListObjects", SLOW_DOWN)
        result = run_export(spark, ExportRequest(topic=tiered.topic, format="parquet", path=str(tmp_path), store=store))
    assert result.committed
    (rng,) = result.ranges
    assert rng.first == 0
    expected = tiered.committed(rng.last)
    assert result.rows == len(expected)
    assert independent_digests(str(tmp_path), "parquet") == expected
    assert proxy.injected[("GetObject", RESET.name)] == proxy.injected[("GetObject", SLOW_DOWN.name)] >= 10
    assert proxy.injected[("ListObjects", SLOW_DOWN.name)] >= 1


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


def test_an_incremental_run_with_nothing_new_answers_before_spark_starts(tiered: Tiered, tmp_path: Path) -> None:
    """A scheduled incremental export that finds nothing new answers from the commit markers alone: given a
    Spark master nobody listens on, it still answers, commits nothing and writes nothing."""
    path = tmp_path / "pq"
    first = cli_export(tiered.topic, "parquet", path, tiered.config, "--incremental")
    assert first["committed"] and first["rows"] > 0
    files = sorted(p for p in path.rglob("*") if p.is_file())
    run = subprocess.run(
        [sys.executable, "-m", "tiering", "export", tiered.topic, "--path", str(path), "--incremental",
         "--master", "spark://127.0.0.1:9", "--config", str(tiered.config)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads(run.stdout.strip().splitlines()[-1])
    assert (summary["committed"], summary["rows"], summary["ranges"]) == (False, 0, {})
    assert sorted(p for p in path.rglob("*") if p.is_file()) == files


def test_same_ranges_exported_twice_commit_once_in_delta(tiered: Tiered, spark: SparkSession, tmp_path: Path) -> None:
    """Delta's idempotent write keyed by the offset ranges: a repeated (or concurrent) run of the same
    ranges commits nothing, even without --incremental."""
    path = tmp_path / "delta"
    once = run_export(spark, request(tiered, "delta", path, ending={0: 3000}))
    twice = run_export(spark, request(tiered, "delta", path, ending={0: 3000}))
    assert once.committed and not twice.committed
    assert independent_digests(str(path), "delta") == tiered.committed(2999)


@pytest.mark.parametrize(
    ("fmt", "schema"),
    [
        ("parquet", None),
        ("delta", None),
        ("parquet", "n BIGINT, name STRING, offset BIGINT, _corrupt STRING, _malformed STRING"),
    ],
)
def test_json_values_become_columns_and_the_others_are_named_in_corrupt(
    tiered: Tiered, spark: SparkSession, tmp_path: Path, fmt: str, schema: str | None
) -> None:
    """Values half JSON objects, half binary (not UTF-8) or text: every reader reads the table (no invalid
    UTF-8 in a string column); the raw value stays in the binary column, ``_corrupt`` says why a value gave
    no fields. JSON fields named like a Kafka column or ``_corrupt`` get a ``value_`` prefix (and one named
    like the JSON parser's own corrupt record column is a field as any other)."""
    result = run_export(spark, request(tiered, fmt, tmp_path / fmt, value_format="json", json_schema=schema))
    (rng,) = result.ranges
    columns = ["offset", "value", "n", "name", "value_offset", "value__corrupt", "_malformed", "_corrupt"]
    rows = {r["offset"]: r for r in exported_rows(str(tmp_path / fmt), fmt, columns)}
    assert result.rows == len(rows) and rows.keys() == tiered.committed(rng.last).keys()
    kinds: Counter[str] = Counter()
    for offset, row in rows.items():
        value = tiered.produced[offset][1]
        kind = value_kind(value)
        kinds[kind] += 1
        assert row["value"] == value, f"offset {offset}: the raw value differs"
        got = tuple(row[c] for c in columns[2:])
        if kind == "json":
            doc = json.loads(value)
            assert got == (doc["n"], doc["name"], doc["offset"], doc["_corrupt"], doc["_malformed"], None), offset
        else:
            reason = {"none": None, "binary": NOT_UTF8, "text": NOT_JSON}[kind]
            assert got == (None, None, None, None, None, reason), f"offset {offset} ({kind})"
    assert kinds["json"] and kinds["binary"] and kinds["text"] and kinds["none"], kinds
    corrupt = spark.read.format(fmt).load(str(tmp_path / fmt)).where("_corrupt IS NOT NULL").count()
    assert corrupt == kinds["binary"] + kinds["text"]


def test_timestamps_select_the_offsets_kafka_would(tiered: Tiered, spark: SparkSession, tmp_path: Path) -> None:
    """--from/--to times: from the earliest offset whose timestamp is >= the start (ListOffsets by time),
    up to before the earliest offset whose timestamp is >= the end."""
    base = run_export(spark, request(tiered, "parquet", tmp_path / "all", ending={0: 6000}))
    rows = [(r["offset"], int(r["timestamp"].timestamp() * 1000))
            for r in exported_rows(str(tmp_path / "all"), "parquet", ["offset", "timestamp"])]  # fmt: skip
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


def test_the_rows_are_sparks_kafka_source_rows_where_the_broker_still_has_them(
    tiered: Tiered, spark: SparkSession, stack: Endpoints
) -> None:
    """Spark's own Kafka source (a reader we did not write) and ours, on the offsets both can read (remote, and
    still on the broker's disk): the same rows, every column, headers null where a record has none."""
    local = KafkaCluster(stack.bootstrap).local_offsets([(tiered.topic, 0)])[(tiered.topic, 0)]
    [rp] = list_remote_partitions(open_store(tiered.settings.remote_storage), [tiered.topic])
    first, end = local.lx, min(rp.end + 1, local.ly)
    offsets = {"startingOffsets": json.dumps({tiered.topic: {"0": first}}),
               "endingOffsets": json.dumps({tiered.topic: {"0": end}})}  # fmt: skip
    sources = {
        "kafka": spark.read.format("kafka").option("kafka.bootstrap.servers", stack.bootstrap)
        .option("kafka.isolation.level", "read_committed").option("includeHeaders", "true"),
        "kafka_tiered": spark.read.format("kafka_tiered").options(**store_options(tiered.settings.remote_storage)),
    }  # fmt: skip
    rows = {}
    for name, source in sources.items():
        df = source.option("subscribe", tiered.topic).options(**offsets).load()
        rows[name] = [(*r[:7], header_pairs(r.headers)) for r in df.orderBy("offset").collect()]
    assert rows["kafka_tiered"] == rows["kafka"]
    headers = [r[7] for r in rows["kafka"]]
    assert len(headers) > 100 and None in headers and any(headers), "too few records, or none with(out) headers"


def _first_log_key(tiered: Tiered) -> str:
    store = open_store(tiered.settings.remote_storage)
    keys = sorted(k for k in store.list_keys(f"{tiered.topic}-") if k.endswith(".log"))
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
            # the object's CRC-32C when one window holds it whole (the core's check), else the batch's (the decoder's)
            expected = "remote object missing" if damage == "missing" else "CRC-32C (mismatch|of the object does not)"
            assert re.search(expected, str(failure.value)), str(failure.value)[-500:]
    finally:
        store.put_bytes(key, original)
    assert len(DeltaTable(str(tmp_path / "delta")).history()) == 1, "a partial Delta commit"
    parquet = tmp_path / "parquet"
    assert not list(parquet.glob("_kafka_tiered/**/*.json")), "a Parquet commit marker for a failed run"
    assert not list(parquet.glob("partition=*/**/*.parquet")), "data files of a failed run"


def test_a_damaged_index_object_fails_the_plan_naming_its_key_before_any_spark_work(
    tiered: Tiered, spark: SparkSession, tmp_path: Path
) -> None:
    """The driver plans through the read core's index cache: a copy's ``.indexes`` is checked against its
    manifest's CRC-32C before its offset index places a slice (a range starting inside the copy needs it)."""
    store = open_store(tiered.settings.remote_storage)
    log_key = _first_log_key(tiered)
    key = log_key.removesuffix(".log") + ".indexes"
    inside = int(log_key.rsplit("/", 1)[-1].split("-")[0].split(".")[0]) + 1
    original = store.get_bytes(key)
    tracker = spark.sparkContext.statusTracker()
    jobs_before = set(tracker.getJobIdsForGroup(None))
    try:
        broken = bytearray(original)
        broken[len(broken) // 2] ^= 0x55
        store.put_bytes(key, bytes(broken))
        with pytest.raises(Exception, match=re.escape(key)) as failure:
            run_export(spark, request(tiered, "parquet", tmp_path / "out", starting={0: inside}))
        assert "CRC-32C" in str(failure.value), str(failure.value)[-500:]
    finally:
        store.put_bytes(key, original)
    assert set(tracker.getJobIdsForGroup(None)) == jobs_before, "Spark ran a job on a plan from a damaged index"
    assert not list((tmp_path / "out").glob("partition=*/**/*.parquet"))


def test_unknown_topic_and_bad_options_fail_before_any_spark_work(
    tiered: Tiered, spark: SparkSession, tmp_path: Path
) -> None:
    env = {**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    cmd = [sys.executable, "-m", "tiering", "export", "no-such-topic", "--path", str(tmp_path / "x"),
           "--config", str(tiered.config)]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120, check=False)
    assert out.returncode != 0
    assert "topic 'no-such-topic' has no remote copy" in out.stderr
    assert "SparkContext" not in out.stderr and "log4j" not in out.stderr, "Spark started for a bad request"
    assert not (tmp_path / "x").exists()
    bad = subprocess.run([*cmd[:4], tiered.topic, *cmd[5:], "--from", "soon"], capture_output=True, text=True,
                         env=env, timeout=120, check=False)  # fmt: skip
    assert bad.returncode == 2 and "'soon' is not an offset" in bad.stderr and "log4j" not in bad.stderr

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


def _all_rows(df: DataFrame) -> dict[int, tuple]:
    rows = {}
    for r in df.collect():
        assert r.offset not in rows, f"offset {r.offset} read twice"
        rows[r.offset] = (r.key, r.value, r.topic, r.partition, r.timestamp, r.timestampType, header_pairs(r.headers))
    return rows


@pytest.mark.parametrize(
    "shape", [{}, {"maxSliceBytes": "24576", "maxRowsPerBatch": "1000"}, {"startingOffsets": "mid"}]
)
def test_the_jvm_reader_gives_the_python_sources_rows(tiered: Tiered, spark: SparkSession, shape: dict) -> None:
    """``tiering export`` reads through the JVM reader (``kafka_tiered_slices``, planned by the same Python code);
    every column of every row is the Python data source's, and the committed records produced, with no offset
    missing: whole copies, slices of 24 KiB that begin and end inside objects with small column batches, and a
    range starting inside a copy."""
    assert jvm_enabled(spark), "the export session has no JVM reader"
    options = {"subscribe": tiered.topic, **store_options(tiered.settings.remote_storage)}
    [rp] = list_remote_partitions(open_store(tiered.settings.remote_storage), [tiered.topic])
    start = (rp.copies[2].first + rp.copies[2].last) // 2 if shape.get("startingOffsets") == "mid" else 0
    options.update({k: v for k, v in shape.items() if k != "startingOffsets"})
    options["startingOffsets"] = json.dumps({tiered.topic: {"0": start}})
    jvm = load(spark, options)
    assert "kafka_tiered_slices" in jvm._jdf.queryExecution().executedPlan().toString()
    python = spark.read.format("kafka_tiered").options(**options).load()
    got, reference = _all_rows(jvm), _all_rows(python)
    expected = tiered.committed(max(reference), start=start)
    assert sorted(got) == sorted(reference) == sorted(expected), "offsets differ between the readers"
    assert got == reference
    assert {o: digest(o, k, v, h) for o, (k, v, _, _, _, _, h) in got.items()} == expected
