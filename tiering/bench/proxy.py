"""``tiering bench proxy``: a plain confluent-kafka consumer through the proxy beside the same consumer
straight on the broker, and through Kroxylicious (the Kafka community's proxy) as the reference proxy.

For each record size the same records (same codec) go to two topics: one tiered by the sidecar (most of
its data then lives in S3 only) and a control topic without tiering. Up to four sides read a topic from
offset 0 to its end, each in a child process with the same loop as ``tiering bench catchup`` (consume up
to 1000, touch every value): (a) ``remote``: the tiered topic through the proxy (its remote part comes
from S3, its tail from the broker); (b) ``broker``: the control topic straight from the broker's disk;
(c) ``passthrough``: the control topic through the proxy; (d) ``kroxylicious``: the control topic through
Kroxylicious with no filters (``deploy/kroxylicious.py``), what a proxy that only forwards frames costs on
the same machine. The sides are interleaved over ``--rounds`` rounds and each is reported by its median,
because a broker read on this kind of machine varies by several times from one minute to the next. Each
proxy runs as its own process so that its CPU time and peak RSS are its own.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import click
import psutil
import yaml
from confluent_kafka.admin import AdminClient, NewTopic
from prometheus_client.parser import text_string_to_metric_families

from deploy.bench_stack import bench_stack, stack_dir_option
from deploy.kroxylicious import start_kroxylicious
from deploy.procs import free_port
from deploy.sidecar_config import write_sidecar_config
from tiering.bench.catchup import _CHILD, _produce, _tier, segment_bytes
from tiering.bench.cpus import parse_cpus, pin, pinned_command
from tiering.bench.sampling import ProcessSampler
from tiering.bench.upload import run_sampled
from tiering_core.kafka_logs import admin_client

SIDES = ("remote", "broker", "passthrough")
_COUNTED = {
    "tiering_proxy_fetch_ahead": "fetch_ahead",
    "tiering_proxy_native_lane_runs": "native_lane",
    "tiering_proxy_remote_lane_runs": "remote_lane",
}


class ProxyProcess:
    """``tiering proxy serve`` in a child process; its CPU seconds and peak RSS sampled."""

    def __init__(self, config: Path, node_ids: list[int]) -> None:
        self.port, self.metrics_port = free_port(), free_port()
        settings = yaml.safe_load(config.read_text())
        settings["proxy"] = {"bootstrap_port": self.port, "broker_port_base": None, "metrics_port": self.metrics_port,
                             "broker_ports": {n: free_port() for n in node_ids}}  # fmt: skip
        self.config = config.with_name(f"proxy-{self.port}.yaml")
        self.config.write_text(yaml.safe_dump(settings))
        self.log = self.config.with_suffix(".log")
        with self.log.open("w") as log:  # a file, not a pipe: nobody reads a pipe while the benchmark runs
            self.proc = subprocess.Popen([sys.executable, "-m", "tiering", "--log-level", "WARNING", "proxy", "serve",
                                          "--config", str(self.config)], stderr=log)  # fmt: skip
        self.sampler = ProcessSampler(self.proc.pid)
        self._wait_listening()

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def peak(self) -> int:
        return self.sampler.peak

    def _wait_listening(self) -> None:
        import socket

        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise click.ClickException(
                    f"the proxy exited: {self.proc.stderr.read()[-3000:] if self.proc.stderr else ''}"
                )
            try:
                with socket.create_connection(("127.0.0.1", self.port), 1):
                    return
            except OSError:
                time.sleep(0.2)
        raise click.ClickException("the proxy did not listen within 120 s")

    def cpu_seconds(self) -> float:
        return self.sampler.cpu_seconds()

    def outcomes(self) -> dict[str, dict[str, float]]:
        """The proxy's counters by outcome so far: ``fetch_ahead``, its Fetch requests asked ahead
        (``tiering_proxy_fetch_ahead_total``), ``native_lane`` and ``remote_lane``, its lanes' runs by how they ended
        (``tiering_proxy_native_lane_runs_total``, ``tiering_proxy_remote_lane_runs_total``)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as answer:
            text = answer.read().decode()
        out: dict[str, dict[str, float]] = {name: {} for name in _COUNTED.values()}
        for family in text_string_to_metric_families(text):
            if family.name in _COUNTED:
                out[_COUNTED[family.name]].update((sample.labels["outcome"], sample.value) for sample in family.samples
                                                  if sample.name.endswith("_total"))  # fmt: skip
        return out

    def close(self) -> None:
        self.sampler.stop()
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def store_process(endpoint_url: str) -> psutil.Process | None:
    """The local S3 server's process (MinIO of the stack), to count its CPU beside the proxy's: on this
    machine it takes its share of the same two cores, which a cloud store would not."""
    port = endpoint_url.rsplit(":", 1)[-1].rstrip("/")
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if any("minio" in part for part in cmdline[:1]) and any(part.endswith(f":{port}") for part in cmdline):
            return proc
    return None


