"""The quickstart demo and the decode benchmark run end to end on the real stack."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from click.testing import CliRunner

from deploy.stack import Endpoints
from tiering.cli.main import main

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def run_tiering(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """``python -m tiering ...`` in a process of its own, stdout and stderr in one stream as a terminal shows
    them: Spark's JVM writes to the process's file descriptors, which an in-process runner does not capture."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]), *sys.path])}
    return subprocess.run([sys.executable, "-m", "tiering", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL)  # fmt: skip


def test_demo_shows_rolled_segments_and_records(stack: Endpoints) -> None:
    """The whole story, and nothing else on the terminal: the Kafka clients' and Spark's log lines are in
    the demo's log file; the last lines say how to stop the stack it leaves running."""
    result = run_tiering("demo", "--stack-dir", stack.stack_dir, "--mb", "3", timeout=840)
    assert result.returncode == 0, result.stdout
    noise = [line for line in result.stdout.splitlines() if re.search(r"WARN|log4j|librdkafka|SLF4J|jdk\.", line)]
    assert noise == [], noise
    log = (Path(stack.stack_dir) / "demo.log").read_text()
    assert "log4j" in log  # Spark's lines went there
    ending = " ".join(result.stdout.split("the stack keeps running")[1].split())
    assert f"stop them with: tiering dev down --dir {stack.stack_dir}" in ending
    assert f"log lines are in {Path(stack.stack_dir) / 'demo.log'}" in ending
    assert "rolled" in result.stdout and "active" in result.stdout
    assert "first records decoded from 00000000000000000000.log" in result.stdout
    assert "enabled tiering for demo-orders-" in result.stdout
    after = result.stdout.split("5. the broker's segments after local retention")[1]
    status = after.split("6. tiering status")[1]
    assert "enabled" in status and "last error" in status
    read_back = " ".join(status.split("7. read it back from offset 0")[1].split())  # rich wraps lines
    assert "remote (S3)" in read_back and "broker" in read_back
    assert "records read back identical to what was produced, in order, no gap or duplicate" in read_back
    assert "the remote part ends at" in read_back and "the broker's begins at" in read_back
    exported, proxied = result.stdout.split("8. export the tiered segments to Parquet")[1].split("9. any Kafka client")
    exported = " ".join(exported.split())
    assert re.search(r"exported [\d,]+ records \(partition 0: offsets 0-\d+\)", exported)
    assert "first rows of the Parquet output" in exported and "source=demo" in exported
    proxied = " ".join(proxied.split())
    assert "records from offset 0, identical to what was produced" in proxied
    fetches = re.search(r"the proxy answered (\d+) partition fetches from S3", proxied)
    assert fetches and int(fetches.group(1)) > 0, proxied


def test_bench_decode_prints_a_json_summary_last(stack: Endpoints) -> None:
    result = CliRunner().invoke(
        main,
        ["bench", "decode", "--stack-dir", stack.stack_dir, "--mb", "8", "--runs", "1"],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.output.strip().splitlines()]
    summary = lines[-1]
    assert set(summary) >= {"ratio", "scan_mb_s", "decode_mb_s", "decode_records_s"}
    produced = lines[0]
    assert produced["records"] == summary["records"] > 0


def test_bench_catchup_prints_both_sides_and_a_json_summary_last(stack: Endpoints) -> None:
    result = CliRunner().invoke(
        main, ["bench", "catchup", "--stack-dir", stack.stack_dir, "--size-mb", "16"], catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.output.strip().splitlines() if line.startswith("{")]
    summary = lines[-1]
    assert set(summary) >= {"ratio", "first_record_ms", "peak_rss_mb"}
    sides = [(r["side"], r["record_size"]) for r in lines[:-1]]
    assert sides == [("broker", 100), ("ours", 100), ("broker", 1024), ("ours", 1024)]
    for r in lines[:-1]:
        assert r["bytes"] == r["records"] * r["record_size"] and r["mb_s"] > 0


def test_bench_http_prints_each_side_and_a_json_summary_last(stack: Endpoints) -> None:
    result = CliRunner().invoke(
        main, ["bench", "http", "--stack-dir", stack.stack_dir, "--size-mb", "16"], catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.output.strip().splitlines() if line.startswith("{")]
    summary = lines[-1]
    assert set(summary) >= {"ratio", "json_ratio", "transfer_mb_s", "first_record_ms", "peak_rss_mb"}
    raw, js, broker = lines[:-1]
    assert (raw["side"], js["side"], broker["side"]) == ("http-raw", "http-json", "broker")
    assert raw["records"] == js["records"] == summary["records"] > 0 and broker["records"] >= raw["records"]
    assert raw["bytes"] == js["bytes"] == raw["records"] * 1024


def test_bench_export_prints_both_sides_and_a_json_summary_last(stack: Endpoints) -> None:
    result = CliRunner().invoke(
        main,
        ["bench", "export", "--stack-dir", stack.stack_dir, "--size-mb", "24", "--segment-mb", "1"],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.strip().splitlines()]  # stdout: JSON only
    sides = {line["side"]: line for line in lines[:-1]}
    assert set(sides) == {"ours", "spark-kafka", "python-source"}
    assert sides["ours"]["rows"] == sides["spark-kafka"]["rows"] == sides["python-source"]["rows"] > 0
    assert sides["ours"]["record_bytes"] == sides["spark-kafka"]["record_bytes"]
    summary = lines[-1]
    assert set(summary) >= {"ratio", "ours_rows_per_s", "ours_mb_s", "spark_kafka_rows_per_s", "spark_kafka_mb_s",
                            "source_ratio", "ours_source_rows_per_s", "spark_kafka_source_rows_per_s",
                            "python_source_rows_per_s", "python_source_ratio"}  # fmt: skip
    assert summary["reader"] == "jvm", "the export's JVM reader was not built"
    assert summary["ratio"] == round(summary["ours_rows_per_s"] / summary["spark_kafka_rows_per_s"], 3)
    rates = (summary["ours_source_rows_per_s"], summary["spark_kafka_source_rows_per_s"])
    assert summary["source_ratio"] == round(rates[0] / rates[1], 3)
    assert summary["python_source_ratio"] == round(summary["python_source_rows_per_s"] / rates[1], 3)
    assert all(side["source_rows_per_s"] > 0 and len(side["source_all_seconds"]) == 2 for side in sides.values())


def test_bench_proxy_prints_every_side_and_a_json_summary_last(stack: Endpoints) -> None:
    result = CliRunner().invoke(
        main, ["bench", "proxy", "--stack-dir", stack.stack_dir, "--size-mb", "16", "--rounds", "1"],
        catch_exceptions=False,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.output.strip().splitlines() if line.startswith("{")]
    summary = lines[-1]
    assert set(summary) >= {"ratio", "passthrough_ratio", "remote_mb_s", "broker_mb_s", "passthrough_mb_s",
                            "proxy_cpu_s_per_gb", "passthrough_cpu_s_per_gb", "first_remote_record_ms",
                            "proxy_peak_rss_mb", "kroxylicious_mb_s", "kroxylicious_passthrough_ratio",
                            "passthrough_vs_kroxylicious", "kroxylicious_cpu_s_per_gb",
                            "kroxylicious_peak_rss_mb", "fetch_ahead", "native_lane"}  # fmt: skip
    assert all(v > 0 for v in summary["first_remote_record_ms"].values())
    for counted in ("fetch_ahead", "native_lane"):  # per record size and side, counts by outcome
        assert set(summary[counted]) == {"100", "1024"}
        assert all(set(by_side) == {"remote", "passthrough"} for by_side in summary[counted].values())
        assert all(isinstance(n, int) and n >= 0 for by_side in summary[counted].values()
                   for outcomes in by_side.values() for n in outcomes.values())  # fmt: skip
    ours_vs_theirs = {n: summary["passthrough_mb_s"][n] / summary["kroxylicious_mb_s"][n] for n in ("100", "1024")}
    assert summary["passthrough_vs_kroxylicious"] == round(min(ours_vs_theirs.values()), 3)
    assert summary["passthrough_vs_kroxylicious_by_record_size"] == {n: round(v, 3) for n, v in ours_vs_theirs.items()}
    assert all(v > 0 for v in summary["kroxylicious_cpu_s_per_gb"].values()) and summary["kroxylicious_peak_rss_mb"] > 0
    sides = [(r["side"], r["record_size"]) for r in lines[:-1]]
    assert sides == [(s, n) for n in (100, 1024) for s in ("remote", "broker", "passthrough", "kroxylicious")]
    for r in lines[:-1]:
        assert r["bytes"] == r["records"] * r["record_size"] and r["mb_s"] > 0


def test_bench_proxy_with_client_cpus_splits_clients_from_servers_and_leaves_the_stack_on_every_cpu(
    stack: Endpoints,
) -> None:
    every = os.sched_getaffinity(0)
    assert len(every) >= 2, f"splitting clients from servers needs two CPUs, this process has {sorted(every)}"
    client = min(every)
    result = CliRunner().invoke(
        main, ["bench", "proxy", "--stack-dir", stack.stack_dir, "--size-mb", "16", "--rounds", "1",
               "--no-reference-proxy", "--client-cpus", str(client)], catch_exceptions=False,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output.strip().splitlines()[-1])
    assert (summary["client_cpus"], summary["server_cpus"]) == ([client], sorted(every - {client}))
    assert summary["remote_mb_s"]["1024"] > 0 and summary["passthrough_mb_s"]["1024"] > 0
    for pid in (stack.brokers[0].pid, stack.s3.pid, stack.etcd.pid):
        assert pid is not None
        assert all(os.sched_getaffinity(t.id) == every for t in psutil.Process(pid).threads()), pid


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_bench_killed_by_a_signal_stops_the_stack_it_started(sig: signal.Signals, tmp_path: Path) -> None:
    """A bench on its own temporary stack, signalled once the stack is up (its endpoints.json written): it
    exits 128 + the signal's number, and Kafka, MinIO and etcd are gone with it."""
    env = {**os.environ, "TMPDIR": str(tmp_path),
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]), *sys.path])}  # fmt: skip
    bench = subprocess.Popen([sys.executable, "-m", "tiering", "bench", "decode", "--mb", "256", "--runs", "5"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while not (found := list(tmp_path.glob("tiering-bench-*/endpoints.json"))):
            assert bench.poll() is None, bench.communicate()[0]
            assert time.monotonic() < deadline, "the bench's stack did not come up"
            time.sleep(0.2)
        endpoints = Endpoints.load(found[0])
        servers = [b.pid for b in endpoints.brokers] + [endpoints.s3.pid, endpoints.etcd.pid]
        assert all(pid is not None and psutil.pid_exists(pid) for pid in servers), servers
        bench.send_signal(sig)
        output = bench.communicate(timeout=120)[0]
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
    assert bench.returncode == 128 + sig, output
    assert [pid for pid in servers if _running(pid)] == [], output
    assert not found[0].parent.exists()  # the temporary directory went too


def _running(pid: int | None) -> bool:
    try:
        return pid is not None and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
