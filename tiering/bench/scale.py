"""``tiering bench scale``: one sidecar over N tiered partitions of small rolled segments.

The sidecar runs as its own process (``tiering sidecar run``) against the real stack; the bench reads its
Prometheus metrics: ``tiering_sidecar_ticks_total`` and ``tiering_sidecar_tick_seconds`` (each tick's duration),
``tiering_kafka_requests_total`` (the sidecar's admin requests to Kafka, counted in ``KafkaCluster``) and
``tiering_remote_store_requests_total`` (its S3 requests, counted in ``ObservedStore``: one per store call; a
multipart upload counts once), and ``tiering_metadata_wal_lag_seconds`` (``wal_lag_s``: the largest age of a
WAL record when the sidecar applied it, during the busy tick and the one after). Only full ticks are
measured (``kind="full"``); the ticks the watcher's events start step only the partitions where a segment
rolled. CPU time and peak RSS (VmHWM) come
from /proc for the sidecar's process alone.

Phases: (1) every partition gets one record and ``--segments`` rolled segments (``segment.ms`` rolls them:
Kafka 4 refuses a ``segment.bytes`` below 1 MiB), tiering is enabled with local retention 0 and the sidecar
started; its first tick copies those (``first_tick_s``: it also takes every partition's etcd lease). (2) Busy:
uploads paused cluster-wide, a segment rolled in every partition, uploads resumed: the next full tick copies N
segments (``busy_tick_s``; local retention then releases them). (3) Idle: ``--idle-ticks`` full ticks with
nothing to do (every partition has remote data), timed, with the requests they made and the CPU used. (4)
``tiering topic status`` of the N-partition topic, timed as a user runs it (a new process, which also recovers
the metadata).
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import yaml
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from prometheus_client.parser import text_string_to_metric_families

from deploy.bench_stack import bench_stack, stack_dir_option
from deploy.procs import free_port
from deploy.sidecar_config import write_sidecar_config
from metadata.wal import MetadataWal, WalError
from tiering.cli.main import main as tiering_main
from tiering.config import load_settings
from tiering_core.kafka_logs import admin_client
from tiering_core.produce import produce_waiting
from tiering_core.stores.factory import open_store

SEGMENT_MS = 2000  # segments roll on the first append this long after they began
_TICKS = "tiering_sidecar_ticks_total{kind=full}"  # full ticks: the rolled ones step only a few partitions
_TICK_S = "tiering_sidecar_tick_seconds{kind=full}"
_POLLED = ("tiering_sidecar_ticks_total", "tiering_metadata_wal_lag_seconds")  # what waiting for a tick reads
# what the idle phase reads after each tick: none of the per-partition series, whose rendering (0.1-0.4 s at 2,000
# partitions) a Prometheus pays once per scrape interval, not once per tick
_IDLE = (*_POLLED, "tiering_sidecar_tick_seconds", "tiering_kafka_requests_total",
         "tiering_remote_store_requests_total", "tiering_sidecar_partition_steps_total")  # fmt: skip


class SidecarProcess:
    """``tiering sidecar run`` in a child process, observed through its /metrics and /proc."""

    def __init__(self, config: Path, port: int, log_path: Path) -> None:
        self.port = port
        self._log = log_path.open("w")
        args = [sys.executable, "-m", "tiering", "sidecar", "run", "--config", str(config), "--log-level", "WARNING"]
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT)
        self.log_path = log_path
        self.wal_lag_max = 0.0  # the largest tiering_metadata_wal_lag_seconds scraped (each tick sets it anew)

    def metrics(self, names: tuple[str, ...] = ()) -> dict[str, float]:
        """Every sample (only those ``names`` when given), keyed ``name{label=value,...}`` (labels sorted)."""
        query = "?" + "&".join(f"name[]={n}" for n in names) if names else ""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics{query}", timeout=30) as r:
            text = r.read().decode()
        out: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
                out[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
        return out

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime

    def peak_rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        raise click.ClickException("no VmHWM in /proc/<sidecar>/status")

    def wait_for(self, what: str, holds: Callable[[dict[str, float]], bool], timeout: float,
                 then: tuple[str, ...] = ()) -> dict[str, float]:  # fmt: skip
        """Poll the tick counter and the WAL lag every second until ``holds`` them; then the metrics named in
        ``then`` (every metric when none is). The ticks time themselves: polling faster only loads the sidecar.

        Only those two are polled: the whole text (every partition's series, about 11 lines per partition) took the
        sidecar 0.1-0.4 s to render, and polling it five times a second was most of what the bench measured as
        an idle sidecar's CPU. A Prometheus scraping every 15 s or more costs a few per cent of that."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise click.ClickException(f"the sidecar exited ({self.proc.returncode}) waiting for {what}:\n"
                                           f"{self.log_path.read_text()[-3000:]}")  # fmt: skip
            try:
                m = self.metrics(_POLLED)
            except OSError:
                m = None  # not listening yet
            if m is not None:
                self.wal_lag_max = max(self.wal_lag_max, m.get("tiering_metadata_wal_lag_seconds", 0.0))
                if holds(m):
                    return self.metrics(then)
            time.sleep(1.0)
        raise click.ClickException(f"timed out after {timeout:.0f}s waiting for {what}")

    def next_tick(self, after: float, timeout: float, then: tuple[str, ...] = ()) -> dict[str, float]:
        """The metrics (those named in ``then``, else all) as soon as a tick after the ``after``-th finished."""
        return self.wait_for(f"tick {after + 1:.0f}", lambda m: m.get(_TICKS, 0) > after, timeout, then)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def _sum(m: dict[str, float], name: str) -> float:
    return sum(v for k, v in m.items() if k == name or k.startswith(name + "{"))