def _cpu(proc: psutil.Process | None) -> float:
    if proc is None:
        return 0.0
    times = proc.cpu_times()
    return times.user + times.system


def _read(bootstrap: str, topic: str, end: int, config: Path, cpus: set[int] | None) -> dict:
    spec = {"bootstrap": bootstrap, "topic": topic, "end": end, "config": str(config)}
    out, err, code, _ = run_sampled([sys.executable, "-c", pinned_command(_CHILD, cpus), "broker", json.dumps(spec)])
    if code != 0:
        raise click.ClickException(f"a read of {topic} through {bootstrap} failed:\n{err[-3000:]}")
    result = json.loads(out.strip().splitlines()[-1])
    if result["records"] != end:
        raise click.ClickException(f"a read of {topic} got {result['records']} records, {end} were produced")
    return result


@dataclass(frozen=True)
class Reference:
    """The reference proxy (Kroxylicious, no filters) in front of the same broker."""

    bootstrap: str
    sampler: ProcessSampler


@click.command("proxy")
@click.option("--size-mb", type=click.IntRange(16, 16384), default=256, show_default=True,
              help="Megabytes of records per record size.")  # fmt: skip
@click.option("--rounds", type=click.IntRange(1, 20), default=3, show_default=True,
              help="Rounds of the interleaved sides; each side is reported by its median.")  # fmt: skip
@click.option("--codec", type=click.Choice(["none", "gzip", "snappy", "lz4", "zstd"]), default="lz4",
              show_default=True, help="Compression of both topics.")  # fmt: skip
@click.option("--reference-proxy/--no-reference-proxy", default=True, show_default=True,
              help="Also read the control topic through Kroxylicious, the Kafka community's proxy, with no "
                   "filters (its jars fetched once from Maven Central; needs a JDK): what a proxy that only "
                   "forwards frames costs the same consumer on this machine.")  # fmt: skip
@click.option("--client-cpus", default=None, metavar="CPUS",
              help="Run every reading consumer on these CPUs (0, 0,2 or 0-1) and every server (broker, S3 server, "
                   "etcd, the proxy, Kroxylicious) on the others: a deployment's shape, where consumers run on other "
                   "machines than the broker and its proxy, on one machine. Default: all share every CPU.")  # fmt: skip
