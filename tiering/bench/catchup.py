"""``tiering bench catchup``: a catch-up read through the TieredConsumer (remote) beside a plain
confluent-kafka consumer reading the same records from the broker's local disk.

For each record size, the same records (same codec) go to two topics: one tiered by the sidecar
(its data then lives in S3 and the broker deletes it locally) and a control topic without tiering.
Each side reads its topic from offset 0 to the end in a child process (peak RSS sampled for that
side alone) with the same loop: ``consume(up to 1000)``, touching every value. The last call asks for
exactly the records left: ``consume(n, timeout)`` waits until it has ``n`` messages or the timeout
passes, so asking 1000 when 288 are left measured a one second wait for records that do not exist
(the broker side's time was counted about 1 s too long, ours about 0.2 s).
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from pathlib import Path

import click
from confluent_kafka import Producer
from confluent_kafka.admin import NewTopic

from deploy.bench_stack import bench_stack, stack_dir_option
from deploy.sidecar_config import write_sidecar_config
from tiering.bench.upload import run_sampled
from tiering.cli.main import main as tiering_main
from tiering.sidecar.inprocess import tier_until
from tiering_core.kafka_logs import admin_client
from tiering_core.produce import produce_waiting

_CHILD = "from tiering.bench.catchup import child_main; child_main()"


def segment_bytes(size_mb: int) -> int:
    """Segments of 1/16 of the data (1 to 64 MiB): most of it tiers, the broker keeps one segment."""
    return max(1 << 20, min(64 << 20, (size_mb << 20) // 16))


def child_main() -> None:
    """Read argv[2]'s topic from offset 0 to its end with side argv[1] ('ours' or 'broker'); one JSON line."""
    from confluent_kafka import Consumer, TopicPartition

    from reader import TieredConsumer, load_reader_settings

    side, spec = sys.argv[1], json.loads(sys.argv[2])
    config = {"bootstrap.servers": spec["bootstrap"], "group.id": f"bench-{uuid.uuid4().hex[:8]}",
              "enable.auto.commit": False, "auto.offset.reset": "earliest"}  # fmt: skip
    start = time.perf_counter()
    if side == "ours":
        consumer = TieredConsumer(config, load_reader_settings(Path(spec["config"])))
    else:
        consumer = Consumer(config)
    consumer.assign([TopicPartition(spec["topic"], 0, 0)])
    end, count, size, first = spec["end"], 0, 0, None
    position = 0
    while position < end:
        # one record until the first came: consume(1000) returns after 1000 records or its timeout, which is
        # not the first record's time
        for m in consumer.consume(1 if first is None else min(1000, end - position), 1.0):
            if m.error() is not None:
                raise SystemExit(f"{side}: {m.error()}")
            value = m.value()
            size += len(value) if value is not None else 0
            count += 1
            position = m.offset() + 1
        if first is None and count:
            first = (time.perf_counter() - start) * 1000
    seconds = time.perf_counter() - start
    consumer.close()
    print(json.dumps({"side": side, "seconds": seconds, "records": count, "bytes": size, "first_record_ms": first}))


