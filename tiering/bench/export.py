"""``tiering bench export``: our ``kafka_tiered`` data source beside Spark's own Kafka source.

One run, the same records: a topic is produced, its rolled segments are tiered by the sidecar (the
broker keeps everything locally too, so Spark's Kafka source can read the same offsets from it),
then one SparkSession (local[2]) writes Parquet with the same settings from
``format("kafka_tiered")`` (segments from S3, no broker) and from ``format("kafka")`` (the broker,
through its consumer protocol), both over offsets ``[0, stable end]``, each side ``--rounds`` times,
interleaved, then into Spark's ``noop`` sink (the sources alone: Parquet writing costs both sides the
same and hides the difference between them). Ours is what ``tiering export`` reads with: the JVM reader
(``reader.spark.jvm_source``) where the session has it. A small read of each warms the JVM and the Python
workers first. The source-alone rounds have a third side, the Python data source ``format("kafka_tiered")``
on the same plan, which every row leaves through a Python worker. Also reported: the Python source's reader
alone (segments from S3 to Arrow on the read core, one decoding thread with its window read ahead, no Spark).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import click
import fastavro
import pyarrow.compute as pc
import pyarrow.parquet as pq
from confluent_kafka import Producer
from confluent_kafka.admin import NewTopic

from deploy.bench_stack import bench_stack, stack_dir_option
from deploy.sidecar_config import write_sidecar_config
from deploy.spark_jars import spark_jars
from deploy.stack import Endpoints
from tiering.bench.registry_values import framed, storage_record
from tiering.cli.topic import enable
from tiering.config import load_settings
from tiering.sidecar.context import SidecarContext
from tiering.sidecar.runner import Sidecar
from tiering_core.kafka_logs import admin_client
from tiering_core.produce import produce_waiting
from tiering_core.schema_registry import schemas_from_topic

PARTITIONS = 2
PYTHON_SIDE = "python-source"


ORDER = {
    "type": "record", "name": "Order", "namespace": "bench",
    "fields": [{"name": "order", "type": "long"}, {"name": "customer", "type": "string"},
               {"name": "amount", "type": "double"}, {"name": "note", "type": "string"}],
}  # fmt: skip
SCHEMA_ID = 1


def _produce(endpoints: Endpoints, topic: str, megabytes: int, codec: str, segment_mb: int, avro: bool) -> int:
    """The records (JSON values, or Avro ones in the registry's wire format with the same fields); the count."""
    admin = admin_client({"bootstrap.servers": endpoints.bootstrap})
    config = {"segment.bytes": str(segment_mb << 20)}
    admin.create_topics([NewTopic(topic, PARTITIONS, 1, config=config)])[topic].result(60)
    producer = Producer({"bootstrap.servers": endpoints.bootstrap, "linger.ms": 20, "batch.size": 256 << 10,
                         "compression.type": codec})  # fmt: skip
    parsed = fastavro.parse_schema(ORDER) if avro else None
    target = megabytes << 20
    sent = count = 0
    while sent < target:
        doc = {"order": count, "customer": f"c-{count % 9973}", "amount": count % 10000 / 100,
               "note": "x" * (count % 160)}  # fmt: skip
        value = framed(SCHEMA_ID, parsed, doc) if avro else json.dumps(doc).encode()
        headers = [("source", b"bench")] if count % 10 == 0 else None
        produce_waiting(producer, topic, key=f"c-{count % 9973}".encode(), value=value, headers=headers)
        sent += len(value) + 12
        count += 1
    if avro:  # the registry's storage topic, where the export finds the schema
        admin.create_topics([NewTopic(f"{topic}-schemas", 1, 1)])[f"{topic}-schemas"].result(60)
        key, value = storage_record(f"{topic}-value", 1, SCHEMA_ID, ORDER)
        producer.produce(f"{topic}-schemas", key=key, value=value)
    if producer.flush(300) != 0:
        raise click.ClickException("producing the benchmark records did not finish")
    return count


def _tier(click_ctx: click.Context, endpoints: Endpoints, topic: str) -> Path:
    config = write_sidecar_config(endpoints, endpoints.brokers[0].id)
    with contextlib.redirect_stdout(sys.stderr):  # stdout carries only the benchmark's JSON
        click_ctx.invoke(enable, name=topic, local_retention_ms=-2, local_retention_bytes=-2, config_file=config)
    ctx = SidecarContext.build(load_settings(config))
    sidecar = Sidecar(ctx)
    sidecar.start()
    try:
        topic_id = ctx.cluster.topics([topic])[topic].topic_id
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            sidecar.tick()
            tasks = [sidecar.tasks.get((topic_id, p)) for p in range(PARTITIONS)]
            if all(t is not None and t.status.copy_lag_segments == 0 for t in tasks):
                return config
            time.sleep(0.5)
        raise click.ClickException("the sidecar did not copy the benchmark's segments within 15 minutes")
    finally:
        sidecar.stop()
        sidecar.close()


def _parquet_rows(path: Path) -> tuple[int, int, int]:
    """Rows, Parquet bytes, and the key and value bytes of the exported records (the keys' alone where the
    values were decoded into columns)."""
    files = list(path.rglob("*.parquet"))
    payload = 0
    for f in files:
        columns = [c for c in ("key", "value") if c in pq.read_schema(f).names]
        table = pq.read_table(f, columns=columns)
        payload += sum(pc.sum(pc.binary_length(table[c])).as_py() or 0 for c in columns)
    return sum(pq.read_metadata(f).num_rows for f in files), sum(f.stat().st_size for f in files), payload


@click.command("export")
@click.option("--size-mb", type=click.IntRange(16, 8192), default=256, show_default=True,
              help="Megabytes of records to produce (and to export on each side).")  # fmt: skip
@click.option("--codec", type=click.Choice(["none", "gzip", "snappy", "lz4", "zstd"]), default="lz4",
              show_default=True, help="Producer compression.")  # fmt: skip
@click.option("--segment-mb", type=click.IntRange(1, 1024), default=4, show_default=True,
              help="segment.bytes of the topic, in MiB (only rolled segments are tiered and compared).")  # fmt: skip
@click.option("--rounds", type=click.IntRange(1, 10), default=2, show_default=True,
              help="Timed runs of each side, interleaved; the best of each is reported.")  # fmt: skip
@click.option("--value-format", type=click.Choice(["binary", "avro"]), default="binary", show_default=True,
              help="avro: values in the schema registry's Avro wire format, decoded into typed columns on both "
              "sides: ours as `tiering export --value-format avro` does (schema from the registry's storage "
              "topic), Spark's Kafka source followed by from_avro with the same schema.")  # fmt: skip
@stack_dir_option
@click.pass_context
def export(click_ctx: click.Context, size_mb: int, codec: str, segment_mb: int, rounds: int, value_format: str,
           stack_dir: Path | None) -> None:  # fmt: skip
    """Rows/s and MB/s exporting the same records to Parquet: kafka_tiered (S3) beside Spark's Kafka source.

    Each side runs --rounds times, interleaved with the other, and its best run counts (the machine's
    load and the JVM's warm-up then hit both alike). Then each side reads the same records into Spark's
    `noop` sink, --rounds times interleaved: the source alone, without the Parquet writing both sides
    share. The last line is a JSON object with `ratio` (our rows/s / Spark Kafka source rows/s, whole
    jobs) and `source_ratio` (the same for the sources alone); `mb_s` counts the Kafka log bytes of the
    exported range (compressed, as stored), `record_mb_s` the key and value bytes of the exported records,
    the same on both sides; `reader` is jvm (the export's reader, reader.spark.jvm_source) or python (no JDK to
    build it), `decoder` the Python source's record decoder (native or python, see tiering_core.formats.native).
    A third side in the source-alone rounds, `python-source`, is the Python data source format("kafka_tiered")
    on the same plan: `python_source_ratio` is its rows/s over the Kafka source's.
    Targets: ratio >= 1.0 (stretch 2.0), source_ratio >= 3.0.
    """
    from reader.listing import UnknownTopic
    from reader.spark.export import KAFKA_COLUMNS
    from reader.spark.jvm_source import jvm_enabled, load
    from reader.spark.options import parse_options, store_options
    from reader.spark.planning import plan_reader, plan_slices
    from reader.spark.registry_avro import decode_registry_avro
    from reader.spark.session import export_session
    from reader.spark.slices import read_slices, slice_reader
    from reader.spark.source import plan, shared_store
    from tiering_core.formats.native import DECODER

    with bench_stack(stack_dir) as endpoints, tempfile.TemporaryDirectory(prefix="bench-export-") as tmp:
        topic = f"bench-export-{os.getpid()}-{int(time.time())}"
        avro = value_format == "avro"
        produced = _produce(endpoints, topic, size_mb, codec, segment_mb, avro)
        settings = load_settings(_tier(click_ctx, endpoints, topic))
        options = {"subscribe": topic, **store_options(settings.remote_storage)}
        opts = parse_options(options)
        try:
            partitions, ranges = plan(opts, shared_store(opts))
        except UnknownTopic as exc:  # every record still in the active segments: nothing tiered to compare
            raise click.ClickException(
                f"{size_mb} MB of records ({codec}) rolled no {segment_mb} MiB segment, so nothing was tiered to "
                "compare: give more --size-mb or a smaller --segment-mb"
            ) from exc
        ending = {topic: {str(r.partition): r.last + 1 for r in ranges}}
        log_bytes = sum(c.manifest.log_size for rp in partitions for c in rp.copies)

        started = time.perf_counter()
        with plan_reader(shared_store(opts), partitions) as planner:
            slices = plan_slices(planner, partitions, ranges, opts.max_slice_bytes)
        with slice_reader(shared_store(opts), partitions, opts.window_bytes) as reader:
            decoded = sum(b.num_rows for b in read_slices(reader, slices))
        decode_seconds = time.perf_counter() - started

        spark = export_session("local[2]", spark_jars(), app_name="tiering bench export")
        ending_option = {"endingOffsets": json.dumps(ending)}
        reader_jvm = jvm_enabled(spark)
        loaders = {
            "spark-kafka": lambda: spark.read.format("kafka").option("kafka.bootstrap.servers", endpoints.bootstrap)
            .option("subscribe", topic).option("startingOffsets", "earliest").option("includeHeaders", "true")
            .option("endingOffsets", json.dumps(ending)).load(),
            "ours": lambda: load(spark, {**options, **ending_option}),
            PYTHON_SIDE: lambda: spark.read.format("kafka_tiered").options(**options, **ending_option).load(),
        }  # fmt: skip
        sides = loaders
        if avro:
            schemas = schemas_from_topic(endpoints.bootstrap, {}, f"{topic}-schemas").versions(f"{topic}-value")
            sides = {
                "spark-kafka": lambda: _from_avro(loaders["spark-kafka"]()),
                **{side: lambda side=side: decode_registry_avro(loaders[side](), "value", f"{topic}-value", schemas,
                                                                set(KAFKA_COLUMNS)) for side in ("ours", PYTHON_SIDE)},
            }  # fmt: skip
        for make in sides.values():  # warm-up: JVM, Python workers, connections
            make().where("offset < 1000").write.mode("overwrite").parquet(f"{tmp}/warm")
        timings: dict[str, list[float]] = {side: [] for side in sides if side != PYTHON_SIDE}
        source_only: dict[str, list[float]] = {side: [] for side in sides}
        for _ in range(rounds):  # interleaved, so load on the machine and JIT warm-up hit both sides alike
            for side in timings:
                out = Path(tmp) / side
                shutil.rmtree(out, ignore_errors=True)
                started = time.perf_counter()
                sides[side]().write.parquet(str(out))
                timings[side].append(time.perf_counter() - started)
        for _ in range(rounds):  # the source alone: every column of every row read, nothing written
            for side, make in sides.items():
                started = time.perf_counter()
                make().write.format("noop").mode("overwrite").save()
                source_only[side].append(time.perf_counter() - started)
        results = {}
        for side in timings:
            rows, parquet_bytes, payload = _parquet_rows(Path(tmp) / side)
            seconds, alone = min(timings[side]), min(source_only[side])
            results[side] = {"side": side, "rows": rows, "seconds": round(seconds, 2),
                             "all_seconds": [round(t, 2) for t in timings[side]],
                             "rows_per_s": round(rows / seconds), "mb_s": round(log_bytes / 1e6 / seconds, 1),
                             "record_mb_s": round(payload / 1e6 / seconds, 1), "record_bytes": payload,
                             "parquet_bytes": parquet_bytes, "source_seconds": round(alone, 2),
                             "source_all_seconds": [round(t, 2) for t in source_only[side]],
                             "source_rows_per_s": round(rows / alone)}  # fmt: skip
            click.echo(json.dumps(results[side]))
        alone, rows = min(source_only[PYTHON_SIDE]), results["ours"]["rows"]  # the same plan: the same rows (tests)
        results[PYTHON_SIDE] = {"side": PYTHON_SIDE, "rows": rows, "source_seconds": round(alone, 2),
                                "source_all_seconds": [round(t, 2) for t in source_only[PYTHON_SIDE]],
                                "source_rows_per_s": round(rows / alone)}  # fmt: skip
        click.echo(json.dumps(results[PYTHON_SIDE]))
        spark.stop()
        ours, theirs, python = results["ours"], results["spark-kafka"], results[PYTHON_SIDE]
        if not ours["rows"] == theirs["rows"]:
            raise click.ClickException(
                f"the sides exported different row counts: ours {ours['rows']}, Spark's Kafka source {theirs['rows']}"
            )
        click.echo(json.dumps({
            "ratio": round(ours["rows_per_s"] / theirs["rows_per_s"], 3), "decoder": DECODER,
            "reader": "jvm" if reader_jvm else "python",
            "source_ratio": round(ours["source_rows_per_s"] / theirs["source_rows_per_s"], 3),
            "ours_source_rows_per_s": ours["source_rows_per_s"],
            "spark_kafka_source_rows_per_s": theirs["source_rows_per_s"],
            "python_source_rows_per_s": python["source_rows_per_s"],
            "python_source_ratio": round(python["source_rows_per_s"] / theirs["source_rows_per_s"], 3),
            "ours_rows_per_s": ours["rows_per_s"], "ours_mb_s": ours["mb_s"], "ours_record_mb_s": ours["record_mb_s"],
            "spark_kafka_rows_per_s": theirs["rows_per_s"], "spark_kafka_mb_s": theirs["mb_s"],
            "spark_kafka_record_mb_s": theirs["record_mb_s"],
            "decoder_only_rows_per_s": round(decoded / decode_seconds),
            "decoder_only_mb_s": round(log_bytes / 1e6 / decode_seconds, 1),
            "rows": ours["rows"], "produced": produced, "log_bytes": log_bytes, "codec": codec,
            "partitions": PARTITIONS, "segment_mb": segment_mb, "master": "local[2]", "value_format": value_format,
        }))  # fmt: skip


def _from_avro(df: Any) -> Any:
    """What a Spark job on the Kafka source does with registry-framed Avro values: the five header bytes cut
    off and the rest given to from_avro with the schema, the value's fields as columns."""
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro

    rest = [c for c in df.columns if c != "value"]
    decoded = from_avro(F.expr("substring(value, 6)"), json.dumps(ORDER))
    return df.select(*rest, decoded.alias("v")).select(*rest, "v.*")
