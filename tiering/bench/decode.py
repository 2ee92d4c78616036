"""``tiering bench decode``: our segment decoder beside kafka-python's on the broker's own files.

Measures, on the same bytes in the same run: the header-only scan (MB/s), our full decode with
CRC checks (MB/s, records/s) and kafka-python's full decode with CRC checks (MB/s, records/s).
Every record's offset, timestamp, key, value and headers is materialized on both sides.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import click
from confluent_kafka import Producer
from confluent_kafka.admin import NewTopic

from deploy.bench_stack import bench_stack, stack_dir_option
from tiering_core.formats import iter_batches, list_segments, mapped, scan_headers
from tiering_core.formats.native import DECODER
from tiering_core.formats.records import python_decoder
from tiering_core.kafka_logs import admin_client
from tiering_core.produce import produce_waiting


def _produce_segments(bootstrap: str, log_dir: Path, megabytes: int, compression: str) -> list[Path]:
    """Produce ``megabytes`` of realistic records; return the topic's rolled ``.log`` files."""
    topic = f"bench-decode-{os.getpid()}-{int(time.time())}"
    admin = admin_client({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1, config={"segment.bytes": str(16 * 1024 * 1024)})])[topic].result(60)
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "compression.type": compression,
            "linger.ms": 20,
            "batch.size": 262144,
        }
    )
    payload = os.urandom(4096).hex().encode()
    target = megabytes * 1024 * 1024
    produced = 0
    i = 0
    while produced < target:
        size = 100 + (i * 37) % 900
        value = payload[(i * 13) % 4000 : (i * 13) % 4000 + size]
        headers = [("trace-id", f"{i:016x}".encode()), ("source", b"bench")] if i % 4 == 0 else None
        produce_waiting(producer, topic, key=f"user-{i % 5000}".encode(), value=value, headers=headers)
        produced += size + 30
        i += 1
    if producer.flush(120) != 0:
        raise click.ClickException("producing the benchmark data did not finish")
    segments = list_segments(log_dir / f"{topic}-0")
    return [s.log for s in segments[:-1]] or [segments[-1].log]


def _best_of(runs: int, fn: Callable[[], int]) -> tuple[float, int]:
    best = float("inf")
    count = 0
    for _ in range(runs):
        start = time.perf_counter()
        count = fn()
        best = min(best, time.perf_counter() - start)
    return best, count


def _ours_scan(files: list[Path]) -> int:
    n = 0
    for f in files:
        with mapped(f) as buf:
            for _ in scan_headers(str(f), buf):
                n += 1
    return n


def _ours_decode(files: list[Path]) -> int:
    n = 0
    for f in files:
        with mapped(f) as buf:
            for batch in iter_batches(str(f), buf):
                for r in batch.records:
                    _ = (r.offset, r.timestamp, r.key, r.value, r.headers)
                    n += 1
    return n


def _kafka_python_decode(files: list[Path]) -> int:
    from kafka.record.memory_records import MemoryRecords

    n = 0
    for f in files:
        records = MemoryRecords(f.read_bytes())
        while True:
            batch = records.next_batch()
            if batch is None:
                break
            if not batch.validate_crc():
                raise click.ClickException(f"kafka-python: CRC mismatch in {f}")
            for r in batch:
                _ = (r.offset, r.timestamp, r.key, r.value, r.headers)
                n += 1
    return n


@click.command()
@click.option(
    "--dir",
    "segments_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Decode the rolled segments of this partition directory instead of producing new ones.",
)
@click.option(
    "--mb",
    "megabytes",
    type=click.IntRange(1, 4096),
    default=128,
    show_default=True,
    help="Megabytes to produce into the real broker when --dir is not given.",
)
@click.option(
    "--compression",
    type=click.Choice(["none", "gzip", "snappy", "lz4", "zstd"]),
    default="none",
    show_default=True,
    help="Producer compression of the generated data.",
)
@click.option("--runs", type=click.IntRange(1, 20), default=3, show_default=True, help="Best of N runs per side.")
@stack_dir_option
def decode(segments_dir: Path | None, megabytes: int, compression: str, runs: int, stack_dir: Path | None) -> None:
    """Segment decoding speed: header scan and full decode, ours beside kafka-python's.

    The last line is a JSON object with `ratio` (full decode MB/s, ours / kafka-python),
    `scan_mb_s`, `decode_mb_s` and `decode_records_s` of the decoder in use (`decoder`: native or
    python), and `python_decode_mb_s`, `python_decode_records_s` of the pure-Python one beside it.
    Targets: ratio >= 1, scan >= 1000 MB/s.
    """
    if segments_dir is not None:
        segments = list_segments(segments_dir)
        files = [s.log for s in segments[:-1]] or [s.log for s in segments]
        _report(files, runs, source=str(segments_dir))
        return
    with bench_stack(stack_dir) as endpoints:
        files = _produce_segments(endpoints.bootstrap, Path(endpoints.brokers[0].log_dir), megabytes, compression)
        _report(files, runs, source=f"broker {endpoints.bootstrap}, compression {compression}")


def _report(files: list[Path], runs: int, source: str) -> None:
    if not files:
        raise click.ClickException("no segment files to decode")
    total = sum(f.stat().st_size for f in files)
    mb = total / 1e6
    _ours_decode(files)  # warm the page cache for both sides
    scan_s, batches = _best_of(runs, lambda: _ours_scan(files))
    ours_s, records = _best_of(runs, lambda: _ours_decode(files))
    python_s = ours_s
    if DECODER == "native":
        with python_decoder():
            python_s, _ = _best_of(runs, lambda: _ours_decode(files))
    theirs_s, theirs_records = _best_of(runs, lambda: _kafka_python_decode(files))
    if theirs_records != records:
        raise click.ClickException(f"record counts differ: ours {records}, kafka-python {theirs_records}")
    lines = [
        {
            "measure": "input",
            "source": source,
            "files": len(files),
            "bytes": total,
            "batches": batches,
            "records": records,
        },
        {"measure": "header_scan", "seconds": scan_s, "mb_s": mb / scan_s},
        {
            "measure": "decode_ours",
            "decoder": DECODER,
            "seconds": ours_s,
            "mb_s": mb / ours_s,
            "records_s": records / ours_s,
        },
        {"measure": "decode_python", "seconds": python_s, "mb_s": mb / python_s, "records_s": records / python_s},
        {
            "measure": "decode_kafka_python",
            "seconds": theirs_s,
            "mb_s": mb / theirs_s,
            "records_s": records / theirs_s,
        },
    ]
    for line in lines:
        click.echo(json.dumps(line))
    summary = {
        "ratio": round(theirs_s / ours_s, 3),
        "scan_mb_s": round(mb / scan_s, 1),
        "decode_mb_s": round(mb / ours_s, 1),
        "decode_records_s": round(records / ours_s),
        "decoder": DECODER,
        "python_decode_mb_s": round(mb / python_s, 1),
        "python_decode_records_s": round(records / python_s),
        "kafka_python_decode_mb_s": round(mb / theirs_s, 1),
        "kafka_python_decode_records_s": round(records / theirs_s),
        "bytes": total,
        "records": records,
    }
    click.echo(json.dumps(summary))
