"""``tiering demo``: the quickstart's whole loop on the local stack, shown step by step."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

import click
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import NewTopic
from rich.console import Console
from rich.table import Table

from deploy import stack
from deploy.cli import default_stack_dir
from deploy.errors import StackError
from deploy.sidecar_config import write_sidecar_config
from reader import TieredConsumer, TieredMessage, load_reader_settings
from tiering.cli.topic import enable, status
from tiering.config import load_settings
from tiering.sidecar.context import SidecarContext
from tiering.sidecar.inprocess import tier_until
from tiering_core.formats import iter_batches, list_segments, mapped, scan_headers
from tiering_core.kafka_logs import admin_client, kafka_logging
from tiering_core.produce import produce_waiting

console = Console()
LOG_NAME = "demo.log"


@contextmanager
def stderr_to(path: Path) -> Iterator[None]:
    """Send whatever the process writes to its stderr (file descriptor 2) to ``path`` while the block runs.

    The descriptor, not only ``sys.stderr``: librdkafka's lines come through Python's logging, but Spark's
    JVM (log4j's lines, the JVM's own WARNING lines) writes to the descriptor it inherited when PySpark
    started it. It is restored before an error leaves the block, so the error itself is shown.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    with path.open("ab") as log:
        os.dup2(log.fileno(), 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def _value(i: int) -> bytes:
    """The demo's record number ``i`` (regenerated to check what is read back)."""
    note = "x" * (i % 400)
    return f'{{"order": {i}, "customer": "c-{i % 977}", "amount": {i % 1000 / 10:.2f}, "note": "{note}"}}'.encode()


def _produce(bootstrap: str, topic: str, megabytes: int) -> int:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 10, **kafka_logging()})
    target = megabytes * 1024 * 1024
    sent = 0
    i = 0
    while sent < target:
        value = _value(i)
        produce_waiting(producer, topic, key=f"c-{i % 977}".encode(), value=value, headers=[("source", b"demo")])
        sent += len(value) + 10
        i += 1
    if producer.flush(120) != 0:
        raise click.ClickException("producing to the demo topic did not finish")
    return i


def show_segments(partition_dir: Path) -> None:
    table = Table(title=f"segments of {partition_dir.name}")
    for col in ("base offset", "last offset", "bytes", "batches", "state"):
        table.add_column(col, justify="right")
    segments = list_segments(partition_dir)
    for n, segment in enumerate(segments):
        with mapped(segment.log) as buf:
            headers = list(scan_headers(str(segment.log), buf))
        last = str(headers[-1].last_offset) if headers else "-"
        state = "active" if n == len(segments) - 1 else "rolled"
        table.add_row(str(segment.base_offset), last, f"{segment.log.stat().st_size:,}", str(len(headers)), state)
    console.print(table)


def show_sample(partition_dir: Path, count: int = 5) -> None:
    first = list_segments(partition_dir)[0]
    table = Table(title=f"first records decoded from {first.log.name}")
    for col in ("offset", "timestamp", "key", "value", "headers", "codec"):
        table.add_column(col)
    shown = 0
    with mapped(first.log) as buf:
        for batch in iter_batches(str(first.log), buf):
            for r in batch.records:
                value = (r.value or b"")[:40].decode(errors="replace")
                headers = ", ".join(f"{k}={v!r}" for k, v in r.headers)
                table.add_row(str(r.offset), str(r.timestamp), repr(r.key), value, headers, batch.header.compression)
                shown += 1
                if shown == count:
                    console.print(table)
                    return
    console.print(table)


@click.command()
@click.option(
    "--stack-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=default_stack_dir,
    show_default="$TIERING_DEV_DIR or ./.tiering/dev",
    help="Where the local stack runs.",
)
@click.option(
    "--mb",
    "megabytes",
    type=click.IntRange(1, 1024),
    default=8,
    show_default=True,
    help="Megabytes of records to produce.",
)
@click.option(
    "--verbose",
    is_flag=True,
    help=f"Show the Kafka clients' and Spark's log lines here, between the steps (default: in <stack-dir>/{LOG_NAME}).",
)
@click.pass_context
def demo(click_ctx: click.Context, stack_dir: Path, megabytes: int, verbose: bool) -> None:
    """The whole loop on the local stack: produce, tier, delete locally, show the status, export.

    Starts the stack, produces to a topic with 1 MiB segments, shows the segments and a sample decoded
    from the broker's files, enables tiering with local.retention.bytes=2 MiB, runs the sidecar until
    the uploaded segments are gone from the broker's disk, prints the topic's tiering status, reads
    the topic back from offset 0 through the TieredConsumer (the remote part first, then the broker's),
    exports the tiered segments to Parquet with Spark and prints a few rows, and ends by reading the
    topic from offset 0 with Kafka's own console consumer through the access layer (`tiering proxy`).

    The log lines of the Kafka clients and of Spark go to <stack-dir>/demo.log (unless --verbose), and
    the stack keeps running at the end (`tiering dev down` stops it).
    """
    stack_dir.mkdir(parents=True, exist_ok=True)
    log_path = stack_dir / LOG_NAME
    with nullcontext() if verbose else stderr_to(log_path):
        story(click_ctx, stack_dir, megabytes)
    console.rule("the stack keeps running")
    console.print(f"Kafka, MinIO and etcd still run from {stack_dir}; stop them with: "
                  f"tiering dev down --dir {stack_dir}")  # fmt: skip
    if not verbose:
        console.print(f"the Kafka clients' and Spark's log lines are in {log_path}")