def _requests(m: dict[str, float]) -> tuple[float, float]:
    return _sum(m, "tiering_kafka_requests_total"), _sum(m, "tiering_remote_store_requests_total")


def _roll_every_partition(producer: Producer, topic: str, partitions: int, value: bytes) -> None:
    """One record to every partition after SEGMENT_MS: each partition's active segment (if any) rolls."""
    time.sleep(SEGMENT_MS / 1000 + 0.5)
    for p in range(partitions):
        produce_waiting(producer, topic, key=str(p).encode(), value=value, partition=p)
    if producer.flush(300) != 0:
        raise click.ClickException("producing the benchmark records did not finish")


def _wal_ready(bootstrap: str, topic: str) -> None:
    """Create the run's metadata WAL and wait until its leaders answer ListOffsets: the first command on a
    WAL created a moment ago can be told NOT_LEADER_FOR_PARTITION by a broker still taking leadership."""
    wal = MetadataWal(bootstrap, topic, 50)
    try:
        wal.ensure_topic()
        deadline = time.monotonic() + 120
        while True:
            try:
                wal.end_offsets()
                return
            except WalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1)
    finally:
        wal.close()


def _cli(config: Path, *args: str) -> None:
    tiering_main([*args, "--config", str(config)], standalone_mode=False)


