"""``tiering bench http``: a catch-up read through the HTTP fetch service beside a plain confluent-kafka
consumer reading the same records from the broker's local disk.

The same records go to a tiered topic (the sidecar uploads it and the broker deletes it locally) and a
control topic without tiering. ``tiering reader serve`` runs as its own process (peak RSS sampled);
this process reads the tiered topic from offset 0 to the remote end as raw batches (decoding every
record with ``tiering_core.formats``, as a Python client would) and as JSON; the broker side is
``tiering bench catchup``'s child, reading the control topic to the same offset.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import click
import httpx
from confluent_kafka.admin import NewTopic

from deploy.bench_stack import bench_stack, stack_dir_option
from deploy.sidecar_config import write_sidecar_config
from tiering.bench.catchup import _CHILD, _produce, _tier, segment_bytes
from tiering.bench.sampling import ProcessSampler
from tiering.bench.upload import run_sampled
from tiering_core.formats import iter_batches
from tiering_core.kafka_logs import admin_client

_TOKEN = "bench-token"


@contextmanager
def _service(config: Path, log: Path) -> Iterator[tuple[httpx.Client, ProcessSampler]]:
    """``tiering reader serve`` on a free port, ready; a client with the token; the RSS sampler."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "TIERING_HTTP__TOKENS": json.dumps([_TOKEN])}
    args = ["reader", "serve", "--config", str(config), "--port", str(port), "--log-level", "WARNING"]
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "tiering", *args], stdout=out, stderr=out, env=env)
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {_TOKEN}"},
                          timeout=300)  # fmt: skip
    sampler: ProcessSampler | None = None
    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise click.ClickException(f"the fetch service did not start:\n{log.read_text()[-3000:]}")
            try:
                if client.get("/readyz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.3)
        sampler = ProcessSampler(proc.pid)
        yield client, sampler
    finally:
        if sampler is not None:
            sampler.stop()
        client.close()
        proc.terminate()
        proc.wait(60)


def _read(client: httpx.Client, topic: str, endpoint: str, params: dict, take) -> dict:
    """Pages from offset 0 until the 416 at the remote end; ``take(response)`` -> (records, value bytes, next)."""
    start = time.perf_counter()
    offset = records = size = transferred = 0
    first, waited = None, 0.0
    while True:
        asked = time.perf_counter()
        r = client.get(f"/v1/topics/{topic}/partitions/0/{endpoint}", params={"offset": offset, **params})
        waited += time.perf_counter() - asked
        if r.status_code == 416:
            break
        if r.status_code != 200:
            raise click.ClickException(f"{endpoint} at offset {offset}: {r.status_code} {r.text[:500]}")
        n, b, offset = take(r)
        records, size, transferred = records + n, size + b, transferred + len(r.content)
        if first is None and records:
            first = (time.perf_counter() - start) * 1000
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "records": records, "bytes": size, "transferred": transferred,
            "request_seconds": waited, "first_record_ms": first, "end": offset}  # fmt: skip


def _raw_page(r: httpx.Response) -> tuple[int, int, int]:
    next_offset = int(r.headers["Kafka-Next-Offset"])
    records = size = 0
    for batch in iter_batches("http", r.content):
        records += len(batch.records)
        size += sum(len(rec.value) for rec in batch.records if rec.value is not None)
    return records, size, next_offset


def _json_page(r: httpx.Response) -> tuple[int, int, int]:
    page = r.json()
    size = sum(len(base64.b64decode(rec["value"])) for rec in page["records"] if rec["value"] is not None)
    return len(page["records"]), size, page["next_offset"]


@click.command("http")
@click.option("--size-mb", type=click.IntRange(16, 16384), default=256, show_default=True,
              help="Megabytes of records to tier and read back.")  # fmt: skip
@click.option("--record-size", type=click.IntRange(16, 1 << 20), default=1024, show_default=True,
              help="Bytes per record value.")  # fmt: skip