def story(click_ctx: click.Context, stack_dir: Path, megabytes: int) -> None:
    """The demo's steps, each under its heading."""
    console.rule("1. the local stack")
    try:
        endpoints = stack.start(stack_dir)
    except StackError as exc:
        raise click.ClickException(str(exc)) from exc
    console.print(f"Kafka {endpoints.bootstrap}  S3 {endpoints.s3.endpoint_url}  etcd {endpoints.etcd.url}")
    topic = f"demo-orders-{int(time.time())}"
    console.rule(f"2. topic {topic} with segment.bytes=1 MiB")
    admin = admin_client({"bootstrap.servers": endpoints.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1, config={"segment.bytes": str(1024 * 1024)})])[topic].result(60)
    records = _produce(endpoints.bootstrap, topic, megabytes)
    console.print(f"produced {records:,} records (~{megabytes} MiB)")
    time.sleep(1)
    partition_dir = Path(endpoints.brokers[0].log_dir) / f"{topic}-0"
    console.rule("3. the broker's segments")
    show_segments(partition_dir)
    show_sample(partition_dir)

    console.rule("4. enable tiering (local.retention.bytes = 2 MiB) and run the sidecar")
    config = write_sidecar_config(endpoints, endpoints.brokers[0].id)
    console.print(f"sidecar configuration: {config}")
    click_ctx.invoke(enable, name=topic, local_retention_ms=-2, local_retention_bytes=2 * 1024 * 1024,
                     config_file=config)  # fmt: skip

    def tiered(ctx: SidecarContext) -> bool:
        offsets = ctx.cluster.local_offsets([(topic, 0)])[(topic, 0)]
        return offsets.lx > 0 and len(list_segments(partition_dir)) <= 4

    tier_until(config, tiered, 120)
    console.rule("5. the broker's segments after local retention (older data now lives in S3)")
    show_segments(partition_dir)
    console.rule("6. tiering status")
    click_ctx.invoke(status, name=topic, as_json=False, config_file=config)
    console.rule("7. read it back from offset 0 through the TieredConsumer (remote, then the broker)")
    read_back(config, topic, records)
    console.rule("8. export the tiered segments to Parquet with Spark (from S3 only, no broker)")
    export_to_parquet(config, topic, stack_dir / "export" / topic)
    console.rule("9. any Kafka client reads it from offset 0: Kafka's own console consumer through the proxy")
    read_through_proxy(config, endpoints, topic, records)


def read_back(config: Path, topic: str, records: int) -> None:
    """Read every record from offset 0, check it against what was produced, show where each part came from."""
    settings = load_reader_settings(config)
    consumer_config = {"bootstrap.servers": settings.bootstrap_servers, "group.id": f"demo-{topic}",
                       "enable.auto.commit": False, **kafka_logging()}  # fmt: skip
    parts: dict[str, list[int]] = {"remote (S3)": [], "broker": []}
    with TieredConsumer(consumer_config, settings) as consumer:
        consumer.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + 300
        seen = 0
        while seen < records and time.monotonic() < deadline:
            for m in consumer.consume(1000, 1.0):
                if m.error() is not None:
                    raise click.ClickException(f"reading back failed: {m.error().str()}")
                if m.offset() != seen or m.value() != _value(seen):
                    raise click.ClickException(f"offset {m.offset()} is not record {seen} as produced")
                parts["remote (S3)" if isinstance(m, TieredMessage) else "broker"].append(m.offset())
                seen += 1
    table = Table(title=f"{topic}-0 read back from offset 0")
    for col in ("from", "offsets", "records"):
        table.add_column(col, justify="right")
    for where, offsets in parts.items():
        span = f"{offsets[0]:,} .. {offsets[-1]:,}" if offsets else "-"
        table.add_row(where, span, f"{len(offsets):,}")
    console.print(table)
    if seen != records:
        raise click.ClickException(f"read back {seen:,} of {records:,} records")
    console.print(f"all {seen:,} records read back identical to what was produced, in order, no gap or duplicate; "
                  f"the remote part ends at {parts['remote (S3)'][-1] if parts['remote (S3)'] else '-'}, "
                  f"the broker's begins at {parts['broker'][0] if parts['broker'] else '-'}")  # fmt: skip