def _timed_status(config: Path, topic: str, partitions: int) -> tuple[float, float]:
    """Wall seconds and CPU seconds of ``tiering topic status --json`` in a new process (as a user runs it)."""
    cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    args = [sys.executable, "-m", "tiering", "topic", "status", topic, "--json", "--config", str(config)]
    done = subprocess.run(args, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = after.ru_utime + after.ru_stime - cpu.ru_utime - cpu.ru_stime
    if done.returncode != 0:
        raise click.ClickException(f"tiering topic status failed:\n{done.stderr[-3000:]}")
    rows = json.loads(done.stdout)["partitions"]
    if len(rows) != partitions:
        raise click.ClickException(f"tiering topic status showed {len(rows)} partitions, the topic has {partitions}")
    return seconds, cpu_s


@click.command("scale")
@click.option("--partitions", type=click.IntRange(1, 20000), default=2000, show_default=True,
              help="Tiered partitions of one topic, all led by the one broker.")  # fmt: skip
@click.option("--segments", type=click.IntRange(0, 20), default=0, show_default=True,
              help="Rolled segments per partition before the sidecar starts (its first tick copies them).")  # fmt: skip
@click.option("--idle-ticks", type=click.IntRange(1, 100), default=3, show_default=True,
              help="Idle ticks measured.")  # fmt: skip
@click.option("--rescan-seconds", type=click.FloatRange(1, 300), default=10.0, show_default=True,
              help="rescan_interval_seconds: an idle sidecar ticks this often (default 30).")  # fmt: skip
@click.option("--concurrency", type=click.IntRange(1, 64), default=8, show_default=True,
              help="upload_max_concurrency: small copies are latency-bound (default config: 2).")  # fmt: skip
@stack_dir_option
def scale(partitions: int, segments: int, idle_ticks: int, rescan_seconds: float, concurrency: int,
          stack_dir: Path | None) -> None:  # fmt: skip
    """One sidecar over N tiered partitions: idle and busy tick time, requests, CPU, RSS, WAL lag, status time.

    Prints one JSON object per phase, then a last line with `partitions`, `idle_tick_s`, `busy_tick_s`,
    `idle_cpu_pct` (of one core, at --rescan-seconds), `peak_rss_mb`, `idle_requests_per_partition` (Kafka and S3
    requests per partition per idle tick, and both together), `wal_lag_s` and `status_s`. Targets at 2,000
    partitions: idle CPU < 5 %, idle tick < 2 s, RSS < 300 MB, no per-partition request when idle, status < 5 s.
    """
    with bench_stack(stack_dir) as endpoints:
        broker = endpoints.brokers[0].id
        base = yaml.safe_load(write_sidecar_config(endpoints, broker).read_text())
        stamp = f"{os.getpid()}-{int(time.time())}"
        port = free_port()
        # its own metadata topic and prefix: the stack's other tiered topics (earlier runs') are not its business
        base["remote_storage"]["prefix"] = f"bench-scale-{stamp}"
        base.update(metadata_topic=f"__tiering_metadata_scale_{stamp}", metadata_partitions=50,
                    state_dir=str(Path(endpoints.stack_dir) / f"scale-{stamp}-state"), metrics_port=port,
                    metrics_host="127.0.0.1", rescan_interval_seconds=rescan_seconds,
                    upload_max_concurrency=concurrency)  # fmt: skip
        config = Path(endpoints.stack_dir) / f"sidecar-scale-{stamp}.yaml"
        config.write_text(yaml.safe_dump(base, sort_keys=False))
        topic = f"bench-scale-{stamp}"
        admin = admin_client({"bootstrap.servers": endpoints.bootstrap})
        admin.create_topics([NewTopic(topic, partitions, 1, config={"segment.ms": str(SEGMENT_MS)})])[topic].result(120)
        producer = Producer({"bootstrap.servers": endpoints.bootstrap, "linger.ms": 20})
        value = os.urandom(512).hex().encode()  # 1 KiB
        setup_start = time.perf_counter()
        for _ in range(segments + 1):
            _roll_every_partition(producer, topic, partitions, value)
        _wal_ready(endpoints.bootstrap, base["metadata_topic"])
        _cli(config, "topic", "enable", topic, "--local-retention-bytes", "0")
        click.echo(json.dumps({"phase": "setup", "partitions": partitions, "rolled_segments": partitions * segments,
                               "seconds": round(time.perf_counter() - setup_start, 1)}))  # fmt: skip
        try:
            summary = _run_sidecar(config, port, Path(endpoints.stack_dir) / f"sidecar-scale-{stamp}.log", topic,
                                   partitions, (segments, idle_ticks, rescan_seconds), producer, value)  # fmt: skip
            summary["upload_max_concurrency"] = concurrency
            status_s, status_cpu_s = _timed_status(config, topic, partitions)
            summary.update(status_s=round(status_s, 2), status_cpu_s=round(status_cpu_s, 2))
        finally:
            _clean_up(config, admin, [topic, base["metadata_topic"]])
        click.echo(json.dumps(summary))


def _run_sidecar(config: Path, port: int, log_path: Path, topic: str, partitions: int, shape: tuple[int, int, float],
                 producer: Producer, value: bytes) -> dict[str, Any]:  # fmt: skip
    sidecar = SidecarProcess(config, port, log_path)
    try:
        return _measure(sidecar, config, topic, partitions, shape, producer, value)
    finally:
        sidecar.stop()


def _clean_up(config: Path, admin: AdminClient, topics: list[str]) -> None:
    """Delete the run's topics and remote objects: a --stack-dir stack is used again."""
    settings = load_settings(config)
    store = open_store(settings.remote_storage)
    store.delete(store.list_keys(""))
    for future in admin.delete_topics(topics).values():
        future.result(120)


def _measure(sidecar: SidecarProcess, config: Path, topic: str, partitions: int, shape: tuple[int, int, float],
             producer: Producer, value: bytes) -> dict[str, Any]:  # fmt: skip
    """The phases after setup; ``shape``: (rolled segments per partition, idle ticks, rescan interval)."""
    segments, idle_ticks, rescan = shape
    copied_name = "tiering_remote_copy_segments_total"
    budget = 600 + partitions * (segments + 1) * 3.0  # copies are slow on a loaded 2-core machine
    tick_wait = rescan * 2 + 60 + partitions * 0.5  # for a full tick with nothing to copy
    m = sidecar.wait_for("the first tick", lambda m: m.get(_TICKS, 0) >= 1, budget)
    first = {"phase": "first_tick", "seconds": round(m[_TICK_S], 3),
             "segments_copied": _sum(m, copied_name)}  # fmt: skip
    click.echo(json.dumps(first))
    if first["segments_copied"] < partitions * segments:  # more when a partition's records came in two rolls
        raise click.ClickException(f"the first tick copied {first['segments_copied']} segments, "
                                   f"expected at least {partitions * segments}")  # fmt: skip
    # busy: pause uploads, roll a segment in every partition, resume: the next tick copies them all
    _cli(config, "cluster", "pause-upload")
    m = sidecar.next_tick(m[_TICKS], tick_wait)
    _roll_every_partition(producer, topic, partitions, value)
    m = sidecar.next_tick(m[_TICKS], tick_wait)  # after the rolls (their own ticks ran)
    copied_before = _sum(m, copied_name)
    _cli(config, "cluster", "resume-upload")
    before = m
    sidecar.wal_lag_max = 0.0
    for _ in range(3):  # a tick that began before the sidecar applied the resume record copies nothing
        m = sidecar.next_tick(m[_TICKS], budget)
        busy_s, copied = m[_TICK_S], _sum(m, copied_name) - copied_before
        if copied:
            break
    if copied < partitions:
        raise click.ClickException(f"the full tick after resuming uploads copied {copied:.0f} segments; expected "
                                   f"{partitions} or more")  # fmt: skip
    (k0, s0), (k1, s1) = _requests(before), _requests(m)
    busy = {"phase": "busy", "tick_s": round(busy_s, 3), "segments_copied": copied,
            "kafka_requests": k1 - k0, "s3_requests": s1 - s0,
            "kafka_by_api": _delta_by_label(before, m, "tiering_kafka_requests_total"),
            "s3_by_operation": _delta_by_label(before, m, "tiering_remote_store_requests_total")}  # fmt: skip
    click.echo(json.dumps(busy))
    m = sidecar.next_tick(m[_TICKS], tick_wait)  # its start publishes the busy tick's WAL lag; then idle
    wal_lag_s = sidecar.wal_lag_max
    # idle (remote copies, local retention done): from the end of one full tick to the end of the last
    begin, cpu0, t0 = m, sidecar.cpu_seconds(), time.monotonic()
    durations = []
    for _ in range(idle_ticks):
        m = sidecar.next_tick(m[_TICKS], tick_wait, _IDLE)
        durations.append(m[_TICK_S])
    cpu, wall = sidecar.cpu_seconds() - cpu0, time.monotonic() - t0
    ticks = m[_TICKS] - begin[_TICKS]
    (k0, s0), (k1, s1) = _requests(begin), _requests(m)
    kafka, s3 = (k1 - k0) / ticks, (s1 - s0) / ticks
    idle = {"phase": "idle", "ticks": ticks, "tick_s": [round(d, 3) for d in durations],
            "cpu_s_per_tick": round(cpu / ticks, 3), "cpu_pct": round(100 * cpu / wall, 2),
            "kafka_requests_per_tick": round(kafka, 2), "s3_requests_per_tick": round(s3, 2),
            "kafka_by_api": _delta_by_label(begin, m, "tiering_kafka_requests_total"),
            "s3_by_operation": _delta_by_label(begin, m, "tiering_remote_store_requests_total"),
            "partition_steps": _delta_by_label(begin, m, "tiering_sidecar_partition_steps_total")}  # fmt: skip
    click.echo(json.dumps(idle))
    return {
        "partitions": partitions,
        "idle_tick_s": round(max(durations), 3),
        "busy_tick_s": round(busy_s, 3),
        "idle_cpu_pct": idle["cpu_pct"],
        "peak_rss_mb": round(sidecar.peak_rss_mb(), 1),
        "idle_requests_per_partition": {
            "kafka": round(kafka / partitions, 4),
            "s3": round(s3 / partitions, 4),
            "total": round((kafka + s3) / partitions, 4),
        },
        "wal_lag_s": round(wal_lag_s, 3),
        "idle_requests_per_tick": {"kafka": round(kafka, 2), "s3": round(s3, 2)},
        "first_tick_s": first["seconds"],
        "rescan_interval_s": rescan,
        "segments_per_partition": segments,
    }


def _delta_by_label(before: dict[str, float], after: dict[str, float], name: str) -> dict[str, float]:
    """The counter's increase between two scrapes, per label value (its one label)."""
    out = {}
    for key, value in after.items():
        if key.startswith(name + "{"):
            label = key[len(name) + 1 : -1].split("=", 1)[1]
            grown = value - before.get(key, 0)
            if grown:
                out[label] = grown
    return out