@click.option("--codec", type=click.Choice(["none", "gzip", "snappy", "lz4", "zstd"]), default="lz4",
              show_default=True, help="Compression of both topics.")  # fmt: skip
@click.option("--max-bytes", type=click.IntRange(1024, 16 << 20), default=4 << 20, show_default=True,
              help="max_bytes of each raw request.")  # fmt: skip
@stack_dir_option
def http_bench(size_mb: int, record_size: int, codec: str, max_bytes: int, stack_dir: Path | None) -> None:
    """Catch-up read through `tiering reader serve` (raw batches decoded by the client, and JSON) beside a
    plain consumer reading the same records from the broker's local disk.

    Prints one JSON object per side, then a last line with `ratio` (HTTP raw, decoded, / broker MB/s of
    values), `json_ratio`, `transfer_mb_s` (raw bytes over HTTP per second spent waiting for responses,
    i.e. the service without the client's decoding) and the service's `peak_rss_mb`.
    """
    with bench_stack(stack_dir) as endpoints:
        config = write_sidecar_config(endpoints, endpoints.brokers[0].id)
        stamp = f"{os.getpid()}-{int(time.time())}"
        tiered, control = f"bench-http-tiered-{stamp}", f"bench-http-control-{stamp}"
        segment = segment_bytes(size_mb)
        admin = admin_client({"bootstrap.servers": endpoints.bootstrap})
        for future in admin.create_topics([NewTopic(t, 1, 1, config={"segment.bytes": str(segment)})
                                           for t in (tiered, control)]).values():  # fmt: skip
            future.result(60)
        count = _produce(endpoints.bootstrap, [tiered, control], size_mb, record_size, codec)
        _tier(config, tiered, count, segment)
        results = {}
        with _service(config, Path(endpoints.stack_dir) / f"bench-http-{stamp}.log") as (client, sampler):
            results["http-raw"] = _read(client, tiered, "batches", {"max_bytes": max_bytes}, _raw_page)
            end = results["http-raw"]["end"]
            results["http-json"] = _read(client, tiered, "records", {"max_records": 10_000, "max_bytes": max_bytes},
                                         _json_page)  # fmt: skip
            service_peak = sampler.peak / (1 << 20)
        spec = {"bootstrap": endpoints.bootstrap, "topic": control, "end": end, "config": str(config)}
        out, err, code, peak = run_sampled([sys.executable, "-c", _CHILD, "broker", json.dumps(spec)])
        if code != 0:
            raise click.ClickException(f"broker read failed:\n{err[-3000:]}")
        results["broker"] = {**json.loads(out.strip().splitlines()[-1]), "peak_rss_mb": round(peak, 1)}
        for side, r in results.items():
            if r["records"] < end or (side != "broker" and r["records"] != end):  # a consumer may read past it
                raise click.ClickException(f"{side} read {r['records']} records up to the remote end {end}")
            r.update(side=side, record_size=record_size, codec=codec, mb_s=round(r["bytes"] / 1e6 / r["seconds"], 1),
                     records_s=round(r["records"] / r["seconds"]))  # fmt: skip
            click.echo(json.dumps(r))
        raw, js, broker = results["http-raw"], results["http-json"], results["broker"]
        click.echo(json.dumps({
            "ratio": round(raw["mb_s"] / broker["mb_s"], 3), "json_ratio": round(js["mb_s"] / broker["mb_s"], 3),
            "http_raw_mb_s": raw["mb_s"], "http_json_mb_s": js["mb_s"], "broker_mb_s": broker["mb_s"],
            "http_raw_records_s": raw["records_s"], "http_json_records_s": js["records_s"],
            "broker_records_s": broker["records_s"],
            "transfer_mb_s": round(raw["transferred"] / 1e6 / raw["request_seconds"], 1),
            "first_record_ms": round(raw["first_record_ms"], 1), "peak_rss_mb": round(service_peak, 1),
            "records": end, "size_mb": size_mb, "record_size": record_size, "codec": codec, "max_bytes": max_bytes,
        }))  # fmt: skip