@stack_dir_option
def proxy_bench(size_mb: int, rounds: int, codec: str, reference_proxy: bool, client_cpus: str | None,
                stack_dir: Path | None) -> None:  # fmt: skip
    """A confluent-kafka consumer through the proxy (remote data; local data) beside the same consumer
    straight from the broker's disk, and local data through Kroxylicious.

    Records of ~100 B and ~1 KB. One JSON object per side, size and round, then a last line with
    `ratio` (remote through the proxy / straight from the broker, MB/s medians, the lower of the two
    record sizes), `passthrough_ratio` (local data through the proxy / straight, likewise), records/s and
    MB/s of every side, the proxy's CPU seconds per GB it served from remote (and the local S3 server's,
    which shares the machine here) and per GB it passed through, the time to the first record of the
    tiered topic through the proxy in the first round (a cold partition), the proxy's peak RSS, and per
    side its Fetch requests asked ahead (`fetch_ahead`), native lane runs (`native_lane`) and remote lane runs
    (`remote_lane`) by outcome. With
    the reference proxy: `kroxylicious_passthrough_ratio` (local data through Kroxylicious / straight),
    `passthrough_vs_kroxylicious` (ours / Kroxylicious, local data), Kroxylicious' CPU per GB and peak RSS.
    Targets: ratio >= 0.8 (stretch 1.0), passthrough_ratio >= 0.9, proxy CPU <= 1.5 s/GB from remote and
    <= 1.0 s/GB passed through. With --client-cpus, `client_cpus` and `server_cpus` say how they were split.
    """
    clients = parse_cpus(client_cpus) if client_cpus is not None else None
    with bench_stack(stack_dir) as endpoints, ExitStack() as running:
        config = write_sidecar_config(endpoints, endpoints.brokers[0].id)
        admin = admin_client({"bootstrap.servers": endpoints.bootstrap})
        node_ids = [b.id for b in endpoints.brokers]
        proxy = ProxyProcess(config, node_ids)
        running.callback(proxy.close)
        reference = None
        if reference_proxy:
            kroxylicious = start_kroxylicious(config.parent / f"kroxylicious-{proxy.port}", endpoints.bootstrap,
                                              node_ids)  # fmt: skip
            running.callback(kroxylicious.stop)
            reference = Reference(kroxylicious.bootstrap, ProcessSampler(kroxylicious.pid))
            running.callback(reference.sampler.stop)
        store = store_process(endpoints.s3.endpoint_url)
        servers = None
        if clients is not None:
            servers = os.sched_getaffinity(0) - clients
            pids = [b.pid for b in endpoints.brokers] + [endpoints.s3.pid, endpoints.etcd.pid, proxy.proc.pid]
            if reference is not None:
                pids.append(reference.sampler.process.pid)
            if None in pids:
                raise click.ClickException("--client-cpus pins the stack's processes: it needs the local-process "
                                           "stack, not containers")  # fmt: skip
            for pid in pids:
                pin(pid, servers)
                running.callback(pin, pid, clients | servers)  # a stack of --stack-dir is left as it was found
        summary = {size: _measure(endpoints.bootstrap, admin, config, proxy, reference, store, size, size_mb, codec,
                                  rounds, clients) for size in (100, 1024)}  # fmt: skip
        running.close()
        ratio = {s: r["remote"]["mb_s"] / r["broker"]["mb_s"] for s, r in summary.items()}
        passthrough = {s: r["passthrough"]["mb_s"] / r["broker"]["mb_s"] for s, r in summary.items()}
        sides = SIDES + (("kroxylicious",) if reference else ())
        out = {
            "ratio": round(min(ratio.values()), 3),
            "passthrough_ratio": round(min(passthrough.values()), 3),
            "ratio_by_record_size": {str(k): round(v, 3) for k, v in ratio.items()},
            "passthrough_ratio_by_record_size": {str(k): round(v, 3) for k, v in passthrough.items()},
            **{f"{side}_mb_s": {str(k): r[side]["mb_s"] for k, r in summary.items()} for side in sides},
            **{f"{side}_records_s": {str(k): r[side]["records_s"] for k, r in summary.items()} for side in sides},
            "proxy_cpu_s_per_gb": {str(k): r["proxy_cpu_s_per_gb"] for k, r in summary.items()},
            "passthrough_cpu_s_per_gb": {str(k): r["passthrough_cpu_s_per_gb"] for k, r in summary.items()},
            "first_remote_record_ms": {str(k): r["first_remote_record_ms"] for k, r in summary.items()},
            "store_cpu_s_per_gb": {str(k): r["store_cpu_s_per_gb"] for k, r in summary.items()},
            "proxy_peak_rss_mb": round(proxy.peak / (1 << 20), 1),
            "fetch_ahead": {str(k): r["fetch_ahead"] for k, r in summary.items()},
            "native_lane": {str(k): r["native_lane"] for k, r in summary.items()},
            "remote_lane": {str(k): r["remote_lane"] for k, r in summary.items()},
        }
        if reference is not None:
            theirs = {s: r["kroxylicious"]["mb_s"] / r["broker"]["mb_s"] for s, r in summary.items()}
            ours = {s: r["passthrough"]["mb_s"] / r["kroxylicious"]["mb_s"] for s, r in summary.items()}
            out.update({
                "kroxylicious_passthrough_ratio": round(min(theirs.values()), 3),
                "passthrough_vs_kroxylicious": round(min(ours.values()), 3),
                "kroxylicious_passthrough_ratio_by_record_size": {str(k): round(v, 3) for k, v in theirs.items()},
                "passthrough_vs_kroxylicious_by_record_size": {str(k): round(v, 3) for k, v in ours.items()},
                "kroxylicious_cpu_s_per_gb": {str(k): r["kroxylicious_cpu_s_per_gb"] for k, r in summary.items()},
                "kroxylicious_peak_rss_mb": round(reference.sampler.peak / (1 << 20), 1),
            })  # fmt: skip
        if clients is not None and servers is not None:
            out.update(client_cpus=sorted(clients), server_cpus=sorted(servers))
        click.echo(json.dumps({**out, "size_mb": size_mb, "rounds": rounds, "codec": codec}))


