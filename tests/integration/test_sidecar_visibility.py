"""What an operator sees: the store-unavailable gauge follows an outage, copy-lag gauges move during a long
tick, every stderr line is JSON (librdkafka's included, repeats bounded), /status is JSON and /metrics
Prometheus, a taken port is a clear error, and secret keys never show."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from deploy import stack as stack_mod
from deploy.procs import free_port
from deploy.stack import Endpoints
from tests.conftest import create_topic
from tests.fault_proxy import TcpProxy
from tests.integration.test_sidecar_policies import SEGMENT, cli, produce, refs, running
from tests.sidecar_harness import settings, wait_for, write_config
from tiering.sidecar.context import SidecarContext
from tiering.sidecar.retry import SIDECAR
from tiering.sidecar.runner import Sidecar
from tiering_core.errors import ConfigError

pytestmark = pytest.mark.integration


def get(port: int, path: str) -> tuple[int, str, str]:
    """(status, content type, body) of GET http://127.0.0.1:<port><path>."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read().decode()


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the sidecar's /metrics, by (name, sorted labels)."""
    status, _, text = get(port, "/metrics")
    assert status == 200
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``python -m tiering ...`` as an operator runs it (this checkout's code first on the path)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]), *sys.path])}
    return subprocess.run([sys.executable, "-m", "tiering", *args], capture_output=True, text=True, timeout=timeout,
                          env=env, stdin=subprocess.DEVNULL)  # fmt: skip


def test_the_store_unavailable_gauge_follows_an_outage_with_nothing_to_copy(stack: Endpoints, tmp_path: Path) -> None:
    topic = create_topic(stack.bootstrap, internal_segment_bytes=SEGMENT)
    produce(stack.bootstrap, topic, 6_000)
    host, port = stack.s3.endpoint_url.removeprefix("http://").split(":")
    proxy = TcpProxy(host, int(port))
    metrics_port = free_port()
    config = write_config(stack, tmp_path, metrics_port=metrics_port, lag_refresh_seconds=0.5)
    config.write_text(config.read_text().replace(stack.s3.endpoint_url, f"http://127.0.0.1:{proxy.port}"))
    cli("topic", "enable", topic, "--config", str(config))
    gauge = ("tiering_remote_store_unavailable", ())
    try:
        with running(config) as (ctx, sidecar):
            topic_id = ctx.cluster.topics([topic])[topic].topic_id

            def all_copied() -> bool:
                task = sidecar.tasks.get((topic_id, 0))
                return task is not None and task.status.copy_lag_segments == 0 and len(refs(ctx, topic, topic_id)) >= 2

            wait_for(all_copied, 120, "every rolled segment to be copied", step=sidecar.tick)
            assert scrape(metrics_port)[gauge] == 0
            proxy.cut()  # a 60 s outage with nothing left to copy used to leave every store metric at 0
            wait_for(lambda: scrape(metrics_port)[gauge] == 1, 60, "the gauge to show the outage", step=sidecar.tick)
            samples = scrape(metrics_port)
            errors = "tiering_remote_store_errors_total"
            assert sum(v for (n, labels), v in samples.items() if n == errors and ("error", "unavailable") in labels)
            proxy.restore()
            wait_for(lambda: scrape(metrics_port)[gauge] == 0, 60, "the gauge to clear", step=sidecar.tick)
    finally:
        proxy.close()


def test_copy_lag_gauges_move_while_a_slow_tick_is_still_uploading(stack: Endpoints, tmp_path: Path) -> None:
    topic = create_topic(stack.bootstrap, internal_segment_bytes=SEGMENT)
    produce(stack.bootstrap, topic, 5_000)
    # ~16 s per 64 KiB segment: the first tick uploads for a minute or more
    config = write_config(stack, tmp_path, upload_bytes_per_second=4096, lag_refresh_seconds=0.5)
    cli("topic", "enable", topic, "--config", str(config))
    ctx = SidecarContext.build(settings(config))
    sidecar = Sidecar(ctx)
    runner = threading.Thread(target=sidecar.run_forever, daemon=True)
    runner.start()
    try:
        topic_id = ctx.cluster.topics([topic])[topic].topic_id
        lag = ctx.metrics.copy_lag_segments.labels(topic=topic, partition="0")
        copied = ctx.metrics.copy_segments.labels(topic=topic, partition="0")
        wait_for(lambda: lag._value.get() > 0, 60, "the first lag reading")
        first = lag._value.get()
        produce(stack.bootstrap, topic, 10_000)  # more rolled segments while the first upload crawls
        wait_for(lambda: lag._value.get() > first, 60, "the lag gauge to count the new segments")
        assert copied._value.get() < first, "the tick that was uploading the old segments has already ended"
        assert (topic_id, 0) in sidecar.tasks
    finally:
        sidecar.stop()
        runner.join(120)


@pytest.mark.slow  # slow: it waits for librdkafka to repeat its connection errors
def test_every_stderr_line_is_json_librdkafka_included_and_its_repeats_are_bounded(
    stack: Endpoints, tmp_path: Path
) -> None:
    with socket.socket() as s:  # nothing listens there: librdkafka fails to connect again and again
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    config = write_config(stack, tmp_path, bootstrap_servers=f"127.0.0.1:{closed}")
    result = run_cli("sidecar", "run", "--config", str(config))
    assert result.returncode == 1
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    docs = []
    for line in lines:
        try:
            docs.append(json.loads(line))
        except ValueError:
            pytest.fail(f"a stderr line is not JSON: {line[:300]}")
    refused = [d for d in docs if d["logger"] == "librdkafka" and "Connection refused" in d["message"]]
    assert refused and all(d["level"] == "error" and d["facility"] == "FAIL" for d in refused)
    assert len(refused) <= 40, f"{len(refused)} librdkafka lines while Kafka was unreachable for ~30 s"
    assert docs[-1]["event"] == "sidecar stopped" and f"127.0.0.1:{closed}" in docs[-1]["error"]
    assert "Traceback" not in result.stderr


def test_an_unknown_wal_lag_is_logged_once_per_backoff_step(
    stack: Endpoints, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Kafka frozen for a while: the WAL lag is unknown on every tick, but its failure is logged (and tried)
    once per backoff step (1 s, 2 s, 4 s ...), not on every tick, and recovers when Kafka answers again."""
    caplog.set_level(logging.INFO)
    config = write_config(
        stack,
        tmp_path,
        remote_log_manager_task_retry_backoff_ms=1000,
        remote_log_manager_task_retry_backoff_max_ms=60_000,
        remote_log_manager_task_retry_jitter=0,
    )
    with running(config) as (ctx, sidecar):
        sidecar.tick()
        assert scrape_gauge(ctx, "tiering_metadata_wal_lag_records"), "the WAL lag is known while Kafka answers"
        ctx.manager.wal.timeout = ctx.cluster.timeout = 1.0  # each request to the frozen broker fails in ~1 s
        stack_mod.pause_broker(stack, 1)
        ticks = 0
        try:
            deadline = time.monotonic() + 12
            while time.monotonic() < deadline:
                sidecar.tick()
                ticks += 1
                time.sleep(0.2)
        finally:
            stack_mod.unpause_broker(stack, 1)
        failed = [r for r in caplog.records if r.levelno >= logging.WARNING and (
                  getattr(r, "fields", {}).get("operation") == "wal_lag" or "WAL lag" in r.getMessage())]  # fmt: skip
        assert 1 <= len(failed) <= 5, f"{len(failed)} lines for one unknown WAL lag in 12 s of {ticks} ticks"
        assert ticks >= 3 * len(failed), f"{ticks} ticks for {len(failed)} attempts: the ticks waited for each"
        assert [r.fields["attempts"] for r in failed] == list(range(1, len(failed) + 1))
        assert "wal_lag" in ctx.retry.failures(SIDECAR)
        wait_for(lambda: "wal_lag" not in ctx.retry.failures(SIDECAR), 90, "the WAL lag to be known again",
                 step=sidecar.tick)  # fmt: skip


def scrape_gauge(ctx: SidecarContext, name: str) -> list[float]:
    """The values of every labelled series of ``name`` in the sidecar's registry."""
    return [s.value for family in ctx.metrics.registry.collect() for s in family.samples if s.name == name]


def test_status_serves_json_and_metrics_serves_prometheus(stack: Endpoints, tmp_path: Path) -> None:
    topic = create_topic(stack.bootstrap, internal_segment_bytes=SEGMENT)
    produce(stack.bootstrap, topic, 4_000)
    metrics_port = free_port()
    config = write_config(stack, tmp_path, metrics_port=metrics_port)
    cli("topic", "enable", topic, "--config", str(config))
    with running(config) as (ctx, sidecar):
        topic_id = ctx.cluster.topics([topic])[topic].topic_id
        wait_for(lambda: bool(refs(ctx, topic, topic_id)), 120, "a copy", step=sidecar.tick)
        status, content_type, body = get(metrics_port, "/status")
        assert status == 200 and content_type == "application/json"
        doc = json.loads(body)
        assert doc["broker_id"] == 1
        row = doc["partitions"][f"{topic_id}/0"]
        assert isinstance(row["copy_lag_segments"], int) and row["last_error"] is None and row["failing"] == {}
        status, content_type, body = get(metrics_port, "/metrics")
        assert status == 200 and content_type.startswith("text/plain")
        assert scrape(metrics_port)[("tiering_remote_copy_segments_total", (("partition", "0"), ("topic", topic)))] >= 1
        assert get(metrics_port, "/nothing-here")[0] == 404


def test_a_busy_metrics_port_is_a_clear_error(stack: Endpoints, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = write_config(stack, tmp_path, metrics_port=port)
        with pytest.raises(ConfigError, match=f"metrics_host:metrics_port 127.0.0.1:{port} is already in use"):
            Sidecar(SidecarContext.build(settings(config))).start()
        result = run_cli("sidecar", "run", "--config", str(config))
    assert result.returncode == 1
    assert f"127.0.0.1:{port} is already in use" in result.stderr and "Traceback" not in result.stderr


def test_secret_keys_never_show_in_errors_repr_or_logs(stack: Endpoints, tmp_path: Path) -> None:
    secret = stack.s3.secret_key
    config = write_config(stack, tmp_path)
    good = settings(config)
    assert secret not in repr(good) and secret not in str(good.model_dump())
    assert good.remote_storage.secret_key() == secret  # still what boto3 gets: the store works
    assert SidecarContext.build(good).store.head("nothing") is None
    doc = yaml.safe_load(config.read_text())
    doc["remote_storage"] = {"kind": "s3", "secret_access_key": secret}  # no bucket: invalid
    doc["remote_storage_typo"] = {"secret_acess_key": secret}
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError) as caught:
        settings(bad)
    message = str(caught.value)
    assert secret not in message
    assert "remote_storage.bucket: Field required" in message and "remote_storage_typo" in message
    result = run_cli("sidecar", "run", "--config", str(bad))
    assert result.returncode == 1 and "remote_storage.bucket" in result.stderr
    assert secret not in result.stderr + result.stdout


def test_sigterm_leaves_only_json_on_stderr(stack: Endpoints, tmp_path: Path) -> None:
    """A normal run, stopped by SIGTERM: every line JSON, nothing secret."""
    config = write_config(stack, tmp_path, metrics_port=free_port())
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]), *sys.path])}
    proc = subprocess.Popen([sys.executable, "-m", "tiering", "sidecar", "run", "--config", str(config)],
                            stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)  # fmt: skip
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)  # type: ignore[arg-type]
    reader.start()
    try:
        wait_for(lambda: any('"sidecar started"' in line for line in lines), 90, "the sidecar to start")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(90)
        reader.join(10)
    assert proc.returncode == 0
    for line in lines:
        json.loads(line)
    assert stack.s3.secret_key not in "".join(lines)
