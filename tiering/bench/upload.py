"""``tiering bench upload``: the sidecar's segment copier beside a plain boto3 ``upload_file``.

Both sides upload the same real segment files (produced into the broker of the local stack) to the
same S3 endpoint, each in its own child process so that peak RSS is measured for that side alone.
PUT requests (PutObject and UploadPart) are counted with a botocore event hook on both sides, and each
side's CPU time (all its threads, the upload alone) is reported per GB uploaded.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import click
import psutil
from confluent_kafka import Producer
from confluent_kafka.admin import NewTopic

from deploy.bench_stack import bench_stack, stack_dir_option
from tiering_core.formats import list_segments
from tiering_core.kafka_logs import admin_client
from tiering_core.produce import produce_waiting

_CHILD = "from tiering.bench.upload import child_main; child_main()"


def child_main() -> None:
    """Upload the files named in argv[2] with side argv[1] ('ours' or 'boto3'); print one JSON line."""
    import boto3

    from tiering.copier import LocalSegment, SegmentCopier
    from tiering_core.objects import SegmentRef
    from tiering_core.stores.config import S3StoreConfig
    from tiering_core.stores.prefixed import PrefixedStore
    from tiering_core.stores.s3 import S3Store

    side, spec = sys.argv[1], json.loads(sys.argv[2])
    config = S3StoreConfig(**spec["s3"])
    puts = 0

    def count(event_name: str, **_: object) -> None:
        nonlocal puts
        puts += 1

    files = [Path(f) for f in spec["files"]]
    start, cpu = time.perf_counter(), time.process_time()
    if side == "ours":
        store = S3Store(config)
        store.client.meta.events.register("before-send.s3.PutObject", count)
        store.client.meta.events.register("before-send.s3.UploadPart", count)
        copier = SegmentCopier(PrefixedStore(store, f"{config.prefix}/ours"))
        segments = list_segments(files[0].parent)
        following = {s.base_offset: n.base_offset for s, n in itertools.pairwise(segments)}
        for f in files:
            base = int(f.name.split(".")[0])
            seg = next(s for s in segments if s.base_offset == base)
            ref = SegmentRef("bench", "AAAAAAAAAAAAAAAAAAAAAA", 0, base, uuid.uuid4())
            copier.copy(ref, LocalSegment(seg, following[base]))
    else:
        client = boto3.client(
            "s3", endpoint_url=config.endpoint_url, region_name=config.region,
            aws_access_key_id=config.access_key_id,
            aws_secret_access_key=config.secret_key(),
        )  # fmt: skip
        client.meta.events.register("before-send.s3.PutObject", count)
        client.meta.events.register("before-send.s3.UploadPart", count)
        for f in files:
            client.upload_file(str(f), config.bucket, f"{config.prefix}/boto3/{f.name}")
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu
    print(json.dumps({"side": side, "seconds": seconds, "cpu_seconds": cpu_seconds, "puts": puts}))


def run_sampled(args: list[str]) -> tuple[str, str, int, float]:
    """Run a child, sampling its RSS every 20 ms (ru_maxrss would include the parent's, inherited at fork)."""
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = 0
    watched = psutil.Process(proc.pid)
    while proc.poll() is None:
        try:
            peak = max(peak, watched.memory_info().rss)
        except psutil.Error:
            break
        time.sleep(0.02)
    out, err = proc.communicate()
    return out, err, proc.returncode, peak / (1 << 20)


def _produce(bootstrap: str, log_dir: Path, megabytes: int) -> list[Path]:
    topic = f"bench-upload-{os.getpid()}-{int(time.time())}"
    admin = admin_client({"bootstrap.servers": bootstrap})
    # 128 MiB segments, smaller for a small run so that it still rolls a few
    config = {"segment.bytes": str(min(128, megabytes // 4) * 1024 * 1024)}
    admin.create_topics([NewTopic(topic, 1, 1, config=config)])[topic].result(60)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1 << 20})
    value = os.urandom(8192)
    for i in range((megabytes * 1024 * 1024) // 8192 + 1):
        produce_waiting(producer, topic, key=str(i).encode(), value=value)
    if producer.flush(300) != 0:
        raise click.ClickException("producing the benchmark data did not finish")
    return [s.log for s in list_segments(log_dir / f"{topic}-0")[:-1]]


@click.command()
@click.option(
    "--size-mb",
    type=click.IntRange(64, 16384),
    default=1024,
    show_default=True,
    help="Megabytes of segments to produce and upload on each side.",
)
@click.option(
    "--rounds",
    type=click.IntRange(1, 10),
    default=2,
    show_default=True,
    help="Uploads of the files per side, in the order boto3, ours, ours, boto3, ... (a load that changes "
    "while the benchmark runs weighs on both sides alike); seconds, CPU and PUTs are summed over rounds.",
)
@stack_dir_option
def upload(size_mb: int, rounds: int, stack_dir: Path | None) -> None:
    """Upload throughput, peak RSS and PUTs per GB: our copier beside boto3's upload_file.

    The last line is a JSON object with `ratio` (our MB/s / boto3 MB/s), `peak_rss_mb` and
    `boto3_peak_rss_mb`, `cpu_s_per_gb` and `boto3_cpu_s_per_gb` (CPU seconds of the uploading process
    per GB), `puts_per_gb` and `boto3_puts_per_gb`. Targets: ratio >= 1.0 with a peak RSS at most
    boto3's + 10 MB, while uploading >= 1 GB.
    """
    with bench_stack(stack_dir) as endpoints:
        files = _produce(endpoints.bootstrap, Path(endpoints.brokers[0].log_dir), size_mb)
        total = sum(f.stat().st_size for f in files)
        spec = {
            "files": [str(f) for f in files],
            "s3": {"bucket": endpoints.s3.bucket, "prefix": f"bench-{uuid.uuid4().hex[:8]}",
                   "endpoint_url": endpoints.s3.endpoint_url, "region": endpoints.s3.region, "path_style": True,
                   "access_key_id": endpoints.s3.access_key, "secret_access_key": endpoints.s3.secret_key},
        }  # fmt: skip
        results = {
            side: {"seconds": 0.0, "cpu_seconds": 0.0, "puts": 0, "peak_rss_mb": 0.0} for side in ("boto3", "ours")
        }
        for round_ in range(rounds):
            for side in ("boto3", "ours") if round_ % 2 == 0 else ("ours", "boto3"):
                out, err, code, peak_mb = run_sampled([sys.executable, "-c", _CHILD, side, json.dumps(spec)])
                if code != 0:
                    raise click.ClickException(f"{side} upload failed:\n{err[-2000:]}")
                result = {**json.loads(out.strip().splitlines()[-1]), "peak_rss_mb": peak_mb}
                click.echo(json.dumps({**result, "mb_s": total / 1e6 / result["seconds"]}))
                summed = results[side]
                for name in ("seconds", "cpu_seconds", "puts"):
                    summed[name] += result[name]
                summed["peak_rss_mb"] = max(summed["peak_rss_mb"], peak_mb)
        gb = total * rounds / 1e9
        ours, theirs = results["ours"], results["boto3"]
        click.echo(json.dumps({
            "ratio": round(theirs["seconds"] / ours["seconds"], 3),
            "peak_rss_mb": round(ours["peak_rss_mb"], 1),
            "puts_per_gb": round(ours["puts"] / gb, 1),
            "ours_mb_s": round(total * rounds / 1e6 / ours["seconds"], 1),
            "boto3_mb_s": round(total * rounds / 1e6 / theirs["seconds"], 1),
            "boto3_peak_rss_mb": round(theirs["peak_rss_mb"], 1),
            "cpu_s_per_gb": round(ours["cpu_seconds"] / gb, 2),
            "boto3_cpu_s_per_gb": round(theirs["cpu_seconds"] / gb, 2),
            "boto3_puts_per_gb": round(theirs["puts"] / gb, 1),
            "bytes": total,
            "files": len(files),
            "rounds": rounds,
        }))  # fmt: skip