def _produce(bootstrap: str, topics: list[str], megabytes: int, record_size: int, codec: str) -> int:
    """The same records to each topic; returns the count."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1 << 20,
                         "compression.type": codec})  # fmt: skip
    pool = [os.urandom(record_size // 2).hex().encode()[:record_size] for _ in range(256)]
    count = megabytes * 1024 * 1024 // record_size
    for i in range(count):
        value = pool[i % 256]
        for topic in topics:
            produce_waiting(producer, topic, key=str(i).encode(), value=value, partition=0)
    if producer.flush(600) != 0:
        raise click.ClickException("producing the benchmark data did not finish")
    return count


def _tier(config: Path, topic: str, end: int, segment: int) -> None:
    """Enable tiering with a small local retention and run the sidecar until the broker keeps only its tail."""
    tiering_main(["topic", "enable", topic, "--local-retention-bytes", str(segment), "--config", str(config)],
                 standalone_mode=False)  # fmt: skip
    if not tier_until(config, lambda ctx: ctx.cluster.local_offsets([(topic, 0)])[(topic, 0)].lx >= end * 0.75, 1800):
        raise click.ClickException(f"tiering {topic} did not get the log start past 75% within 30 minutes")


@click.command()
@click.option("--size-mb", type=click.IntRange(16, 16384), default=512, show_default=True,
              help="Megabytes of records per record size (the issue asks for at least 512).")  # fmt: skip
@click.option("--codec", type=click.Choice(["none", "gzip", "snappy", "lz4", "zstd"]), default="lz4",
              show_default=True, help="Compression of both topics.")  # fmt: skip
@stack_dir_option
def catchup(size_mb: int, codec: str, stack_dir: Path | None) -> None:
    """Catch-up read from remote (TieredConsumer) beside a plain consumer on the broker's local disk.

    Records of ~100 B and ~1 KB. Prints one JSON object per side and size, then a last line with
    `ratio` (ours / broker MB/s, the lower of the two sizes' ratios), `first_record_ms` and `peak_rss_mb`
    (ours, the highest of the runs). Target ratio >= 1.0; peak RSS <= the pool cap + 100 MB.
    """
    with bench_stack(stack_dir) as endpoints:
        config = write_sidecar_config(endpoints, endpoints.brokers[0].id)
        admin = admin_client({"bootstrap.servers": endpoints.bootstrap})
        summary: dict[int, dict] = {}
        for record_size in (100, 1024):
            stamp = f"{os.getpid()}-{int(time.time())}-{record_size}"
            tiered, control = f"bench-catchup-tiered-{stamp}", f"bench-catchup-control-{stamp}"
            segment = segment_bytes(size_mb)
            topic_config = {"segment.bytes": str(segment)}
            for name, future in admin.create_topics([NewTopic(t, 1, 1, config=topic_config)
                                                     for t in (tiered, control)]).items():  # fmt: skip
                future.result(60)
                del name
            count = _produce(endpoints.bootstrap, [tiered, control], size_mb, record_size, codec)
            _tier(config, tiered, count, segment)
            results = {}
            for side, topic in (("broker", control), ("ours", tiered)):
                spec = {"bootstrap": endpoints.bootstrap, "topic": topic, "end": count, "config": str(config)}
                out, err, code, peak = run_sampled([sys.executable, "-c", _CHILD, side, json.dumps(spec)])
                if code != 0:
                    raise click.ClickException(f"{side} read failed:\n{err[-3000:]}")
                r = json.loads(out.strip().splitlines()[-1])
                r.update(record_size=record_size, codec=codec, peak_rss_mb=round(peak, 1),
                         mb_s=round(r["bytes"] / 1e6 / r["seconds"], 1),
                         records_s=round(r["records"] / r["seconds"]))  # fmt: skip
                if r["records"] != count:
                    raise click.ClickException(f"{side} read {r['records']} records, {count} were produced")
                results[side] = r
                click.echo(json.dumps(r))
            summary[record_size] = results
        ratios = {size: r["ours"]["mb_s"] / r["broker"]["mb_s"] for size, r in summary.items()}
        click.echo(json.dumps({
            "ratio": round(min(ratios.values()), 3),
            "first_record_ms": round(max(r["ours"]["first_record_ms"] for r in summary.values()), 1),
            "peak_rss_mb": max(r["ours"]["peak_rss_mb"] for r in summary.values()),
            "ratio_by_record_size": {str(k): round(v, 3) for k, v in ratios.items()},
            "ours_mb_s": {str(k): r["ours"]["mb_s"] for k, r in summary.items()},
            "broker_mb_s": {str(k): r["broker"]["mb_s"] for k, r in summary.items()},
            "ours_records_s": {str(k): r["ours"]["records_s"] for k, r in summary.items()},
            "broker_records_s": {str(k): r["broker"]["records_s"] for k, r in summary.items()},
            "broker_first_record_ms": round(max(r["broker"]["first_record_ms"] for r in summary.values()), 1),
            "size_mb": size_mb, "codec": codec,
        }))  # fmt: skip
