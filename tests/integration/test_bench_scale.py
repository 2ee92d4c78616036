"""``tiering bench scale`` runs end to end on the real stack with a few partitions (its smoke test)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from deploy.stack import Endpoints
from tiering.cli.main import main

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SUMMARY = {"partitions", "idle_tick_s", "busy_tick_s", "idle_cpu_pct", "peak_rss_mb", "idle_requests_per_partition",
           "wal_lag_s", "status_s"}  # fmt: skip


def test_bench_scale_prints_its_phases_and_a_json_summary_last(stack: Endpoints) -> None:
    args = ["bench", "scale", "--stack-dir", stack.stack_dir, "--partitions", "4", "--segments", "1",
            "--idle-ticks", "2", "--rescan-seconds", "2"]  # fmt: skip
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.output.strip().splitlines() if line.startswith("{")]
    summary = lines[-1]
    assert summary.keys() >= SUMMARY
    assert summary["partitions"] == 4
    phases = {line["phase"]: line for line in lines[:-1]}
    assert list(phases) == ["setup", "first_tick", "busy", "idle"]
    assert phases["first_tick"]["segments_copied"] >= 4 and phases["busy"]["segments_copied"] >= 4
    assert phases["busy"]["s3_by_operation"]["put"] >= 4 * 3  # each copy: .log, .indexes, manifest
    idle = phases["idle"]
    assert idle["ticks"] == 2
    # an idle tick lists no partition's objects (one listing of the bucket's incomplete uploads by the janitor,
    # a HEAD now and then from the store probe) and asks Kafka nothing per partition (DeleteRecords)
    assert idle["s3_requests_per_tick"] < 4 and "DeleteRecords" not in idle["kafka_by_api"]
    requests = summary["idle_requests_per_partition"]
    assert set(requests) == {"kafka", "s3", "total"}
    assert requests["kafka"] > 0  # every tick asks Kafka who leads what
    for side in ("kafka", "s3"):  # the summary is the idle phase's requests per tick, per partition
        assert requests[side] == pytest.approx(summary["idle_requests_per_tick"][side] / 4, abs=1e-3)
    assert summary["idle_requests_per_tick"]["s3"] == pytest.approx(idle["s3_requests_per_tick"], abs=0.01)
    assert requests["total"] == pytest.approx(requests["kafka"] + requests["s3"], abs=1e-3)
    for key in ("idle_tick_s", "busy_tick_s", "peak_rss_mb", "status_s"):
        assert summary[key] > 0, key
    assert 0 <= summary["idle_cpu_pct"] <= 200 and summary["wal_lag_s"] >= 0