def read_through_proxy(config: Path, endpoints: stack.Endpoints, topic: str, records: int) -> None:
    """Start the access layer in front of the stack and read the topic with Kafka's Java console consumer
    (``--from-beginning``): its only change is bootstrap.servers. Every value is checked."""
    from deploy.kafka import run_kafka_tool
    from deploy.procs import free_port
    from reader.proxy import ProxyListen, load_proxy_settings, running_proxy

    ports = {b.id: free_port() for b in endpoints.brokers}
    settings = load_proxy_settings(config, proxy=ProxyListen(bootstrap_port=free_port(), broker_ports=ports,
                                                             broker_port_base=None))  # fmt: skip
    with running_proxy(settings) as proxy:
        bootstrap = f"127.0.0.1:{proxy.bootstrap_port}"
        console.print(f"tiering proxy serve: bootstrap {bootstrap}, brokers on {ports}")
        console.print(f"$ kafka-console-consumer --bootstrap-server {bootstrap} --topic {topic} --from-beginning")
        result = run_kafka_tool(
            "org.apache.kafka.tools.consumer.ConsoleConsumer", "--bootstrap-server", bootstrap, "--topic", topic,
            "--from-beginning", "--max-messages", str(records), "--timeout-ms", "60000",
            "--property", "print.offset=true", timeout=300,
        )  # fmt: skip
        remote = proxy.metrics.fetch_partitions.labels("remote")._value.get()
        broker = proxy.metrics.fetch_partitions.labels("broker")._value.get()
    lines = [line.split("\t", 1) for line in result.stdout.splitlines() if line.startswith("Offset:")]
    wrong = [o for o, v in ((int(x[0][7:]), x[1].encode()) for x in lines) if v != _value(o)]
    if len(lines) != records or wrong:
        raise click.ClickException(f"the console consumer read {len(lines):,} of {records:,} records through the "
                                   f"proxy ({len(wrong)} differ): {result.stderr[-1500:]}")  # fmt: skip
    for offset, value in lines[:3]:
        console.print(f"{offset}\t{value[:60]}...")
    console.print(f"the console consumer read all {records:,} records from offset 0, identical to what was "
                  f"produced; the proxy answered {remote:.0f} partition fetches from S3 and {broker:.0f} from "
                  "the broker")  # fmt: skip


def export_to_parquet(config: Path, topic: str, path: Path) -> None:
    """Run the export job (local Spark) and print its ranges and the first rows read back with pyarrow."""
    import pyarrow.dataset as pads

    from deploy.spark_jars import spark_jars
    from reader.spark.export import ExportRequest, run_export
    from reader.spark.session import export_session

    settings = load_settings(config)
    spark = export_session("local[2]", spark_jars(), app_name="tiering demo export")
    try:
        result = run_export(spark, ExportRequest(topic=topic, format="parquet", path=str(path),
                                                 store=settings.remote_storage))  # fmt: skip
    finally:
        spark.stop()
    ranges = ", ".join(f"partition {r.partition}: offsets {r.first}-{r.last}" for r in result.ranges)
    console.print(f"exported {result.rows:,} records ({ranges}) to {path}")
    table = pads.dataset(str(path), format="parquet", partitioning="hive").to_table().sort_by("offset")
    shown = Table(title="first rows of the Parquet output (partition=0, read back with pyarrow)")
    for col in ("offset", "timestamp (UTC)", "key", "value", "headers"):
        shown.add_column(col)
    for row in table.slice(0, 5).to_pylist():
        headers = ", ".join(f"{h['key']}={(h['value'] or b'').decode()}" for h in row["headers"])
        shown.add_row(str(row["offset"]), row["timestamp"].strftime("%H:%M:%S.%f")[:-3],
                      (row["key"] or b"").decode(errors="replace"),
                      (row["value"] or b"")[:28].decode(errors="replace") + "...", headers)  # fmt: skip
    console.print(shown)