def _measure(bootstrap: str, admin: AdminClient, config: Path, proxy: ProxyProcess, reference: Reference | None,
             store: psutil.Process | None, record_size: int, size_mb: int, codec: str,
             rounds: int, clients: set[int] | None) -> dict:  # fmt: skip
    stamp = f"{os.getpid()}-{int(time.time())}-{record_size}"
    tiered, control = f"bench-proxy-tiered-{stamp}", f"bench-proxy-control-{stamp}"
    segment = segment_bytes(size_mb)
    for future in admin.create_topics([NewTopic(t, 1, 1, config={"segment.bytes": str(segment)})
                                       for t in (tiered, control)]).values():  # fmt: skip
        future.result(60)
    count = _produce(bootstrap, [tiered, control], size_mb, record_size, codec)
    _tier(config, tiered, count, segment)
    via = {"remote": (tiered, proxy.bootstrap), "broker": (control, bootstrap),
           "passthrough": (control, proxy.bootstrap)}  # fmt: skip
    cpu_of = {"remote": proxy.cpu_seconds, "passthrough": proxy.cpu_seconds}
    if reference is not None:
        via["kroxylicious"] = (control, reference.bootstrap)
        cpu_of["kroxylicious"] = reference.sampler.cpu_seconds
    runs: dict[str, list[dict]] = {side: [] for side in via}
    cpu: dict[str, list[float]] = {side: [] for side in cpu_of}
    store_cpu: list[float] = []
    first_ms: list[float] = []
    # the proxy's counters by side: Fetch asked ahead and native lane runs, by outcome
    counted: dict[str, dict[str, dict[str, float]]] = {side: {} for side in ("remote", "passthrough")}
    for n in range(rounds):
        for side, (topic, server) in via.items():
            before_counts = proxy.outcomes() if side in counted else {}
            before = cpu_of[side]() if side in cpu_of else 0.0
            store_before = _cpu(store)
            r = _read(server, topic, count, config, clients)
            if side in cpu_of:
                cpu[side].append((cpu_of[side]() - before) / (r["bytes"] / 1e9))
            if side in counted:
                for name, totals in proxy.outcomes().items():
                    mine = counted[side].setdefault(name, {})
                    for outcome, total in totals.items():
                        mine[outcome] = mine.get(outcome, 0) + total - before_counts[name].get(outcome, 0)
            if side == "remote":
                store_cpu.append((_cpu(store) - store_before) / (r["bytes"] / 1e9))
                first_ms.append(r["first_record_ms"])
            r.update(side=side, round=n, record_size=record_size, codec=codec,
                     mb_s=round(r["bytes"] / 1e6 / r["seconds"], 1),
                     records_s=round(r["records"] / r["seconds"]))  # fmt: skip
            del r["first_record_ms"]
            runs[side].append(r)
            click.echo(json.dumps(r))
    out: dict = {
        side: {"mb_s": statistics.median(r["mb_s"] for r in rs),
               "records_s": statistics.median(r["records_s"] for r in rs)}
        for side, rs in runs.items()
    }  # fmt: skip
    out["proxy_cpu_s_per_gb"] = round(statistics.median(cpu["remote"]), 2)
    out["passthrough_cpu_s_per_gb"] = round(statistics.median(cpu["passthrough"]), 2)
    if reference is not None:
        out["kroxylicious_cpu_s_per_gb"] = round(statistics.median(cpu["kroxylicious"]), 2)
    out["store_cpu_s_per_gb"] = round(statistics.median(store_cpu), 2)
    out["first_remote_record_ms"] = round(first_ms[0], 1)  # the first round: the partition is cold
    for name in _COUNTED.values():
        out[name] = {side: {k: int(v) for k, v in counts.get(name, {}).items()} for side, counts in counted.items()}
    return out
